"""RabbitMQ publisher: every message is published to one topic exchange with publisher confirms.

A message counts as acknowledged only when RabbitMQ confirmed it (``basic.ack`` on a channel in
confirm mode), which for a persistent message routed to a durable queue means the queue has
written it to disk. A batch is one pipeline: its messages are marshalled and written to the
socket in one buffer, and the confirms are collected as they arrive (RabbitMQ coalesces them
with ``multiple=True``), with at most ``max_unconfirmed`` messages unconfirmed on the
connection at any time across concurrent calls. Every call of one publisher shares one
connection and one channel, and a channel keeps publish order, so messages of the same key
stay in write order.

Wire format (``amqp://user:pass@host:port/vhost?exchange=NAME``)::

    basic.publish(exchange=NAME, routing_key=<topic>, mandatory=True) + properties below

=====================  ======================================================================
AMQP field             value
=====================  ======================================================================
exchange               ``NAME`` (default ``outbox``), declared on connect: type ``topic``,
                       durable; redeclaring an existing one with other settings fails
routing key            the message topic
``message_id``         the outbox message id (UUIDv7 string): consumers deduplicate on it
``type``               event type; absent when the message has no type
``timestamp``          ``created_at`` in whole seconds since the epoch (AMQP's resolution)
``content_type``       MIME type of the body
``delivery_mode``      2 (persistent)
``headers``            the user headers, plus ``x-outbox-key`` = the message key when it has
                       one (it replaces a user header of that name)
body                   the payload bytes, unchanged
=====================  ======================================================================

A message no queue is bound for is *unroutable*: RabbitMQ returns it (``basic.return``, sent
before its ``basic.ack``) because it is published ``mandatory``. ``?unroutable=dead-letter``
(the default) reports it as a ``PermanentPublishError`` naming the exchange and routing key;
``?unroutable=ack`` treats it as delivered (for fan-out setups where "nobody listens" is fine).

URL::

    amqp://[user[:password]@]host[:port][/vhost][?exchange=NAME&unroutable=dead-letter|ack
          &max_unconfirmed=N&confirm_timeout=S&connect_timeout=S&heartbeat=S
          &max_message_size=BYTES&connection_name=NAME]
    amqps://...   TLS with the system's trust store (pass ``ssl_context`` for anything else)

The user and password default to ``guest``; the vhost is the URL path, percent-decoded
(``/%2F`` and an empty path both mean ``/``).

Error classification:

===========================================================  ===========================
failure                                                      result
===========================================================  ===========================
connection refused/reset/lost, DNS or TLS failure, no        ``BrokerUnavailable``
answer within ``connect_timeout``
login refused, vhost missing or forbidden, exchange exists   ``BrokerUnavailable``
with another type (the broker is unusable until fixed)
channel or connection closed by the broker (exchange         ``BrokerUnavailable``
deleted, resource alarm past ``confirm_timeout``, admin
closed the connection) while messages await their confirm
no confirm within ``confirm_timeout`` (the connection is     ``BrokerUnavailable``
then dropped, the next call reconnects)
``basic.nack`` (queue full with ``overflow=reject-publish``, ``RetryablePublishError``
internal queue error)
returned as unroutable, ``?unroutable=dead-letter``          ``PermanentPublishError``
returned as unroutable, ``?unroutable=ack``                  acknowledged (``None``)
topic, id, type, content type or a header name longer than   ``PermanentPublishError``
255 bytes (AMQP short strings); payload over
``max_message_size`` (RabbitMQ 4 refuses over 16 MiB by
default and would close the channel)
===========================================================  ===========================

After a ``BrokerUnavailable`` the connection is dropped; the next ``publish`` makes one new
connection attempt (concurrent calls share it), and the relay paces the calls. Messages that
were written but not confirmed when a connection broke may still have reached a queue: they are
published again later, the at-least-once duplicates consumers drop by ``message_id``.

Why pika: measured by ``benchmarks/raw_rabbitmq.py --compare`` on a 2-core machine with
RabbitMQ on the same host (20,000 messages of ~120 bytes, persistent, routed to a durable
queue), pika's asyncio adapter confirmed 16-25k msg/s at ~8 us of client CPU per message,
aiormq used directly 5-11k msg/s at ~100 us, aio-pika (built on aiormq) 4-9.5k at ~140 us.
aiormq spends its time per message: a channel lock, a write-queue hand-off, a confirmation
future and a drain future each. pika marshals a publish synchronously and reports confirms
through one callback, so this adapter keeps one dict of unconfirmed delivery tags and one
future per call. It also marshals the frames itself (the bytes ``basic_publish`` would write,
see ``_Link._queue_frames`` and :func:`wire.encode_properties`) and writes a batch's frames in
one buffer through pika's own frame output instead of one ``send()`` per frame; pika's
``BasicProperties`` and frame objects alone cost more CPU per message than the rest of the
relay's publishing. With pika the broker is the limit.

Passwords never appear in ``repr``, log lines or error messages (see
:meth:`RabbitMQSettings.safe_url`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import pika  # type: ignore[import-untyped]
import pika.exceptions  # type: ignore[import-untyped]
import pika.frame  # type: ignore[import-untyped]
import pika.spec  # type: ignore[import-untyped]
from pika.adapters.asyncio_connection import AsyncioConnection  # type: ignore[import-untyped]

from outboxer.brokers.rabbitmq import wire
from outboxer.brokers.rabbitmq._pika import describe, resolve
from outboxer.brokers.rabbitmq.settings import RabbitMQSettings
from outboxer.brokers.rabbitmq.topology import exchange_declaration
from outboxer.errors import (
    BrokerUnavailable,
    PermanentPublishError,
    PublishError,
    RetryablePublishError,
)
from outboxer.message import Message

__all__ = ["RabbitMQPublisher"]

log = logging.getLogger(__name__)

_FLUSH_BYTES = 1 << 20  # write queued frames at least every MiB (large payloads)
_CLOSE_GRACE = 2.0  # seconds for pika's closing handshake before the socket is just dropped
_SHORTSTR_MAX = 255  # AMQP short strings (routing key, property strings, table keys)
# AMQP frame: type, channel, payload size ... frame end. A content header's payload starts with
# class id, weight (0) and body size: 12 bytes before the encoded properties.
_FRAME_START = struct.Struct(">BHI")
_HEADER_FRAME = struct.Struct(">BHIHxxQ")
_HEADER_FIXED = 12
_FRAME_END = bytes([pika.spec.FRAME_END])


# What pika raises while marshalling a message, before it writes anything: message-specific.
_UNENCODABLE = (
    pika.exceptions.ShortStringTooLong,
    pika.exceptions.UnsupportedAMQPFieldException,
    TypeError,
    ValueError,  # UnicodeEncodeError too
    struct.error,  # a timestamp before 1970
)


def _too_long(text: str) -> bool:
    # 63 characters are at most 252 UTF-8 bytes: skip the encode for the usual short strings.
    # surrogatepass: text that is not valid UTF-8 at all is refused by pika's encoder instead.
    return len(text) > 63 and len(text.encode(errors="surrogatepass")) > _SHORTSTR_MAX


class _Batch:
    """The outcome of one ``publish`` call, filled in by the confirm callbacks."""

    __slots__ = ("done", "results", "sealed", "unconfirmed")

    def __init__(self, results: list[PublishError | None], done: asyncio.Future[None]) -> None:
        self.results = results
        self.done = done
        self.unconfirmed = 0
        self.sealed = False  # every message of the call has been written (or refused)

    def settle(self, index: int, outcome: PublishError | None) -> None:
        self.results[index] = outcome
        self.unconfirmed -= 1
        if self.sealed and self.unconfirmed == 0 and not self.done.done():
            self.done.set_result(None)

    def seal(self) -> None:
        self.sealed = True
        if self.unconfirmed == 0 and not self.done.done():
            self.done.set_result(None)


class _Link:
    """One connection with one channel in confirm mode, and what awaits its confirms.

    Delivery tags are counted here: RabbitMQ numbers the publishes of a confirm-mode channel
    1, 2, 3, ... and confirms them by that number (``multiple=True`` covers every tag up to
    it). All callbacks run on the event loop, so no lock is needed.
    """

    def __init__(self, settings: RabbitMQSettings, loop: asyncio.AbstractEventLoop) -> None:
        self.settings = settings
        self.loop = loop
        self.connection: Any = None
        self.channel: Any = None
        self.next_tag = 0
        # tag -> (call, index in the call, message id), in tag order (tags only grow).
        self.unconfirmed: OrderedDict[int, tuple[_Batch, int, str]] = OrderedDict()
        # message id -> its unconfirmed tags, to match a basic.return (which carries no tag).
        self.tags_by_id: dict[str, list[int]] = {}
        self.returned: dict[int, PermanentPublishError | None] = {}
        self.room = asyncio.Event()
        self.room.set()
        self.failure: str | None = None  # why the link is unusable; None while it works
        self.gone: asyncio.Future[None] = loop.create_future()  # the socket is closed
        self._step: asyncio.Future[Any] | None = None  # the handshake step being awaited
        self._queued: list[bytes] = []  # frames marshalled but not yet written, see flush()
        self._queued_bytes = 0
        self._body_max = 4088  # frame_max 4096 (AMQP's minimum) until negotiated
        self._publish_frames: dict[str, bytes] = {}  # routing key -> basic.publish frame

    @property
    def usable(self) -> bool:
        return self.failure is None and self.channel is not None

    # -- opening ---------------------------------------------------------------------------

    async def open(self, parameters: Any) -> None:
        """Connect, open the channel, select confirms, declare the exchange."""
        settings = self.settings
        opened: asyncio.Future[Any] = self.loop.create_future()
        self._step = opened
        self.connection = AsyncioConnection(
            parameters,
            on_open_callback=lambda conn: resolve(opened, conn),
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_connection_closed,
            custom_ioloop=self.loop,
        )
        await opened
        self.connection.add_on_connection_blocked_callback(self._on_blocked)
        self.connection.add_on_connection_unblocked_callback(self._on_unblocked)
        channel = await self._rpc(lambda done: self.connection.channel(on_open_callback=done))
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        await self._rpc(lambda done: channel.confirm_delivery(self._on_confirm, callback=done))
        await self._rpc(
            lambda done: channel.exchange_declare(**exchange_declaration(settings), callback=done)
        )
        self._step = None
        self.channel = channel
        # Largest body frame: the negotiated frame_max less the frame header and end octet.
        self._body_max = int(self.connection.params.frame_max) - 8

    async def _rpc(self, start: Callable[[Callable[[Any], None]], object]) -> Any:
        if self.failure is not None:
            raise BrokerUnavailable(f"{self.settings.safe_url()}: {self.failure}")
        step: asyncio.Future[Any] = self.loop.create_future()
        self._step = step
        start(lambda result: resolve(step, result))
        return await step

    def _on_open_error(self, connection: Any, exc: BaseException | None) -> None:
        self._fail(describe(exc))
        resolve(self.gone, None)

    # -- publishing ------------------------------------------------------------------------

    def publish(self, message: Message, batch: _Batch, index: int) -> None:
        """Queue one message for the next :meth:`flush` and await its confirm.

        Raises whatever pika raises while marshalling (nothing is queued then).
        """
        self._queue_frames(message)
        self.next_tag += 1
        tag = self.next_tag
        self.unconfirmed[tag] = (batch, index, message.id)
        self.tags_by_id.setdefault(message.id, []).append(tag)
        batch.unconfirmed += 1
        if self._queued_bytes >= _FLUSH_BYTES:
            self.flush()

    def _queue_frames(self, message: Message) -> None:
        """Marshal the frames of one ``basic.publish``: method, content header, body.

        The same frames ``channel.basic_publish`` marshals, written with :mod:`struct` (pika's
        frame objects cost more CPU than the rest of the publisher); the method frame is the
        same for every message of a topic, so it is marshalled once per topic.
        """
        number = self.channel.channel_number
        method = self._publish_frames.get(message.topic)
        if method is None:
            method = pika.frame.Method(
                number,
                pika.spec.Basic.Publish(
                    exchange=self.settings.exchange, routing_key=message.topic, mandatory=True
                ),
            ).marshal()
            if len(self._publish_frames) >= 1024:  # many distinct topics: keep it bounded
                self._publish_frames.clear()
            self._publish_frames[message.topic] = method
        properties = wire.encode_properties(message)
        if _HEADER_FIXED + len(properties) > self._body_max:
            # A content header cannot span frames: RabbitMQ would close the connection
            # (FRAME_ERROR) and the relay take it for an outage, forever (a probe).
            raise ValueError(
                f"its headers take {len(properties)} bytes, more than one AMQP frame holds "
                f"({self._body_max - _HEADER_FIXED} with frame_max {self._body_max + 8})"
            )
        payload = message.payload
        size = len(payload)
        frames = self._queued
        frames.append(method)
        frames.append(
            _HEADER_FRAME.pack(
                pika.spec.FRAME_HEADER,
                number,
                _HEADER_FIXED + len(properties),
                pika.spec.BasicProperties.INDEX,
                size,
            )
        )
        frames.append(properties)
        frames.append(_FRAME_END)
        step = self._body_max
        for start in range(0, size, step):
            chunk = payload[start : start + step] if size > step else payload
            frames.append(_FRAME_START.pack(pika.spec.FRAME_BODY, number, len(chunk)))
            frames.append(chunk)
            frames.append(_FRAME_END)
        # Framing overhead counted roughly: this only paces the flushes of large batches.
        self._queued_bytes += len(method) + len(properties) + size + 28

    def flush(self) -> None:
        """Hand every queued frame to the socket as one write.

        Called before every ``await`` of a publishing call: no frame stays queued while other
        code runs, so frames go out in delivery-tag order.
        """
        if not self._queued:
            return
        data = b"".join(self._queued)
        self._queued.clear()
        self._queued_bytes = 0
        if self.failure is not None:
            return  # the link is down: these messages report BrokerUnavailable anyway
        try:
            # pika's own frame output (buffer + stats), where basic_publish ends too (pika 1.x).
            self.connection._output_marshaled_frames([data])  # noqa: SLF001
        except (AttributeError, pika.exceptions.AMQPError) as exc:  # transport already gone
            self.abandon(f"write failed: {describe(exc)}")

    async def wait_for_room(self) -> None:
        while self.failure is None and len(self.unconfirmed) >= self.settings.max_unconfirmed:
            self.room.clear()
            await self.room.wait()

    # -- broker callbacks ------------------------------------------------------------------

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        outcome: PublishError | None = None
        if isinstance(method, pika.spec.Basic.Nack):
            outcome = RetryablePublishError(
                "RabbitMQ refused the message (basic.nack): a queue is full with "
                "overflow=reject-publish, or a queue failed"
            )
        tag: int = method.delivery_tag
        if method.multiple:
            unconfirmed = self.unconfirmed
            while unconfirmed:
                first = next(iter(unconfirmed))
                if tag and first > tag:
                    break
                self._settle(first, outcome)
        else:
            self._settle(tag, outcome)
        if len(self.unconfirmed) < self.settings.max_unconfirmed:
            self.room.set()

    def _settle(self, tag: int, outcome: PublishError | None) -> None:
        entry = self.unconfirmed.pop(tag, None)
        if entry is None:
            return
        batch, index, message_id = entry
        tags = self.tags_by_id.get(message_id)
        if tags is not None:
            if len(tags) == 1:
                del self.tags_by_id[message_id]
            else:
                tags.remove(tag)
        if tag in self.returned:
            returned = self.returned.pop(tag)
            if outcome is None:  # a nack stays a nack
                outcome = returned
        batch.settle(index, outcome)

    def _on_return(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        # RabbitMQ sends basic.return before the basic.ack of the same message; the ack then
        # settles it with the outcome recorded here.
        tags = self.tags_by_id.get(properties.message_id or "", [])
        tag = next((t for t in tags if t not in self.returned), None)
        if tag is None:
            return
        if self.settings.unroutable == "ack":
            self.returned[tag] = None
            return
        self.returned[tag] = PermanentPublishError(
            f"unroutable: no queue is bound to exchange {method.exchange!r} for routing key "
            f"{method.routing_key!r} (RabbitMQ {method.reply_code} {method.reply_text})"
        )

    def _on_blocked(self, connection: Any, frame: Any) -> None:
        log.warning(
            "RabbitMQ blocked publishing on %s (%s)",
            self.settings.safe_url(),
            getattr(frame.method, "reason", "resource alarm"),
        )

    def _on_unblocked(self, connection: Any, frame: Any) -> None:
        log.info("RabbitMQ unblocked publishing on %s", self.settings.safe_url())

    def _on_channel_closed(self, channel: Any, exc: BaseException) -> None:
        # Called first when the whole connection goes, with the connection's reason.
        if isinstance(exc, pika.exceptions.ChannelClosed):
            self._fail(f"channel closed: {describe(exc)}")
        else:
            self._fail(f"connection lost: {describe(exc)}")
        # One channel per connection: without it the connection is useless, drop it too.
        self.close_connection()

    def _on_connection_closed(self, connection: Any, exc: BaseException) -> None:
        self._fail(f"connection closed: {describe(exc)}")
        resolve(self.gone, None)

    # -- failing and closing ---------------------------------------------------------------

    def _fail(self, reason: str) -> None:
        """Make the link unusable; everything awaiting a confirm gets ``BrokerUnavailable``."""
        if self.failure is None:
            if self.channel is not None:  # it was working: say once why it stopped
                log.warning(
                    "RabbitMQ publisher on %s is down: %s", self.settings.safe_url(), reason
                )
            self.failure = reason
        if self._step is not None and not self._step.done():
            self._step.set_exception(BrokerUnavailable(f"{self.settings.safe_url()}: {reason}"))
        error = BrokerUnavailable(f"{self.settings.safe_url()}: {self.failure}")
        unconfirmed, self.unconfirmed = self.unconfirmed, OrderedDict()
        self.tags_by_id.clear()
        self.returned.clear()
        for batch, index, _ in unconfirmed.values():
            batch.settle(index, error)
        self.room.set()  # wake writers waiting for room: they see the failure

    def abandon(self, reason: str) -> None:
        """Give up on this link (confirms overdue): fail what waits, drop the socket.

        No closing handshake: a broker that does not confirm would not answer it either.
        """
        self._fail(reason)
        self.abort_connection()

    def close_connection(self) -> None:
        """Start pika's graceful close (channel, then connection); ``gone`` resolves after."""
        connection = self.connection
        if connection is None:
            resolve(self.gone, None)
            return
        if connection.is_closing or connection.is_closed:
            return
        # Already closing underneath (the socket just broke): on_close follows anyway.
        with contextlib.suppress(pika.exceptions.AMQPError):
            connection.close()

    def abort_connection(self) -> None:
        """Drop the socket at once; pika then reports the connection closed (``gone``)."""
        connection = self.connection
        if connection is None:
            resolve(self.gone, None)
            return
        if connection.is_closed:
            return
        # pika has no public abort. This is how it drops a stream itself (heartbeat timeout,
        # pika 1.x Connection._terminate_stream): abort the transport, then report the given
        # error to the close callbacks.
        with contextlib.suppress(Exception):
            connection._terminate_stream(  # noqa: SLF001 - no public abort
                pika.exceptions.StreamLostError("dropped by outboxer")
            )

    async def close(self, grace: float) -> None:
        """Close gracefully, or abort after ``grace`` seconds; the socket is closed on return."""
        if self.failure is None:
            self.failure = "publisher closed"  # a deliberate close: no warning
        self._fail("publisher closed")
        self.close_connection()
        try:
            async with asyncio.timeout(grace):
                await asyncio.shield(self.gone)
        except TimeoutError:
            self.abort_connection()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(self.gone)


class RabbitMQPublisher:
    """Publishes to a RabbitMQ topic exchange with publisher confirms (see the module docs).

    The publisher owns its connection: ``async with`` opens it (raising
    :class:`~outboxer.errors.BrokerUnavailable` when the broker cannot be reached) and closes
    it; after a failure the next :meth:`publish` reconnects.

    Args:
        settings: Broker address, exchange and tuning; see :class:`RabbitMQSettings`.
        ssl_context: TLS context for ``amqps://`` when the system trust store is not enough
            (private CA, client certificates).
    """

    #: One channel per connection, and a channel keeps publish order: the relay may pipeline
    #: a key's run in one call.
    keeps_key_order = True

    def __init__(
        self,
        settings: RabbitMQSettings | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.settings = settings or RabbitMQSettings()
        self._ssl_context = ssl_context
        self._link: _Link | None = None
        self._connecting: asyncio.Task[_Link] | None = None
        self._closed = False

    @classmethod
    def from_url(cls, url: str) -> RabbitMQPublisher:
        """``amqp://user:pass@host:port/vhost?exchange=NAME`` (see the module docstring)."""
        return cls(RabbitMQSettings.from_url(url))

    def __repr__(self) -> str:
        return f"RabbitMQPublisher({self.settings.safe_url()}, exchange={self.settings.exchange!r})"

    async def __aenter__(self) -> RabbitMQPublisher:
        self._closed = False
        await self._usable_link()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection; messages still awaiting a confirm report BrokerUnavailable."""
        self._closed = True
        connecting, self._connecting = self._connecting, None
        if connecting is not None and not connecting.done():
            connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError, PublishError):
                await connecting
        link, self._link = self._link, None
        if link is not None:
            await link.close(_CLOSE_GRACE)

    # -- connecting ------------------------------------------------------------------------

    async def _usable_link(self) -> _Link:
        link = self._link
        if link is not None and link.usable:
            return link
        if self._closed:
            raise BrokerUnavailable("the RabbitMQ publisher is closed")
        if self._connecting is None:
            # One attempt shared by every call that finds the connection down meanwhile.
            self._connecting = asyncio.ensure_future(self._connect())
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> _Link:
        settings = self.settings
        old, self._link = self._link, None
        try:
            if old is not None:
                await old.close(_CLOSE_GRACE)
            link = _Link(settings, asyncio.get_running_loop())
            try:
                async with asyncio.timeout(settings.connect_timeout):
                    await link.open(settings.connection_parameters(self._ssl_context))
            except TimeoutError:
                await link.close(_CLOSE_GRACE)
                raise BrokerUnavailable(
                    f"{settings.safe_url()}: no answer within {settings.connect_timeout:g}s"
                ) from None
            except BrokerUnavailable:
                await asyncio.shield(link.close(_CLOSE_GRACE))
                raise
            except Exception as exc:  # anything else pika raises while connecting
                await asyncio.shield(link.close(_CLOSE_GRACE))
                raise BrokerUnavailable(f"{settings.safe_url()}: {describe(exc)}") from exc
            except BaseException:  # cancelled (the publisher is closing)
                await asyncio.shield(link.close(_CLOSE_GRACE))
                raise
            self._link = link
            log.info("connected to %s, exchange %r", settings.safe_url(), settings.exchange)
            return link
        finally:
            self._connecting = None

    # -- publishing ------------------------------------------------------------------------

    def _refusal(self, message: Message) -> PermanentPublishError | None:
        """Why RabbitMQ could never take this message, checked before anything is written."""
        for what, text in (
            ("topic (routing key)", message.topic),
            ("id", message.id),
            ("type", message.type or ""),
            ("content type", message.content_type),
        ):
            if _too_long(text):
                return PermanentPublishError(f"{what} is longer than AMQP's 255 bytes")
        for name in message.headers:
            if _too_long(name):
                return PermanentPublishError(f"header name {name[:40]!r}... exceeds 255 bytes")
        if len(message.payload) > self.settings.max_message_size:
            return PermanentPublishError(
                f"payload of {len(message.payload)} bytes exceeds max_message_size="
                f"{self.settings.max_message_size}"
            )
        return None

    async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
        """Publish a batch; one result per message, ``None`` only once RabbitMQ confirmed it.

        Raises:
            BrokerUnavailable: no connection could be made; nothing was written.
        """
        if not messages:
            return []
        link = await self._usable_link()
        loop = asyncio.get_running_loop()
        # Every entry starts as "not confirmed"; only a confirm callback ever writes None.
        pending = BrokerUnavailable("not confirmed")
        results: list[PublishError | None] = [pending] * len(messages)
        batch = _Batch(results, loop.create_future())
        try:
            async with asyncio.timeout(self.settings.confirm_timeout):
                for index, message in enumerate(messages):
                    refusal = self._refusal(message)
                    if refusal is not None:
                        results[index] = refusal
                        continue
                    if len(link.unconfirmed) >= self.settings.max_unconfirmed:
                        link.flush()
                        await link.wait_for_room()
                    if link.failure is not None:
                        break
                    try:
                        link.publish(message, batch, index)
                    except _UNENCODABLE as exc:  # raised while marshalling: nothing was sent
                        results[index] = PermanentPublishError(
                            f"cannot encode as AMQP: {describe(exc)}"
                        )
                    except pika.exceptions.AMQPError as exc:  # channel closed under us
                        link.abandon(f"publish failed: {describe(exc)}")
                        break
                link.flush()
                batch.seal()
                await batch.done
        except TimeoutError:
            link.abandon(
                f"no publisher confirm within confirm_timeout={self.settings.confirm_timeout:g}s"
            )
        if link.failure is not None:
            error = BrokerUnavailable(f"{self.settings.safe_url()}: {link.failure}")
            for index, result in enumerate(results):
                if result is pending:
                    results[index] = error
        return results
