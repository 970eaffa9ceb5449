"""Kafka consumer: a confluent-kafka consumer group whose offsets follow the inbox commits.

The group id is the consumer name. Offsets are committed by hand (``enable.auto.commit`` off),
synchronously and only after the inbox transaction of every record of the batch committed: a
crash before that makes the group deliver those records again (to this or another member), and
the inbox turns the ones already handled into duplicates. The next batch is fetched while the
inbox stores the previous one (``inbox.consumer.Deliveries``: two batches in flight, offsets
committed in order). librdkafka's ``consume`` blocks, so
every call on the client runs in one dedicated worker thread (the client is not meant to be used
from two threads at once); the event loop is never blocked.

Records are decoded from the publisher's wire format (CloudEvents binary headers, see
:mod:`.publisher`) by :func:`.wire.decode`.

URL: the publisher's ``kafka://`` URL (brokers, SASL, TLS, ``client_id``) plus these consumer
options, all optional:

=========================  ==========  =================================================
option                     default     meaning
=========================  ==========  =================================================
``session_timeout_ms``     ``6000``    a member that stops heartbeating leaves the group
                                       after this long and its partitions move on
``heartbeat_interval_ms``  ``500``     heartbeat period (well under the session timeout)
``max_poll_interval_ms``   ``300000``  longest time one batch may take before the member
                                       is considered stuck and its partitions move on
``auto_offset_reset``      ``earliest``  where a new group starts: ``earliest`` (nothing
                                       published before the first start is missed) or
                                       ``latest``
=========================  ==========  =================================================

The short session timeout makes a crashed member's partitions move on within seconds (it is
also what Tansu, the Kafka-protocol broker the tests use, needs for a quick first join); it is
within Kafka's default ``group.min.session.timeout.ms`` (6 s).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from outboxer.brokers.kafka._client_log import client_log as quiet_client_log
from outboxer.brokers.kafka.settings import KafkaConsumerSettings
from outboxer.brokers.kafka.wire import decode
from outboxer.errors import ConfigurationError
from outboxer.inbox.consumer import Deliver, Deliveries, opened
from outboxer.message import Message

__all__ = ["KafkaConsumer"]

log = logging.getLogger("outboxer.consumer.kafka")
client_log = quiet_client_log("outboxer.consumer.kafka.librdkafka")

T = TypeVar("T")

# librdkafka's local error codes start with "_" (getattr: no private-member access).
_PARTITION_EOF: int = getattr(KafkaError, "_PARTITION_EOF")  # noqa: B009
_MISSING_TOPIC = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, getattr(KafkaError, "_UNKNOWN_TOPIC")}  # noqa: B009
)
#: How long one ``consume`` call may block: the longest delay before a stop is noticed.
_POLL_SECONDS = 0.5
#: One broker cannot be reached: librdkafka reports every failed reconnect (many a second).
_CONNECTION_ERRORS = frozenset(
    getattr(KafkaError, name) for name in ("_TRANSPORT", "_RESOLVE", "_SSL", "_AUTHENTICATION")
)
_ALL_BROKERS_DOWN: int = getattr(KafkaError, "_ALL_BROKERS_DOWN")  # noqa: B009
#: Seconds without "all brokers down" after which the next one starts a new outage.
_OUTAGE_QUIET_SECONDS = 30.0


class KafkaConsumer:
    """Reads a consumer group's records in batches and commits their offsets after delivery.

    ``async with`` creates the client and subscribes (joining the group happens in the
    background); leaving closes the client, which leaves the group at once so the partitions
    move to the other members without waiting for the session timeout.
    """

    def __init__(self, settings: KafkaConsumerSettings) -> None:
        self.settings = settings
        self._client: Consumer | None = None
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._missing_topics: set[str] = set()
        #: When the current outage began and last reported itself ("all brokers down").
        self._unreachable_since: float | None = None
        self._unreachable_last = 0.0
        self._last_error: str | None = None

    def __repr__(self) -> str:
        return (
            f"KafkaConsumer({self.settings.connection.safe_url()}, group={self.settings.group!r})"
        )

    async def _call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        assert self._thread is not None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._thread, functools.partial(function, *args, **kwargs)
        )

    async def __aenter__(self) -> KafkaConsumer:
        config = self.settings.consumer_config()
        config["error_cb"] = self._on_error
        config["logger"] = client_log
        try:
            client = Consumer(config)
        except (KafkaException, ValueError, TypeError) as exc:
            raise ConfigurationError(f"kafka consumer settings refused: {exc}") from None
        self._client = client
        self._thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="outboxer-kafka-consumer"
        )
        try:
            await self._call(
                client.subscribe,
                list(self.settings.topics),
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
            )
        except KafkaException as exc:  # e.g. a '^' pattern librdkafka cannot compile
            await self.__aexit__(None, None, None)
            error = exc.args[0] if exc.args else exc
            reason = error.str() if isinstance(error, KafkaError) else str(error)
            raise ConfigurationError(
                f"kafka consumer cannot subscribe to {', '.join(map(repr, self.settings.topics))}"
                f" (a topic starting with ^ is a regular expression): {reason}"
            ) from None
        log.info(
            "consumer group %r subscribed to %s on %s",
            self.settings.group,
            ", ".join(self.settings.topics),
            self.settings.connection.safe_url(),
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await self._call(client.close)  # leaves the group: a quick rebalance
            except (KafkaException, RuntimeError) as exc:
                log.warning("closing the Kafka consumer failed: %s", exc)
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None

    # -- librdkafka callbacks (worker thread) ---------------------------------------------------

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            log.error("Kafka consumer failed for good: %s", error)
        elif error.code() in _CONNECTION_ERRORS:
            # librdkafka reports every failed reconnect, many a second while a broker is down;
            # it fails over to the other brokers by itself: the detail is for the outage line.
            self._last_error = error.str()
            log.debug("Kafka consumer: %s", error)
        elif error.code() == _ALL_BROKERS_DOWN:
            # Once when the outage begins (and once when it ends, see _reachable); librdkafka
            # repeats it every few seconds meanwhile.
            now = time.monotonic()
            if (
                self._unreachable_since is None
                or now - self._unreachable_last > _OUTAGE_QUIET_SECONDS
            ):
                self._unreachable_since = now
                log.warning(
                    "no Kafka broker reachable at %s (%s): the consumer keeps trying",
                    self.settings.connection.safe_url(),
                    self._last_error or error.str(),
                )
            else:
                log.debug("Kafka consumer: %s", error)
            self._unreachable_last = now
        else:
            log.warning("Kafka consumer: %s", error)

    def _reachable(self) -> None:
        """The brokers answered (an assignment, records): the outage, if any, ended."""
        since, self._unreachable_since = self._unreachable_since, None
        if since is not None:
            log.warning(
                "Kafka at %s reachable again after %.0f s",
                self.settings.connection.safe_url(),
                time.monotonic() - since,
            )

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._reachable()
        log.info("assigned %s", ", ".join(f"{p.topic}[{p.partition}]" for p in partitions))

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        # A batch may be in the inbox meanwhile: its offsets commit fails then, the new owner
        # reads it again and the inbox drops what was handled here (see _commit).
        log.info("revoked %s", ", ".join(f"{p.topic}[{p.partition}]" for p in partitions))

    # -- the loop ---------------------------------------------------------------------------

    async def run(self, deliver: Deliver, stop: asyncio.Event) -> None:
        client = opened(self._client, self)
        async with Deliveries(deliver) as deliveries:
            await self._consume(client, deliveries, stop)

    async def _consume(self, client: Consumer, deliveries: Deliveries, stop: asyncio.Event) -> None:
        while not stop.is_set():
            records = await self._call(_fetch, client, self.settings.batch_size)
            messages: list[Message] = []
            offsets: dict[tuple[str, int], int] = {}
            for record in records:
                error = record.error()
                if error is not None:
                    self._report(error, record.topic())
                    continue
                topic, partition, offset = record.topic(), record.partition(), record.offset()
                if topic is None or partition is None or offset is None:
                    continue
                messages.append(
                    decode(
                        topic=topic,
                        partition=partition,
                        offset=offset,
                        key=record.key(),
                        value=record.value(),
                        headers=_header_list(record.headers()),
                        timestamp_ms=record.timestamp()[1],
                    )
                )
                offsets[(topic, partition)] = max(offset, offsets.get((topic, partition), -1))
            if not messages:
                continue
            self._reachable()
            commit = functools.partial(self._commit, client, offsets)
            if not await deliveries.submit(messages, commit):
                return  # not committed: the group delivers the batch again

    async def _commit(self, client: Consumer, offsets: dict[tuple[str, int], int]) -> None:
        # The committed offset is the next record to read: last handled + 1.
        positions = [TopicPartition(t, p, o + 1) for (t, p), o in offsets.items()]
        try:
            await self._call(client.commit, offsets=positions, asynchronous=False)
        except KafkaException as exc:
            # A rebalance took the partitions away meanwhile: their new owner reads the batch
            # again and the inbox drops what was handled here.
            log.warning("offsets not committed (%s): the records will be delivered again", exc)

    def _report(self, error: KafkaError, topic: str | None) -> None:
        if error.code() == _PARTITION_EOF:
            return
        if error.code() in _MISSING_TOPIC:
            if topic not in self._missing_topics:
                self._missing_topics.add(topic or "")
                log.warning("Kafka topic %r does not exist (yet): %s", topic, error.str())
            return
        log.warning("Kafka consumer error on %r: %s", topic, error)


def _fetch(client: Consumer, batch_size: int) -> list[Any]:
    """Up to ``batch_size`` records: wait (at most ``_POLL_SECONDS``) for the first one only,
    then take what librdkafka has already fetched. ``consume(batch_size, timeout)`` would wait
    for a full batch or the whole timeout: at 1,000 msg/s and batches of 100 that put 180 ms
    between publish and delivery (p50, ``benchmarks/kafka_batch_latency.py``)."""
    records = client.consume(1, _POLL_SECONDS)
    if records and batch_size > 1:
        records += client.consume(batch_size - 1, 0)
    return records


def _header_list(
    headers: dict[str, str | bytes | None] | list[tuple[str, str | bytes | None]] | None,
) -> list[tuple[str, str | bytes | None]]:
    if headers is None:
        return []
    return list(headers.items()) if isinstance(headers, dict) else headers
