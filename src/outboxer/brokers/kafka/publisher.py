"""Kafka publisher: confluent-kafka (librdkafka) idempotent producer, ``acks=all``, pipelined.

Every message becomes one Kafka record. A ``publish`` call hands the whole batch to librdkafka in
one go (``produce`` only queues; librdkafka batches records per partition and keeps up to five
requests in flight per broker) and then awaits the batch as a whole: one delivery report per
record, served by a poll thread, and one wake-up of the event loop when the last report is in.
A record counts as acknowledged only when its delivery report says the partition leader and all
in-sync replicas have it (``acks=all``). The idempotent producer keeps the write order of a
partition across its internal retries, and records with the same key go to the same partition,
so messages of one key keep their write order.

Wire format (CloudEvents 1.0, Kafka protocol binding, binary content mode)::

    topic = message topic            key = message key (UTF-8; no key: null, random partition)
    value = payload bytes, unchanged

=================  ====================================================================
Kafka header       value
=================  ====================================================================
``ce_id``          the outbox message id (UUIDv7 string): consumers deduplicate on it
``ce_type``        the event type; **omitted** when the message has no type
``ce_source``      ``source`` setting (default ``outboxer``)
``ce_specversion`` ``1.0``
``ce_time``        ``created_at``, RFC 3339 in UTC, e.g. ``2025-01-31T12:00:00.123456Z``
``content-type``   MIME type of the payload, e.g. ``application/json``
user headers       every message header as it is (UTF-8), after the ones above; a user
                   header named like one of the six above is not sent (the outbox's value
                   wins, so ``ce_id`` is always the message id)
=================  ====================================================================

Partitioning is ``murmur2_random``: the same partition for a key as the Java client's default
partitioner, so outboxer and JVM producers writing to one topic agree on where a key lives.
The Kafka record timestamp is the send time (the creation time is in ``ce_time``), so a backlog
published late is not refused by a broker's ``message.timestamp.difference.max.ms``.

URL::

    kafka://[user:password@]host[:port][,host[:port]...][?option=value&...]

options (all optional): ``source``, ``client_id``, ``auto_create_topics`` (``false``),
``linger_ms`` (``0``), ``delivery_timeout`` (seconds, ``10``), ``missing_topic_timeout``
(seconds, ``5``), ``compression`` (``none``, ``gzip``, ``snappy``, ``lz4``, ``zstd``),
``security_protocol`` (``plaintext``, ``ssl``, ``sasl_plaintext``, ``sasl_ssl``),
``sasl_mechanism`` (``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512``), ``ssl_ca_location``.
User and password in the URL are the SASL credentials. Any other librdkafka property can be set
with :attr:`KafkaSettings.extra` (not from the URL).

Topics are never created by the publisher unless ``auto_create_topics=true`` (and the broker
allows it): a typo in a topic name dead-letters the message instead of silently creating a
topic nobody reads.

Error classification (librdkafka error codes, from delivery reports or from ``produce``):

======================================================================  ========================
failure                                                                 result
======================================================================  ========================
all brokers down (``_ALL_BROKERS_DOWN``; the queued records are         ``BrokerUnavailable``
purged at once instead of waiting for the timeout: ``_PURGE_QUEUE``)    (producer replaced)
no acknowledgement within ``delivery_timeout`` (``_MSG_TIMED_OUT``)     ``BrokerUnavailable``
                                                                        (producer replaced)
fatal producer error (``error.fatal()``, e.g. ``PRODUCER_FENCED``,      ``BrokerUnavailable``
``_FATAL``)                                                             (producer replaced)
``_TRANSPORT``, ``_RESOLVE``, ``_SSL``, ``_AUTHENTICATION``,            ``BrokerUnavailable``
``SASL_AUTHENTICATION_FAILED``, ``CLUSTER_AUTHORIZATION_FAILED``,
``NOT_ENOUGH_REPLICAS[_AFTER_APPEND]``, ``LEADER_NOT_AVAILABLE``,
``NOT_LEADER_FOR_PARTITION``, ``BROKER_NOT_AVAILABLE``,
``REQUEST_TIMED_OUT``, ``NETWORK_EXCEPTION``, ``KAFKA_STORAGE_ERROR``,
a producer queue that stays full for ``delivery_timeout``
topic does not exist: ``UNKNOWN_TOPIC_OR_PART`` after the metadata      ``PermanentPublishError``
lacked it for ``missing_topic_timeout``, ``_UNKNOWN_TOPIC``,            (text names the topic)
``_UNKNOWN_PARTITION``; invalid topic name (``TOPIC_EXCEPTION``)
a topic name Kafka cannot have (``a-z A-Z 0-9 . _ -``, 1 to 249, not   ``PermanentPublishError``
``.``/``..``): refused before ``produce``, the text says so
record too large (``MSG_SIZE_TOO_LARGE``, ``RECORD_LIST_TOO_LARGE``),   ``PermanentPublishError``
``INVALID_RECORD``, ``TOPIC_AUTHORIZATION_FAILED``,
``POLICY_VIOLATION``, ``UNSUPPORTED_FOR_MESSAGE_FORMAT``, a key or
header ``produce`` cannot encode
any other error (e.g. ``INVALID_MSG``: a CRC mismatch, ``UNKNOWN``)    ``RetryablePublishError``
======================================================================  ========================

Recovery: a producer that reported a broker-wide failure (all brokers down, a delivery timeout,
a fatal error) is never used for a new call again. The next ``publish`` creates a fresh producer
(one connection attempt per call; the relay paces the calls with its backoff) while the old one
finishes its outstanding records in its own thread and is closed. A fresh producer also gets a
new idempotent producer id, which is what a broker that fenced the old one (``PRODUCER_FENCED``,
as Tansu does after an outage) requires. Acquiring that id takes librdkafka about 0.5 s, so the
first call after a replacement is that much slower. Records whose fate is unknown when the
connection drops (in flight, no response) are reported as ``BrokerUnavailable`` and published
again later: at-least-once, consumers drop the duplicate by ``ce_id``.

The SASL password never appears in ``repr``, log lines or error messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from outboxer.brokers.kafka._client_log import client_log as quiet_client_log
from outboxer.brokers.kafka.settings import KafkaSettings, invalid_topic_name
from outboxer.brokers.kafka.wire import header_encoder
from outboxer.errors import (
    BrokerUnavailable,
    ConfigurationError,
    PermanentPublishError,
    PublishError,
    RetryablePublishError,
)
from outboxer.message import Message

#: Seconds ``__aenter__`` waits for a broker to answer (the relay's start is not held longer).
_WARM_UP_TIMEOUT = 5.0

__all__ = ["KafkaPublisher"]

log = logging.getLogger(__name__)
#: librdkafka's own log lines are routed here rather than to stderr (reconnect noise at DEBUG).
client_log = quiet_client_log(f"{__name__}.librdkafka")

DEFAULT_PORT = 9092


def _codes(*names: str) -> frozenset[int]:
    # getattr: a name missing from an older or newer librdkafka is skipped, not an import error.
    return frozenset(getattr(KafkaError, name) for name in names if hasattr(KafkaError, name))


def _code(name: str) -> int:
    code: int = getattr(KafkaError, name)  # librdkafka's local codes start with "_"
    return code


_ALL_BROKERS_DOWN = _code("_ALL_BROKERS_DOWN")
_MSG_TIMED_OUT = _code("_MSG_TIMED_OUT")
_CONNECTION_ERRORS = _codes("_TRANSPORT", "_RESOLVE", "_SSL", "_AUTHENTICATION")


#: The broker or the path to it is down: no attempt is counted, the relay backs off.
_BROKER_DOWN = _codes(
    "_MSG_TIMED_OUT",
    "_TIMED_OUT",
    "_TIMED_OUT_QUEUE",
    "_TRANSPORT",
    "_ALL_BROKERS_DOWN",
    "_RESOLVE",
    "_SSL",
    "_AUTHENTICATION",
    "_PURGE_QUEUE",
    "_PURGE_INFLIGHT",
    "_DESTROY",
    "_FATAL",
    "_FENCED",
    "_QUEUE_FULL",
    "PRODUCER_FENCED",
    "SASL_AUTHENTICATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "LEADER_NOT_AVAILABLE",
    "NOT_LEADER_FOR_PARTITION",
    "NOT_LEADER_OR_FOLLOWER",
    "BROKER_NOT_AVAILABLE",
    "REQUEST_TIMED_OUT",
    "NETWORK_EXCEPTION",
    "KAFKA_STORAGE_ERROR",
)
#: The topic does not exist (librdkafka reports it only after ``missing_topic_timeout``).
_MISSING_TOPIC = _codes(
    "UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION", "TOPIC_EXCEPTION"
)
#: This record can never be written, whatever the broker's state.
_PERMANENT = _codes(
    "MSG_SIZE_TOO_LARGE",
    "RECORD_LIST_TOO_LARGE",
    "INVALID_RECORD",
    "TOPIC_AUTHORIZATION_FAILED",
    "POLICY_VIOLATION",
    "UNSUPPORTED_FOR_MESSAGE_FORMAT",
    "_INVALID_ARG",
    "_MSG_SIZE_TOO_LARGE",
)
#: Broker-wide failures after which the producer is replaced before the next call.
_BREAKS_PRODUCER = _codes(
    "_MSG_TIMED_OUT", "_ALL_BROKERS_DOWN", "_FATAL", "_FENCED", "PRODUCER_FENCED", "_DESTROY"
)
_PURGED = _codes("_PURGE_QUEUE", "_PURGE_INFLIGHT")


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # the awaiting publish() may have been cancelled
        future.set_result(None)


class _Producer:
    """One librdkafka producer and the thread that serves its delivery reports.

    librdkafka calls delivery and error callbacks only from ``poll``/``flush``; a dedicated
    thread blocks in ``poll`` so the event loop never does. Once :meth:`retire` is called the
    producer takes no new calls; its thread waits for the calls still producing, flushes what is
    outstanding (bounded by the delivery timeout), fails anything left and closes the producer.
    """

    def __init__(self, settings: KafkaSettings, number: int) -> None:
        self.settings = settings
        #: Why this producer must not be used for new calls; set from the poll thread.
        self.broken: str | None = None
        #: The last connection error librdkafka reported, for readable BrokerUnavailable texts.
        self.last_error: str | None = None
        #: ``publish`` calls still producing into this producer (touched by the loop thread).
        self.active_calls = 0
        #: Sticky: queued records can never be sent (all brokers down, fatal error); they are
        #: purged, i.e. reported as BrokerUnavailable, instead of waiting for the timeout.
        self.down = False
        #: Topics a record failed for as missing. librdkafka then remembers them as absent until
        #: its next periodic metadata refresh (minutes), so a topic created afterwards (the fix
        #: before a dead letter is replayed) would still fail at once: the next call that
        #: writes to one asks for its metadata first. Added from the poll thread.
        self.missing_topics: set[str] = set()
        self._retired = threading.Event()
        config = settings.producer_config()
        config["error_cb"] = self._on_error
        config["logger"] = client_log
        try:
            self.client = Producer(config)
        except (KafkaException, ValueError, TypeError) as exc:
            raise ConfigurationError(f"kafka settings refused by librdkafka: {exc}") from None
        self._thread = threading.Thread(
            target=self._serve, name=f"outboxer-kafka-{number}", daemon=True
        )
        self._thread.start()

    def warm_up(self, timeout: float) -> None:
        """Connect to a broker now, so that librdkafka has its idempotent producer id (PID)
        before the first batch.

        librdkafka asks for a PID from a timer that fires every 500 ms, and only over a broker
        connection that is already up; with sparse connections (its default) nothing connects
        until a request needs it. Left alone, the first batch waited for two or three ticks
        (about 0.5-1 s, measured against Tansu). A metadata request for all topics (never a
        named topic, which a broker may auto-create) brings a connection up, and librdkafka
        requests the PID as soon as a broker *node* is up. The first answer may come over the
        bootstrap address (``orig_broker_id`` -1), which does not count: the request is repeated
        until a node answered. Brokers that do not answer within ``timeout``, or that librdkafka
        reports all down, are no error here: the first publish reports the outage as usual.
        """
        deadline = time.monotonic() + timeout
        while self.broken is None and (left := deadline - time.monotonic()) > 0:
            try:
                metadata = self.client.list_topics(timeout=min(left, 0.5))
            except KafkaException as exc:
                log.debug("Kafka warm-up found no broker yet: %s", exc)
                continue
            if metadata.orig_broker_id >= 0:
                return

    # -- poll thread ------------------------------------------------------------------------

    def _on_error(self, error: KafkaError) -> None:
        code = error.code()
        if code in _CONNECTION_ERRORS:
            self.last_error = error.str()
        if error.fatal():
            self.mark_broken(f"fatal producer error {error.name()}: {error.str()}", down=True)
            log.error("Kafka producer failed for good (%s); a fresh one will be used", error)
        elif code == _ALL_BROKERS_DOWN:
            reason = (
                f"no Kafka broker reachable at {self.settings.safe_url()} "
                f"({self.last_error or error.str()})"
            )
            if self.broken is None:
                # The relay logs the outage once (the reason travels in BrokerUnavailable).
                log.debug("%s", reason)
            # Queued records cannot be sent: fail them now rather than after delivery_timeout.
            self.mark_broken(reason, down=True)
        else:
            log.debug("Kafka client error: %s", error)

    def mark_broken(self, reason: str, *, down: bool = False) -> None:
        """Never use this producer for a new call; with ``down``, fail its queued records."""
        if self.broken is None:
            self.broken = reason
        if down:
            self.down = True

    def _serve(self) -> None:
        producer = self.client
        while not self._retired.is_set() or self.active_calls:
            self._poll(producer.poll, 0.1)
            self._purge_while_down()
        deadline = time.monotonic() + self.settings.delivery_timeout * 1.5 + 1
        while len(producer) and time.monotonic() < deadline:
            self._poll(producer.poll, 0.1)
            self._purge_while_down()
        if len(producer):
            # Still unacknowledged after the delivery timeout: report them as failed (they may
            # yet arrive: at-least-once, consumers drop the duplicate by ce_id).
            producer.purge(in_queue=True, in_flight=True)
            self._poll(producer.flush, 1.0)
        producer.close()

    def _purge_while_down(self) -> None:
        # Not once but as long as records are queued: records that were in flight when the
        # connection dropped come back to the queue for a retry only after the disconnect has
        # been handled, i.e. after the first purge. Their fate is unknown either way (the
        # request may have been written): BrokerUnavailable now or _MSG_TIMED_OUT later are the
        # same verdict, so there is no point in making the relay wait for the timeout.
        if self.down and len(self.client):
            self.client.purge(in_queue=True, in_flight=False)

    @staticmethod
    def _poll(serve: Any, timeout: float) -> None:
        try:
            serve(timeout)
        except Exception:  # a callback raised: log it, never let the poll thread die
            log.exception("Kafka delivery callback failed")

    # -- loop thread ------------------------------------------------------------------------

    def purge_if_down(self) -> None:
        """Fail the queued records now if the brokers went down while they were produced.

        The poll thread purges too when it learns the brokers are down, but records produced
        after its purge would otherwise wait for the delivery timeout.
        """
        if self.down:
            self.client.purge(in_queue=True, in_flight=False, blocking=False)

    def retire(self) -> None:
        """Take no new calls; flush and close in the poll thread."""
        self._retired.set()

    def join(self) -> None:
        self._thread.join()

    @property
    def closed(self) -> bool:
        return not self._thread.is_alive()


class _Batch:
    """Delivery reports of one ``publish`` call, collected in the poll thread.

    ``pending`` starts one above the record count: the producing loop holds that last unit
    until every record is queued, so the future cannot resolve in the middle of the loop.
    """

    __slots__ = ("future", "lock", "loop", "messages", "pending", "producer", "results", "settings")

    def __init__(
        self,
        messages: Sequence[Message],
        producer: _Producer,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.messages = messages
        self.producer = producer
        self.settings = producer.settings
        self.results: list[PublishError | None] = [None] * len(messages)
        self.pending = len(messages) + 1
        self.lock = threading.Lock()
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def delivered(self, index: int, error: KafkaError | None, _record: Any) -> None:
        """librdkafka's delivery report for record ``index`` (poll thread)."""
        if error is not None:
            self.results[index] = self.classify(error, self.messages[index].topic)
        self._settle_one(threadsafe=True)

    def failed(self, index: int, result: PublishError) -> None:
        """A record ``produce`` refused synchronously (loop thread)."""
        self.results[index] = result
        self._settle_one(threadsafe=False)

    def done_producing(self) -> None:
        self._settle_one(threadsafe=False)

    def _settle_one(self, *, threadsafe: bool) -> None:
        with self.lock:
            self.pending -= 1
            last = self.pending == 0
        if last:
            if threadsafe:
                # A closed loop (RuntimeError) has nobody waiting any more.
                with contextlib.suppress(RuntimeError):
                    self.loop.call_soon_threadsafe(_resolve, self.future)
            else:
                _resolve(self.future)

    def classify(self, error: KafkaError, topic: str) -> PublishError:
        """Turn a librdkafka error for a record of ``topic`` into the relay's verdict."""
        code = error.code()
        fatal = error.fatal()
        text = f"{error.name()}: {error.str()}"
        if fatal or code in _BREAKS_PRODUCER:
            self.producer.mark_broken(f"{text} ({self.settings.safe_url()})", down=fatal)
        if fatal or code in _BROKER_DOWN:
            if code in _PURGED and self.producer.broken:
                return BrokerUnavailable(self.producer.broken)
            if code == _MSG_TIMED_OUT:
                detail = f"; last connection error: {self.producer.last_error}"
                return BrokerUnavailable(
                    f"no acknowledgement from Kafka at {self.settings.safe_url()} within "
                    f"{self.settings.delivery_timeout:g} s ({text}"
                    f"{detail if self.producer.last_error else ''})"
                )
            return BrokerUnavailable(f"Kafka at {self.settings.safe_url()} unavailable ({text})")
        if code in _MISSING_TOPIC:
            self.producer.missing_topics.add(topic)
            hint = (
                "and the broker did not create it"
                if self.settings.auto_create_topics
                else "(auto-creation is off: create it, or add ?auto_create_topics=true)"
            )
            return PermanentPublishError(f"Kafka topic {topic!r} does not exist {hint} ({text})")
        if code in _PERMANENT:
            return PermanentPublishError(f"Kafka refused the record for topic {topic!r} ({text})")
        return RetryablePublishError(f"Kafka could not publish to topic {topic!r} ({text})")


class KafkaPublisher:
    """Publishes outbox messages to Kafka with an idempotent confluent-kafka producer.

    The publisher owns its producers: ``async with`` starts one (a relay can start while Kafka
    is down: connecting happens in the background) and closes every producer it started, after
    their outstanding records are delivered or have timed out. Settings not in the URL (or a
    password kept out of it) are given with :func:`dataclasses.replace`::

        settings = replace(KafkaSettings.from_url(url), sasl_password=os.environ["KAFKA_PW"])
        async with KafkaPublisher(settings) as publisher: ...

    Concurrent ``publish`` calls share one producer; librdkafka's queue is the window of
    unacknowledged records (bounded by ``queue.buffering.max.messages``; a full queue makes
    ``publish`` wait, never fail).
    """

    #: Records of one key go to one partition, and the idempotent producer keeps a partition's
    #: write order across its retries (librdkafka refuses ``max.in.flight`` > 5, ``retries`` 0
    #: or a LIFO queue with idempotence on): the relay may pipeline a key's run in one call.
    keeps_key_order = True

    def __init__(self, settings: KafkaSettings | str) -> None:
        """Take parsed settings, or a ``kafka://`` URL to parse."""
        if isinstance(settings, str):
            settings = KafkaSettings.from_url(settings)
        self.settings = settings
        self._current: _Producer | None = None
        self._retiring: list[_Producer] = []
        self._started = 0
        self._closed = False
        self._encode_headers = header_encoder(settings.source)
        #: Topic names checked legal (few: a set lookup per record instead of a regex).
        self._valid_topics: set[str] = set()

    @classmethod
    def from_url(cls, url: str) -> KafkaPublisher:
        """``kafka://host:port[,host:port][?options]``; see :class:`KafkaSettings`."""
        return cls(KafkaSettings.from_url(url))

    def __repr__(self) -> str:
        return f"KafkaPublisher({self.settings.safe_url()!r})"

    async def __aenter__(self) -> KafkaPublisher:
        self._closed = False
        if self._current is None:
            self._current = self._start_producer()
            # Before the first claim: the first batch does not wait for the producer id.
            await asyncio.to_thread(self._current.warm_up, _WARM_UP_TIMEOUT)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._closed = True
        producers = [*self._retiring, *([self._current] if self._current else [])]
        self._current = None
        self._retiring = []
        for producer in producers:
            producer.retire()
        for producer in producers:
            # Joining waits for the flush (bounded by the delivery timeout): off the loop.
            await asyncio.to_thread(producer.join)

    def _start_producer(self) -> _Producer:
        self._started += 1
        return _Producer(self.settings, self._started)

    def _producer_for_call(self) -> _Producer:
        """The producer for a new call: a fresh one when the current one is broken.

        Runs on the loop without awaiting, so concurrent calls never start two producers.
        """
        current = self._current
        if current is not None and current.broken is None:
            return current
        if current is not None:
            log.debug("replacing the Kafka producer (%s)", current.broken)
            current.retire()
            self._retiring = [p for p in self._retiring if not p.closed]
            self._retiring.append(current)
            self._current = None
        self._current = self._start_producer()
        return self._current

    async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
        """Queue every message with librdkafka, then wait for all their delivery reports."""
        if not messages:
            return []
        if self._closed:
            raise RuntimeError("the Kafka publisher is closed")
        try:
            producer = self._producer_for_call()
        except ConfigurationError as exc:
            return [BrokerUnavailable(str(exc))] * len(messages)
        if producer.missing_topics:
            await self._refresh_missing(producer, {m.topic for m in messages})
        batch = _Batch(messages, producer, asyncio.get_running_loop())
        producer.active_calls += 1
        try:
            await self._produce_all(producer, batch)
        finally:
            producer.active_calls -= 1
            batch.done_producing()
        producer.purge_if_down()
        await batch.future
        return batch.results

    async def _refresh_missing(self, producer: _Producer, topics: set[str]) -> None:
        """Ask for the metadata of the topics of this call that were missing before, so a topic
        created since is known again (see ``_Producer.missing_topics``)."""
        for topic in producer.missing_topics & topics:
            producer.missing_topics.discard(topic)
            timeout = min(self.settings.missing_topic_timeout, 5.0) or 1.0
            with contextlib.suppress(KafkaException):
                await asyncio.to_thread(producer.client.list_topics, topic, timeout)

    async def _produce_all(self, producer: _Producer, batch: _Batch) -> None:
        produce = producer.client.produce
        delivered = batch.delivered
        encode_headers = self._encode_headers
        valid_topics = self._valid_topics
        for index, message in enumerate(batch.messages):
            if message.topic not in valid_topics:
                invalid = invalid_topic_name(message.topic)
                if invalid is not None:
                    batch.failed(index, PermanentPublishError(invalid))
                    continue
                valid_topics.add(message.topic)
            headers = encode_headers(message)
            callback = functools.partial(delivered, index)
            while True:
                try:
                    produce(
                        message.topic,
                        message.payload,
                        message.key,
                        on_delivery=callback,
                        headers=headers,
                    )
                    break
                except BufferError:
                    # librdkafka's queue is full: this is the window. Wait for acks to drain it.
                    if not await self._wait_for_room(producer):
                        batch.failed(
                            index,
                            BrokerUnavailable(
                                f"Kafka at {self.settings.safe_url()} is not draining the "
                                f"producer queue ({producer.broken or 'queue full'})"
                            ),
                        )
                        break
                except KafkaException as exc:
                    error = exc.args[0] if exc.args else None
                    if isinstance(error, KafkaError):
                        batch.failed(index, batch.classify(error, message.topic))
                    else:
                        batch.failed(index, RetryablePublishError(f"Kafka produce failed: {exc}"))
                    break
                except (TypeError, ValueError, UnicodeError) as exc:
                    batch.failed(
                        index,
                        PermanentPublishError(f"record not encodable for Kafka: {exc}"),
                    )
                    break

    async def _wait_for_room(self, producer: _Producer) -> bool:
        """Wait until the producer queue has room; False when it stays full or the producer
        broke (its records then time out or are purged)."""
        deadline = time.monotonic() + self.settings.delivery_timeout
        queued = len(producer.client)
        while time.monotonic() < deadline and producer.broken is None:
            await asyncio.sleep(0.005)
            if len(producer.client) < queued:
                return True
        return False
