"""RabbitMQ consumer: a durable queue bound to the outbox exchange, manual acks, prefetch.

On connect the adapter declares the publisher's exchange (topic, durable), a durable queue named
after the consumer, and one binding per topic (a binding key: ``orders.*`` and ``#`` patterns
work). It consumes with manual acknowledgements and a prefetch window. A batch is what has
arrived (up to ``batch_size``; the next is gathered while the inbox stores the previous one);
after the inbox committed every message of it and the batch before it was acknowledged, one
``basic.ack(multiple=True)`` for the batch's last delivery tag acknowledges it. A connection lost
before that makes RabbitMQ requeue the unacknowledged messages; the inbox drops the ones that
were handled. Same client as the publisher (pika's asyncio connection, see
:mod:`.publisher` for why).

Messages are decoded from the publisher's wire format (``message_id``, ``type``, ``timestamp``,
``content_type``, key in ``x-outbox-key``) by :func:`.wire.decode`.

URL: the publisher's ``amqp://`` URL (credentials, vhost, ``exchange``, timeouts, ``heartbeat``)
plus these consumer options, all optional:

==============  =====================  ====================================================
option          default                meaning
==============  =====================  ====================================================
``prefetch``    2 × batch size         unacknowledged messages RabbitMQ sends ahead
``queue``       the consumer name      queue to declare and consume
``queue_type``  ``classic``            ``classic`` or ``quorum`` (replicated; recommended
                                       on a cluster); fixed when the queue is first declared
==============  =====================  ====================================================

When RabbitMQ is unreachable the adapter retries with a backoff (1 s doubling to 30 s) and
logs one line per failed attempt. A consumer RabbitMQ cancels (its queue was deleted) counts as
a lost connection: the adapter reconnects and declares the queue and its bindings again
(messages published while the queue did not exist were dropped by RabbitMQ).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pika  # type: ignore[import-untyped]
import pika.exceptions  # type: ignore[import-untyped]
from pika.adapters.asyncio_connection import AsyncioConnection  # type: ignore[import-untyped]

from outboxer.brokers.rabbitmq._pika import describe, resolve
from outboxer.brokers.rabbitmq.settings import RabbitMQConsumerSettings
from outboxer.brokers.rabbitmq.topology import exchange_declaration, queue_declaration
from outboxer.brokers.rabbitmq.wire import decode
from outboxer.errors import BrokerUnavailable
from outboxer.inbox.consumer import Deliver, Deliveries

__all__ = ["RabbitMQConsumer"]

log = logging.getLogger("outboxer.consumer.rabbitmq")

_CLOSE_GRACE = 2.0


@dataclass(frozen=True, slots=True)
class _Delivery:
    tag: int
    routing_key: str
    properties: Any
    body: bytes


class _Link:
    """One connection and channel, consuming into an asyncio queue (pika calls back on the
    event loop, so no locks are needed)."""

    def __init__(self, settings: RabbitMQConsumerSettings, loop: asyncio.AbstractEventLoop):
        self.settings = settings
        self.loop = loop
        self.connection: Any = None
        self.channel: Any = None
        self.deliveries: asyncio.Queue[_Delivery] = asyncio.Queue()
        self.failure: str | None = None
        self.lost: asyncio.Future[None] = loop.create_future()
        self._step: asyncio.Future[Any] | None = None

    @property
    def usable(self) -> bool:
        return self.failure is None and self.channel is not None

    async def open(self) -> None:
        settings = self.settings
        opened: asyncio.Future[Any] = self.loop.create_future()
        self._step = opened
        self.connection = AsyncioConnection(
            settings.connection.connection_parameters(),
            on_open_callback=lambda conn: resolve(opened, conn),
            on_open_error_callback=lambda conn, exc: self._fail(describe(exc)),
            on_close_callback=lambda conn, exc: self._fail(f"connection closed: {describe(exc)}"),
            custom_ioloop=self.loop,
        )
        await opened
        channel = await self._rpc(lambda done: self.connection.channel(on_open_callback=done))
        channel.add_on_close_callback(
            lambda ch, exc: self._fail(f"channel closed: {describe(exc)}")
        )
        await self._rpc(
            lambda done: channel.basic_qos(prefetch_count=settings.window, callback=done)
        )
        exchange = settings.connection.exchange
        await self._rpc(
            lambda done: channel.exchange_declare(
                **exchange_declaration(settings.connection), callback=done
            )
        )
        await self._rpc(
            lambda done: channel.queue_declare(**queue_declaration(settings), callback=done)
        )
        for topic in settings.topics:

            def bind(done: Callable[[Any], None], topic: str = topic) -> object:
                return channel.queue_bind(
                    queue=settings.queue, exchange=exchange, routing_key=topic, callback=done
                )

            await self._rpc(bind)
        # RabbitMQ cancels a consumer whose queue is deleted (or whose quorum queue leader
        # moves) with basic.cancel; the channel stays open and no delivery would ever come
        # again. Lose the link instead: the adapter reconnects and declares the queue again.
        channel.add_on_cancel_callback(
            lambda frame: self._fail("RabbitMQ cancelled the consumer (queue deleted?)")
        )
        channel.basic_consume(settings.queue, self._on_message, auto_ack=False)
        self._step = None
        self.channel = channel

    async def _rpc(self, start: Callable[[Callable[[Any], None]], object]) -> Any:
        if self.failure is not None:
            raise BrokerUnavailable(f"{self.settings.connection.safe_url()}: {self.failure}")
        step: asyncio.Future[Any] = self.loop.create_future()
        self._step = step
        start(lambda result: resolve(step, result))
        return await step

    def _on_message(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        self.deliveries.put_nowait(
            _Delivery(method.delivery_tag, method.routing_key, properties, body)
        )

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
        if self._step is not None and not self._step.done():
            self._step.set_exception(
                BrokerUnavailable(f"{self.settings.connection.safe_url()}: {reason}")
            )
        self.channel = None
        resolve(self.lost, None)
        if self.connection is not None and not (
            self.connection.is_closing or self.connection.is_closed
        ):
            with contextlib.suppress(pika.exceptions.AMQPError):
                self.connection.close()

    async def next_batch(self, size: int, stop: asyncio.Event) -> list[_Delivery]:
        """What has arrived, up to ``size``; waits for the first one (empty on stop or loss)."""
        if self.deliveries.empty():
            getter = asyncio.ensure_future(self.deliveries.get())
            stopping: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
            waiting: set[asyncio.Future[Any]] = {getter, stopping, self.lost}
            try:
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
            if not getter.done():
                getter.cancel()
                return []
            batch = [getter.result()]
        else:
            batch = []
        while len(batch) < size and not self.deliveries.empty():
            batch.append(self.deliveries.get_nowait())
        return batch

    def ack(self, tag: int) -> bool:
        """Acknowledge every delivery up to ``tag``; False if the channel is gone (RabbitMQ
        then requeues them, and the inbox drops the ones already handled)."""
        if not self.usable:
            return False
        try:
            self.channel.basic_ack(delivery_tag=tag, multiple=True)
        except (pika.exceptions.AMQPError, AttributeError):
            return False
        return True

    async def close(self) -> None:
        if self.failure is None:
            self.failure = "consumer closed"
        connection = self.connection
        if connection is None or connection.is_closed:
            return
        if not connection.is_closing:
            with contextlib.suppress(pika.exceptions.AMQPError):
                connection.close()  # unacknowledged deliveries go back to the queue
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_CLOSE_GRACE):
                await asyncio.shield(self.lost)


class RabbitMQConsumer:
    """Consumes the consumer's durable queue with manual acknowledgements (module docs)."""

    def __init__(self, settings: RabbitMQConsumerSettings) -> None:
        self.settings = settings
        self._link: _Link | None = None
        self._failures = 0

    def __repr__(self) -> str:
        url, queue = self.settings.connection.safe_url(), self.settings.queue
        return f"RabbitMQConsumer({url}, queue={queue!r})"

    async def __aenter__(self) -> RabbitMQConsumer:
        try:
            await self._connect()
        except BrokerUnavailable as exc:  # run() keeps trying: a consumer may start first
            log.warning("%s; retrying", exc)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        link, self._link = self._link, None
        if link is not None:
            await link.close()

    async def _connect(self) -> _Link:
        if self._link is not None:
            await self._link.close()
            self._link = None
        link = _Link(self.settings, asyncio.get_running_loop())
        try:
            async with asyncio.timeout(self.settings.connection.connect_timeout):
                await link.open()
        except TimeoutError:
            await link.close()
            raise BrokerUnavailable(
                f"{self.settings.connection.safe_url()}: no answer within "
                f"{self.settings.connection.connect_timeout:g}s"
            ) from None
        except BaseException:
            await asyncio.shield(link.close())
            raise
        self._link = link
        log.info(
            "consuming queue %r (bound to %s on exchange %r) on %s",
            self.settings.queue,
            ", ".join(self.settings.topics),
            self.settings.connection.exchange,
            self.settings.connection.safe_url(),
        )
        return link

    async def run(self, deliver: Deliver, stop: asyncio.Event) -> None:
        async with Deliveries(deliver) as deliveries:
            await self._consume(deliveries, stop)

    async def _consume(self, deliveries: Deliveries, stop: asyncio.Event) -> None:
        while not stop.is_set():
            link = self._link
            if link is None or not link.usable:
                if link is not None:
                    log.warning("RabbitMQ consumer connection lost: %s", link.failure)
                try:
                    link = await self._connect()
                except BrokerUnavailable as exc:
                    self._failures += 1
                    delay = self.settings.reconnect.delay(self._failures)
                    log.warning("%s; reconnecting in %.0f s", exc, delay)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await stop.wait()
                    continue
                self._failures = 0
            batch = await link.next_batch(self.settings.batch_size, stop)
            if not batch:
                continue
            messages = [
                decode(
                    routing_key=d.routing_key,
                    body=d.body,
                    message_id=d.properties.message_id,
                    type=d.properties.type,
                    timestamp=d.properties.timestamp,
                    content_type=d.properties.content_type,
                    headers=d.properties.headers,
                )
                for d in batch
            ]
            if not await deliveries.submit(messages, functools.partial(_acknowledge, link, batch)):
                return  # not acknowledged: RabbitMQ requeues the batch when we disconnect


async def _acknowledge(link: _Link, batch: list[_Delivery]) -> None:
    # Deliveries arrive in tag order and every earlier batch is acknowledged (Deliveries keeps
    # that order): one multiple-ack for the last tag covers exactly this batch.
    if not link.ack(batch[-1].tag):
        log.warning(
            "could not acknowledge %d messages (connection lost): RabbitMQ delivers them again "
            "and the inbox drops them",
            len(batch),
        )
