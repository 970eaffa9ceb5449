"""Raw RabbitMQ ceiling versus the outboxer RabbitMQ publisher, and the client comparison.

``raw_ceiling`` publishes with pika's asyncio adapter alone (no database, no outboxer code): the
same exchange, routing key, properties and ``mandatory`` flag the adapter uses, persistent, on
one channel in confirm mode, with at most ``WINDOW`` = 2,000 messages unconfirmed (the most the
relay has in flight: 4 batches of 500), every confirm counted, frames written one buffer per
window (pika's fastest path, see ``raw_ceiling``). ``adapter_rate`` sends the same messages through
:class:`~outboxer.brokers.rabbitmq.RabbitMQPublisher` with batches of 500, up to 4 batches
concurrently, as the relay does.

The messages are routed to one durable queue bound with ``#``, so RabbitMQ writes every one to
disk before it confirms it (the realistic case: with no queue bound, an unroutable message is
confirmed at once and the figure means nothing). The queue is purged between runs and deleted
at the end; runs are interleaved and the best of each is kept, so neither profits from warm-up.

``--compare`` also measures pika's plain ``basic_publish``, pika with all 20,000 messages in
flight (no window), and the other asyncio clients on the same setup, each at its best shape
found here: aio-pika (``exchange.publish`` with confirms, 500 concurrent) and
aiormq directly (``basic_publish`` gathered in batches of 500, 4 batches in flight). That
comparison is why the adapter uses pika.

Each line also shows the client CPU per message (user + system time of this process): msg/s
moves a lot when other work shares the machine, the CPU cost hardly does.

Run: ``.venv/bin/python benchmarks/raw_rabbitmq.py [--compare] [amqp://guest:guest@127.0.0.1/]``
(the URL's ``?exchange=`` names the exchange; default ``outboxer-bench``).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import pika
import pika.frame
import pika.spec
from pika.adapters.asyncio_connection import AsyncioConnection

from benchmarks.common import build_messages
from outboxer.brokers.rabbitmq.publisher import RabbitMQPublisher
from outboxer.message import Message

CHUNK = 500  # the relay's batch size
BATCHES = 4  # the relay's batches in flight
WINDOW = CHUNK * BATCHES  # raw: unconfirmed messages in flight, the relay's maximum
QUEUE = "outboxer-bench"
DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F?exchange=outboxer-bench"


def _split(url: str) -> tuple[str, str]:
    """``(url without query, exchange)``: the raw clients get a plain AMQP URL."""
    parts = urlsplit(url)
    exchange = parse_qs(parts.query).get("exchange", ["outbox"])[-1]
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", "", "")), exchange


def _timestamp(message: Message) -> int:
    return int(message.created_at.timestamp())


def _headers(message: Message) -> dict[str, str]:
    headers = dict(message.headers)
    if message.key is not None:
        headers["x-outbox-key"] = message.key
    return headers


# -- pika (the adapter's client) -------------------------------------------------------------


async def _pika_channel(url: str) -> tuple[Any, Any]:
    """An open connection and a confirm-mode channel, via callbacks turned into futures."""
    loop = asyncio.get_running_loop()
    opened: asyncio.Future[Any] = loop.create_future()
    connection = AsyncioConnection(
        pika.URLParameters(url),
        on_open_callback=opened.set_result,
        on_open_error_callback=lambda _c, exc: opened.set_exception(RuntimeError(exc)),
        custom_ioloop=loop,
    )
    await opened
    ready: asyncio.Future[Any] = loop.create_future()
    connection.channel(on_open_callback=ready.set_result)
    channel = await ready
    return connection, channel


async def _pika_close(connection: Any) -> None:
    closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    connection.add_on_close_callback(lambda _c, _e: closed.set_result(None))
    connection.close()
    await closed


async def raw_ceiling(url: str, messages: list[Message], window: int = WINDOW) -> float:
    """pika alone, at its fastest: frames marshalled with pika and written once per window.

    Persistent, mandatory, at most ``window`` unconfirmed; every confirm counted; msg/s.
    ``basic_publish`` would hand each frame to the socket separately (one ``send`` per frame),
    so the ceiling writes pika-marshalled frames through pika's own output path in one buffer,
    as the adapter does (:func:`raw_basic_publish` measures the plain way).
    """
    return await _raw_pika(url, messages, window, coalesce=True)


async def raw_basic_publish(url: str, messages: list[Message], window: int = WINDOW) -> float:
    """pika alone with ``channel.basic_publish`` per message; msg/s."""
    return await _raw_pika(url, messages, window, coalesce=False)


async def raw_unbounded(url: str, messages: list[Message]) -> float:
    """The ceiling with every message in flight at once (no window at all); msg/s."""
    return await _raw_pika(url, messages, len(messages), coalesce=True)


async def _raw_pika(url: str, messages: list[Message], window: int, *, coalesce: bool) -> float:
    plain, exchange = _split(url)
    connection, channel = await _pika_channel(plain)
    try:
        loop = asyncio.get_running_loop()
        confirmed = 0
        room = asyncio.Event()
        selected: asyncio.Future[Any] = loop.create_future()

        def on_confirm(frame: Any) -> None:
            nonlocal confirmed
            method = frame.method
            if isinstance(method, pika.spec.Basic.Nack):
                raise RuntimeError("nacked")
            confirmed = method.delivery_tag if method.multiple else confirmed + 1
            room.set()

        def on_return(*_: object) -> None:
            raise RuntimeError("unroutable: is the benchmark queue bound?")

        channel.add_on_return_callback(on_return)
        channel.confirm_delivery(on_confirm, callback=selected.set_result)
        await selected
        number = channel.channel_number
        body_max = connection.params.frame_max - 8
        queued: list[bytes] = []

        def flush() -> None:
            if queued:
                connection._output_marshaled_frames([b"".join(queued)])
                queued.clear()

        started = time.perf_counter()
        sent = 0
        for m in messages:
            if sent - confirmed >= window:
                flush()
                while sent - confirmed >= window:
                    room.clear()
                    await room.wait()
            properties = pika.BasicProperties(
                content_type=m.content_type,
                headers=_headers(m),
                delivery_mode=2,
                message_id=m.id,
                timestamp=_timestamp(m),
                type=m.type,
            )
            if coalesce:
                publish = pika.spec.Basic.Publish(
                    exchange=exchange, routing_key=m.topic, mandatory=True
                )
                queued.append(pika.frame.Method(number, publish).marshal())
                queued.append(pika.frame.Header(number, len(m.payload), properties).marshal())
                queued.extend(
                    pika.frame.Body(number, m.payload[i : i + body_max]).marshal()
                    for i in range(0, len(m.payload), body_max)
                )
            else:
                channel.basic_publish(exchange, m.topic, m.payload, properties, mandatory=True)
            sent += 1
        flush()
        while confirmed < sent:
            room.clear()
            await room.wait()
        return len(messages) / (time.perf_counter() - started)
    finally:
        await _pika_close(connection)


async def adapter_rate(url: str, messages: list[Message]) -> float:
    """RabbitMQPublisher.publish with batches of 500, up to 4 concurrently; msg/s."""
    async with RabbitMQPublisher.from_url(url) as publisher:
        limit = asyncio.Semaphore(BATCHES)

        async def one(chunk: Sequence[Message]) -> None:
            async with limit:
                results = await publisher.publish(chunk)
            if any(r is not None for r in results):
                raise RuntimeError(f"publish failed: {next(r for r in results if r)}")

        started = time.perf_counter()
        await asyncio.gather(
            *(one(messages[i : i + CHUNK]) for i in range(0, len(messages), CHUNK))
        )
        return len(messages) / (time.perf_counter() - started)


# -- the other clients, for --compare ----------------------------------------------------------


async def aio_pika_rate(url: str, messages: list[Message], concurrency: int = 500) -> float:
    """aio-pika with publisher confirms, ``concurrency`` publishes awaited at once; msg/s."""
    import aio_pika

    plain, exchange_name = _split(url)
    connection = await aio_pika.connect(plain)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(exchange_name, ensure=False)
        limit = asyncio.Semaphore(concurrency)

        async def one(m: Message) -> None:
            body = aio_pika.Message(
                m.payload,
                content_type=m.content_type,
                headers=_headers(m),  # type: ignore[arg-type]
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                message_id=m.id,
                timestamp=m.created_at,
                type=m.type,
            )
            async with limit:
                await exchange.publish(body, routing_key=m.topic, mandatory=True)

        started = time.perf_counter()
        await asyncio.gather(*(one(m) for m in messages))
        return len(messages) / (time.perf_counter() - started)
    finally:
        await connection.close()


async def aiormq_rate(url: str, messages: list[Message]) -> float:
    """aiormq directly: basic_publish gathered per batch of 500, 4 batches in flight; msg/s."""
    import aiormq
    from pamqp.commands import Basic

    plain, exchange = _split(url)
    connection = await aiormq.connect(plain)
    try:
        channel = await connection.channel(publisher_confirms=True)
        limit = asyncio.Semaphore(BATCHES)

        async def batch(chunk: Sequence[Message]) -> None:
            async with limit:
                confirms = await asyncio.gather(
                    *(
                        channel.basic_publish(
                            m.payload,
                            exchange=exchange,
                            routing_key=m.topic,
                            mandatory=True,
                            wait=False,  # measured faster than awaiting each write's drain
                            properties=Basic.Properties(
                                content_type=m.content_type,
                                headers=_headers(m),  # type: ignore[arg-type]
                                delivery_mode=2,
                                message_id=m.id,
                                timestamp=m.created_at,
                                message_type=m.type,
                            ),
                        )
                        for m in chunk
                    )
                )
            if not all(isinstance(c, Basic.Ack) for c in confirms):
                raise RuntimeError("not confirmed")

        started = time.perf_counter()
        await asyncio.gather(
            *(batch(messages[i : i + CHUNK]) for i in range(0, len(messages), CHUNK))
        )
        return len(messages) / (time.perf_counter() - started)
    finally:
        await connection.close()


# -- setup and main ----------------------------------------------------------------------------


async def _admin(url: str, action: Callable[[Any, str], Awaitable[None]]) -> None:
    """Run ``action(channel, exchange)`` on a short-lived pika channel."""
    plain, exchange = _split(url)
    connection, channel = await _pika_channel(plain)
    try:
        await action(channel, exchange)
    finally:
        await _pika_close(connection)


def _call(method: Callable[..., object], **kwargs: Any) -> Awaitable[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    method(callback=future.set_result, **kwargs)
    return future


async def _prepare(channel: Any, exchange: str) -> None:
    await _call(channel.exchange_declare, exchange=exchange, exchange_type="topic", durable=True)
    await _call(channel.queue_declare, queue=QUEUE, durable=True)
    await _call(channel.queue_purge, queue=QUEUE)
    await _call(channel.queue_bind, queue=QUEUE, exchange=exchange, routing_key="#")


async def _purge(channel: Any, exchange: str) -> None:
    await _call(channel.queue_purge, queue=QUEUE)


async def _remove(channel: Any, exchange: str) -> None:
    await _call(channel.queue_delete, queue=QUEUE)
    await _call(channel.exchange_delete, exchange=exchange)


async def main(url: str, *, compare: bool, count: int = 20_000, rounds: int = 5) -> None:
    topic = "orders.created"
    messages = build_messages(count, topic)
    runs: dict[str, Callable[[str, list[Message]], Awaitable[float]]] = {
        "raw pika ceiling": raw_ceiling,
        "RabbitMQPublisher": adapter_rate,
    }
    if compare:
        runs["raw pika, basic_publish"] = raw_basic_publish
        runs["raw pika, no window"] = raw_unbounded
        runs["raw aio-pika, 500 concurrent"] = aio_pika_rate
        runs["raw aiormq, 4 x 500 gathered"] = aiormq_rate
    figures: dict[str, list[float]] = {name: [] for name in runs}
    # Client CPU per message (user + system of this process): unlike msg/s it barely moves when
    # other work shares the machine, so it shows where the client itself spends time.
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    await _admin(url, _prepare)
    try:
        # Warm-up outside the figures: the broker's first run on a fresh queue is slower.
        await raw_ceiling(url, messages[:5000])
        await adapter_rate(url, messages[:5000])
        await _admin(url, _purge)
        for _ in range(rounds):
            for name, run in runs.items():
                cpu_before = time.process_time()
                figures[name].append(await run(url, messages))
                cpu[name].append((time.process_time() - cpu_before) / count * 1e6)
                await _admin(url, _purge)
    finally:
        await _admin(url, _remove)
    size = sum(len(m.payload) for m in messages) / len(messages)
    print(f"{count} messages, {size:.0f}-byte payloads, persistent, to a durable queue")
    for name, rates in figures.items():
        spread = ", ".join(f"{r:,.0f}" for r in rates)
        print(
            f"{name:30s}: {max(rates):8,.0f} msg/s best (median {statistics.median(rates):,.0f};"
            f" runs {spread}); client CPU {statistics.median(cpu[name]):.1f} us/msg"
        )
    raw, adapter = figures["raw pika ceiling"], figures["RabbitMQPublisher"]
    print(
        f"{'ratio adapter / raw':30s}: {max(adapter) / max(raw):8.2f} best to best"
        f" ({statistics.median(adapter) / statistics.median(raw):.2f} median to median)"
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    compare = "--compare" in args
    rest = [a for a in args if a != "--compare"]
    asyncio.run(main(rest[0] if rest else DEFAULT_URL, compare=compare))
