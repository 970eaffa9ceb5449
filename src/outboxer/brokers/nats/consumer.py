"""NATS JetStream consumer: one durable pull consumer per subject, explicit acks.

For every topic (subject) the adapter finds the stream that captures it and binds to a durable
consumer named ``<consumer>_<subject>`` (characters NATS does not allow in names become ``_``),
creating it on first use with explicit acks, ``deliver_policy=all`` (nothing published before
the first start is missed) and unlimited deliveries (failures are retried by the inbox, not by
JetStream). It fetches batches (the next while the inbox stores the previous one) and
acknowledges each message after the inbox committed the whole batch; a message not acknowledged
within ``ack_wait`` (a crash, a stop during a database outage) is delivered again by JetStream,
and the inbox drops it if it was handled.

Messages are decoded from the publisher's wire format (``Nats-Msg-Id``/``ce-id``, ``ce-type``,
``ce-time``, ``ce-partitionkey``, ``content-type``) by :func:`.wire.decode`.

URL: the publisher's ``nats://`` URL (servers, credentials, ``name``, ``connect_timeout``,
``tls_ca_file``) plus these consumer options, all optional:

===================  ==============  ========================================================
option               default         meaning
===================  ==============  ========================================================
``ack_wait``         ``30``          seconds JetStream waits for an ack before redelivering;
                                     must exceed the time a batch takes (set when the durable
                                     consumer is created)
``max_ack_pending``  2 × batch size  unacknowledged messages JetStream hands out at once
===================  ==============  ========================================================

The client reconnects by itself after a connection loss; the first connection is retried with
a backoff (1 s doubling to 30 s). What a fetch was handed while the connection broke is lost
on the way and delivered again by JetStream after ``ack_wait``: after a reconnection the
consumer waits for it (at most ``ack_wait``) before fetching anything newer, so each key keeps
its order. JetStream answers no fetch of a durable that was deleted (by
an operator) while the consumer runs, so an idle consumer looks for its durables every 10 s and
creates a missing one again, from the start of the stream as on a first start (the inbox drops
what it handled within its retention).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import re
import ssl
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from outboxer.brokers.nats.settings import NatsConsumerSettings
from outboxer.brokers.nats.wire import decode
from outboxer.errors import BrokerUnavailable, ConfigurationError, error_summary
from outboxer.inbox.consumer import Deliver, Deliveries

__all__ = ["NatsConsumer", "durable_name"]

log = logging.getLogger("outboxer.consumer.nats")

#: How long one fetch waits for the first message: the longest delay before a stop is noticed.
_FETCH_SECONDS = 1.0
#: How often an idle consumer checks that its durable still exists (seconds).
_DURABLE_CHECK_SECONDS = 10.0
#: How often a starting consumer looks whether what was delivered before it is acknowledged.
_LEFT_POLL_SECONDS = 0.2
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


#: NATS refuses a longer consumer name (it names a directory of the file store).
_MAX_DURABLE = 255


def _swallowed_message(error: BaseException) -> Msg | None:
    """The JetStream message a failed ``fetch`` took for a status message: one with a user header
    'Status' (nats-py reads a status from that header), found in the frames of the failure.
    A message of the stream has a ``$JS.ACK`` reply subject; a real status message has none."""
    found = None
    frame = error.__traceback__
    while frame is not None:
        candidate = frame.tb_frame.f_locals.get("msg")
        if isinstance(candidate, Msg) and (candidate.reply or "").startswith("$JS.ACK."):
            found = candidate
        frame = frame.tb_next
    return found


def durable_name(consumer: str, subject: str) -> str:
    """The durable consumer of ``consumer`` for ``subject``: every character but letters,
    digits, ``_`` and ``-`` as ``_`` (NATS forbids ``.``, ``*``, ``>`` and whitespace in names).
    A name longer than NATS takes (a 200-character consumer name on a 255-byte subject) is cut
    and ends in a hash of the whole, so it stays one durable per (consumer, subject)."""
    name = _NAME_UNSAFE.sub("_", f"{consumer}_{subject}")
    if len(name) <= _MAX_DURABLE:
        return name
    digest = hashlib.sha256(f"{consumer}\0{subject}".encode()).hexdigest()[:16]
    return f"{name[: _MAX_DURABLE - 17]}_{digest}"


class NatsConsumer:
    """Fetches from durable JetStream pull consumers and acks after delivery (module docs)."""

    def __init__(self, settings: NatsConsumerSettings) -> None:
        self.settings = settings
        self._client: Client | None = None
        self._disconnects = 0  # connection losses so far (see _fetch)

    def __repr__(self) -> str:
        return f"NatsConsumer({self.settings.connection.describe()}, name={self.settings.name!r})"

    async def __aenter__(self) -> NatsConsumer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await client.close()

    async def _connect(self) -> Client:
        settings = self.settings.connection
        client = Client()

        async def on_error(exc: Exception) -> None:
            log.debug("NATS client error at %s: %r", settings.describe(), exc)

        async def on_disconnect() -> None:
            if client.is_closed:  # our own close (nats-py calls this then too): not a loss
                return
            self._disconnects += 1
            log.warning("NATS consumer disconnected from %s; reconnecting", settings.describe())

        async def on_reconnect() -> None:
            log.info("NATS consumer reconnected to %s", settings.describe())

        options: dict[str, Any] = {
            "servers": list(settings.servers),
            "name": f"{settings.name} consumer {self.settings.name}",
            "connect_timeout": settings.connect_timeout,
            # After the first connection the client keeps reconnecting by itself; fetches fail
            # meanwhile and are retried.
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 1,
            "error_cb": on_error,
            "disconnected_cb": on_disconnect,
            "reconnected_cb": on_reconnect,
        }
        if settings.tls_ca_file is not None:
            options["tls"] = ssl.create_default_context(cafile=settings.tls_ca_file)
        if settings.token is not None:
            options["token"] = settings.token
        if settings.user is not None:
            options["user"] = settings.user
            options["password"] = settings.password
        try:
            budget = settings.connect_timeout * (2 * len(settings.servers) + 1)
            async with asyncio.timeout(budget):
                await client.connect(**options)
        except Exception as exc:  # noqa: BLE001 - every connect failure means broker-down
            with contextlib.suppress(Exception):
                await client.close()
            raise BrokerUnavailable(
                f"cannot connect to NATS at {settings.describe()}: {str(exc) or type(exc).__name__}"
            ) from None
        return client

    async def _subscribe(self, client: Client, subject: str) -> Any:
        js = client.jetstream()
        try:
            stream = await js.find_stream_name_by_subject(subject)
        except nats.js.errors.NotFoundError:
            raise ConfigurationError(
                f"no JetStream stream captures subject {subject!r}: create one, e.g. "
                f"'nats stream add --subjects {subject!r}'"
            ) from None
        durable = durable_name(self.settings.name, subject)
        # Names are sanitized, so two subjects ("a.b", "a_b"), or two consumers ("x.y" on "z",
        # "x" on "y.z"), may come to one durable. nats-py reuses an existing durable as it is:
        # the second subject's messages would never be fetched, or two consumers would take
        # each other's, silently. A durable that filters another subject is refused.
        try:
            existing = await js.consumer_info(stream, durable)
        except nats.js.errors.NotFoundError:
            existing = None
        if existing is not None:
            filters = existing.config.filter_subjects or [existing.config.filter_subject]
            if filters != [subject]:
                named = ", ".join(map(repr, filter(None, filters))) or "every subject"
                raise ConfigurationError(
                    f"cannot consume subject {subject!r} as NATS durable {durable!r}: it "
                    f"already filters {named} (durable names replace every character but "
                    "letters, digits, '_' and '-' by '_'); consume it under another "
                    "--consumer-name"
                )
        config = ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=self.settings.ack_wait,
            max_deliver=-1,  # failures are the inbox's to retry, not JetStream's
            max_ack_pending=self.settings.max_ack_pending or 2 * self.settings.batch_size,
        )
        subscription = await js.pull_subscribe(
            subject, durable=durable, stream=stream, config=config
        )
        log.info("consuming %r from stream %r as durable %r", subject, stream, durable)
        return subscription

    async def run(self, deliver: Deliver, stop: asyncio.Event) -> None:
        failures = 0
        while self._client is None:
            if stop.is_set():
                return
            try:
                self._client = await self._connect()
            except BrokerUnavailable as exc:
                failures += 1
                delay = self.settings.reconnect.delay(failures)
                log.warning("%s; retrying in %.0f s", exc, delay)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await stop.wait()
        client = self._client
        subscriptions = [
            (subject, await self._subscribe(client, subject)) for subject in self.settings.topics
        ]
        await asyncio.gather(
            *(self._consume(client, *subscribed, deliver, stop) for subscribed in subscriptions)
        )

    async def _consume(
        self, client: Client, subject: str, subscription: Any, deliver: Deliver, stop: asyncio.Event
    ) -> None:
        async with Deliveries(deliver) as deliveries:
            await self._wait_for_left_pending(subscription, stop)
            await self._fetch(client, subject, subscription, deliveries, stop)

    async def _wait_for_left_pending(
        self, subscription: Any, stop: asyncio.Event, since: str = "this instance started"
    ) -> None:
        """Messages another instance fetched and has not acknowledged (it was killed, or is
        storing a batch) come again only after ``ack_wait``, new ones at once: a key's new
        message overtook them (a probe: one ``kill -9``, a restart, then ``[4, 1, 2, 3]``).
        Before its first fetch, the consumer waits until everything delivered before it
        started is acknowledged (a live instance's batch: soon) or ``ack_wait`` has passed (a
        dead one's: JetStream then delivers them before anything newer)."""
        try:
            info = await subscription.consumer_info()
        except (TimeoutError, nats.errors.Error):
            return  # the fetch loop meets and reports what is wrong
        if not info.num_ack_pending or info.delivered is None:
            return
        delivered = info.delivered.stream_seq or 0
        ack_wait = float(info.config.ack_wait or self.settings.ack_wait)
        log.info(
            "%d message(s) delivered before %s are not acknowledged: "
            "waiting for them (at most %.0f s, ack_wait) before reading new ones, so that "
            "each key keeps its order",
            info.num_ack_pending,
            since,
            ack_wait,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ack_wait
        while not stop.is_set() and loop.time() < deadline:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(_LEFT_POLL_SECONDS, deadline - loop.time())):
                    await stop.wait()
            try:
                info = await subscription.consumer_info()
            except (TimeoutError, nats.errors.Error):
                return
            floor = info.ack_floor.stream_seq if info.ack_floor is not None else 0
            if not info.num_ack_pending or (floor or 0) >= delivered:
                return

    async def _fetch(
        self,
        client: Client,
        subject: str,
        subscription: Any,
        deliveries: Deliveries,
        stop: asyncio.Event,
    ) -> None:
        loop = asyncio.get_running_loop()
        next_check = loop.time() + _DURABLE_CHECK_SECONDS
        disconnects = self._disconnects
        while not stop.is_set():
            lost = disconnects != self._disconnects or not client.is_connected
            if lost and not client.is_closed:  # closed for good: the fetch reports it, paced
                # Messages a fetch was given while the connection broke never arrived, and
                # JetStream delivers them again only after ack_wait: the next fetch would hand
                # out newer ones of their keys first (a probe: a cut, then [m0, m2, m1]).
                disconnects = self._disconnects
                await self._wait_for_reconnection(client, stop)
                await self._wait_for_left_pending(subscription, stop, "the connection was lost")
                continue
            try:
                batch: list[Msg] = await subscription.fetch(
                    self.settings.batch_size, timeout=_FETCH_SECONDS
                )
                if disconnects != self._disconnects:
                    # Fetched across a lost connection: it may hold messages newer than lost
                    # ones. Left unacknowledged, it comes again after them (ack_wait).
                    continue
            except (TimeoutError, nats.errors.TimeoutError, nats.errors.Error, KeyError) as exc:
                swallowed = _swallowed_message(exc)
                if swallowed is not None:
                    # Another producer's message with a 'Status' header: nats-py took it for
                    # a JetStream status and failed the fetch (the messages fetched with it
                    # come again after ack_wait). Handed over alone, it is stored and acked
                    # like any other, instead of failing every fetch it comes back in.
                    log.warning(
                        "a NATS message of %r has a 'Status' header, which nats-py takes for "
                        "a JetStream status: delivered alone (rename the header at its "
                        "producer)",
                        swallowed.subject,
                    )
                    if not await self._submit(client, deliveries, [swallowed]):
                        return
                    continue
                if not isinstance(exc, TimeoutError | nats.errors.TimeoutError):
                    log.warning("NATS fetch failed: %s", error_summary(exc))
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1.0):
                            await stop.wait()
                    continue
                # Nothing new, or the durable is gone (an operator deleted it): JetStream
                # answers no fetch of a missing durable, so it is looked for while idle.
                if loop.time() >= next_check:
                    next_check = loop.time() + _DURABLE_CHECK_SECONDS
                    subscription = await self._durable_of(client, subject, subscription)
                continue
            if not await self._submit(client, deliveries, batch):
                return  # not acknowledged: JetStream delivers them again after ack_wait

    @staticmethod
    async def _wait_for_reconnection(client: Client, stop: asyncio.Event) -> None:
        while not client.is_connected and not client.is_closed and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await stop.wait()

    async def _submit(self, client: Client, deliveries: Deliveries, batch: list[Msg]) -> bool:
        messages = []
        for msg in batch:
            try:
                stream, sequence = msg.metadata.stream, msg.metadata.sequence.stream
            except (ValueError, AttributeError, IndexError):
                stream, sequence = None, None
            messages.append(
                decode(
                    subject=msg.subject,
                    data=msg.data,
                    headers=msg.headers,
                    stream=stream,
                    sequence=sequence,
                )
            )
        acknowledge = functools.partial(self._acknowledge, client, batch)
        return await deliveries.submit(messages, acknowledge)

    async def _durable_of(self, client: Client, subject: str, subscription: Any) -> Any:
        """``subscription``, or a new one (its durable created again, from the start of the
        stream: the inbox drops what it handled) when its durable was deleted."""
        try:
            await subscription.consumer_info()
        except nats.js.errors.NotFoundError:
            log.warning("durable consumer of %r is gone (deleted?): creating it again", subject)
            with contextlib.suppress(nats.errors.Error):
                await subscription.unsubscribe()
            return await self._subscribe(client, subject)
        except (TimeoutError, nats.errors.Error):
            pass  # cannot tell now; looked for again later
        return subscription

    async def _acknowledge(self, client: Client, batch: list[Msg]) -> None:
        try:
            for msg in batch:
                await msg.ack()
            await client.flush(timeout=5)
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning(
                "could not acknowledge %d messages (%s): JetStream delivers them again "
                "and the inbox drops them",
                len(batch),
                exc,
            )
