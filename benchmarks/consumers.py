"""Consumer throughput with the inbox versus without, per broker.

For every broker, in one run and on the same messages (``COUNT`` messages of ~120 bytes, 1,000
keys, published beforehand through outboxer's publisher of that broker):

- **without inbox**: the broker consumer adapter hands each batch straight to the handler
  (decoded through the registry, no database): the adapter's and the broker's ceiling;
- **inbox**: the same adapter feeding an :class:`~outboxer.inbox.Inbox` on PostgreSQL
  (synchronous commit) with its defaults: ``concurrency`` chunks of a batch (different keys)
  at most (as many as the handlers' time pays for: one for these), one transaction per chunk
  (one round trip records the chunk's inbox rows, one commits), acknowledgement after commit.
  Twice: with a handler that takes the context (it could write through ``ctx.connection``, so
  it runs in a savepoint; one that runs no statement keeps it for the next: one round trip per
  chunk) and with one that does not (no savepoint);
- **inbox, transaction per message** (``--transaction-per-message``).

The handlers do nothing, so the figures show what the inbox costs, not what a handler costs.
Timed from the first delivered batch to the last stored one (group joins and connects are not
counted). Reported: msg/s each way, inbox / without, the mean time a batch spends in the
inbox (ms; without the inbox a whole batch cycle takes ``without_ms_per_batch``), and the
consumer process's CPU per message over the same span (``…_cpu_us``, µs, all its threads; not
PostgreSQL's or the broker's): on a machine others share, throughput moves with their load far
more than CPU per message does, and with one core to itself the consumer's event loop is what
limits it.

The script runs against whatever ``outboxer`` is on the path, so the same file measures an
older tree too (``PYTHONPATH=<old tree>/src:. python -m benchmarks.consumers``): run old and new
alternately and compare the ratios, never absolute figures of different runs.

Every adapter runs with its default settings, as a user gets them: its default batch size
(``batch_size`` in the JSON, per broker) unless ``OUTBOXER_BENCH_BATCH`` sets one for all;
``mean_batch`` is how many messages a delivered batch held on average. ``OUTBOXER_BENCH_COUNT``
changes the 10,000 messages. Results: ``consumers.json`` for all four brokers, else
``consumers_<brokers>.json``; with ``OUTBOXER_BENCH_BATCH`` set, ``…_batch_<n>.json``.

Run: ``.venv/bin/python -m benchmarks.consumers [kafka rabbitmq nats redis]``
(e.g. ``OUTBOXER_BENCH_BATCH=500 .venv/bin/python -m benchmarks.consumers kafka``)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NamedTuple

import outboxer
from benchmarks.common import PAYLOAD, PG_URL, fresh_schema, save
from outboxer.brokers import consumer_from_url, publisher_from_url
from outboxer.config import TableNames
from outboxer.inbox import HandlerContext, HandlerRegistry, Inbox, InboxSettings
from outboxer.message import Message
from outboxer.outbox import Outbox
from outboxer.stores.postgres import PostgresStore

COUNT = int(os.environ.get("OUTBOXER_BENCH_COUNT", "10000"))
KEYS = 1_000
#: ``None``: each adapter's default batch size.
BATCH = int(os.environ["OUTBOXER_BENCH_BATCH"]) if os.environ.get("OUTBOXER_BENCH_BATCH") else None
CONCURRENCY = 8
ALL = ("kafka", "rabbitmq", "nats", "redis")
ROUNDS = 2  # best of

registry = HandlerRegistry()  # a handler that could write through ctx.connection
plain_registry = HandlerRegistry()  # one that cannot (no context)


@registry.handler("OrderCreated")
async def on_order(order: dict[str, Any], ctx: HandlerContext) -> None:
    return None


@plain_registry.handler("OrderCreated")
async def on_order_plain(order: dict[str, Any]) -> None:
    return None


def messages(topic: str) -> list[Message]:
    outbox = Outbox()
    result = []
    for n in range(COUNT):
        row = outbox.row(topic, {**PAYLOAD, "order_id": n}, key=str(n % KEYS), type="OrderCreated")
        result.append(
            Message(id=row.id, topic=topic, payload=row.payload, key=row.key, type=row.type)
        )
    return result


class Broker:
    """How to get a fresh topic with COUNT messages that a new consumer name will read."""

    def __init__(self, url: str, publish_url: str) -> None:
        self.url = url
        self.publish_url = publish_url

    async def prepare(self, topic: str, name: str) -> None:
        return None

    async def cleanup(self, topic: str, name: str) -> None:
        return None


class Kafka(Broker):
    async def prepare(self, topic: str, name: str) -> None:
        from tests.tansu import create_topic

        bootstrap = self.publish_url.removeprefix("kafka://")
        await asyncio.to_thread(create_topic, bootstrap, topic, 3)


class RabbitMQ(Broker):
    async def prepare(self, topic: str, name: str) -> None:
        async with consumer_from_url(self.url, name=name, topics=[topic]):
            pass  # declares and binds the queue before anything is published

    async def cleanup(self, topic: str, name: str) -> None:
        import pika

        def delete() -> None:
            url = self.publish_url.partition("?")[0]
            connection = pika.BlockingConnection(pika.URLParameters(url))
            try:
                connection.channel().queue_delete(name)
            finally:
                connection.close()

        await asyncio.to_thread(delete)


class Nats(Broker):
    async def prepare(self, topic: str, name: str) -> None:
        import nats

        client = await nats.connect(self.publish_url)
        try:
            await client.jetstream().add_stream(name=f"BENCH_{name}", subjects=[topic])
        finally:
            await client.close()

    async def cleanup(self, topic: str, name: str) -> None:
        import nats

        client = await nats.connect(self.publish_url)
        try:
            await client.jetstream().delete_stream(f"BENCH_{name}")
        finally:
            await client.close()


class Redis(Broker):
    async def cleanup(self, topic: str, name: str) -> None:
        from redis.asyncio import Redis as Client

        client = Client.from_url(self.publish_url)
        try:
            await client.delete(topic)
        finally:
            await client.aclose()


@contextlib.asynccontextmanager
async def brokers(names: Sequence[str]) -> AsyncIterator[dict[str, Broker]]:
    found: dict[str, Broker] = {}
    tansu = None
    if "kafka" in names:
        from tests.tansu import TansuBroker

        tansu = await asyncio.to_thread(TansuBroker().start)
        found["kafka"] = Kafka(f"kafka://{tansu.bootstrap}", f"kafka://{tansu.bootstrap}")
    exchange = f"bench_{uuid.uuid4().hex[:8]}"
    amqp = "amqp://guest:guest@127.0.0.1:5672/"
    if "rabbitmq" in names:
        found["rabbitmq"] = RabbitMQ(f"{amqp}?exchange={exchange}", f"{amqp}?exchange={exchange}")
    if "nats" in names:
        found["nats"] = Nats("nats://127.0.0.1:4222", "nats://127.0.0.1:4222")
    if "redis" in names:
        found["redis"] = Redis("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0")
    try:
        yield found
    finally:
        if tansu is not None:
            tansu.stop()


async def publish(broker: Broker, batch: list[Message]) -> None:
    async with publisher_from_url(broker.publish_url) as publisher:
        for start in range(0, len(batch), 500):
            chunk = batch[start : start + 500]
            results = await publisher.publish(chunk)
            if any(r is not None for r in results):
                raise RuntimeError(f"publishing failed: {next(r for r in results if r)}")


class Run(NamedTuple):
    """One consumption: msg/s, mean ms a batch spent in ``deliver`` (what the inbox adds to
    each batch), the adapter's batch size, the mean size of a delivered batch, and the
    consumer process's CPU per message (µs, every thread: ``time.process_time``)."""

    rate: float
    ms_in_deliver: float
    batch_size: int
    mean_batch: float
    cpu_us: float


async def timed_consume(
    broker: Broker, topic: str, name: str, deliver: Callable[[Sequence[Message]], Awaitable[Any]]
) -> Run:
    """From the first delivered batch until COUNT messages went through ``deliver``."""
    stop = asyncio.Event()
    seen = batches = 0
    first = last = in_deliver = cpu_first = cpu_last = 0.0

    async def counting(batch: Sequence[Message]) -> None:
        nonlocal seen, batches, first, last, in_deliver, cpu_first, cpu_last
        start = time.perf_counter()
        if not first:
            first, cpu_first = start, time.process_time()
        await deliver(batch)
        last, cpu_last = time.perf_counter(), time.process_time()
        seen += len(batch)
        batches += 1
        in_deliver += last - start
        if seen >= COUNT:
            stop.set()

    options = {} if BATCH is None else {"batch_size": BATCH}
    adapter = consumer_from_url(broker.url, name=name, topics=[topic], **options)
    batch_size = getattr(getattr(adapter, "settings", None), "batch_size", BATCH or 0)
    async with adapter:
        runner = asyncio.create_task(adapter.run(counting, stop))
        try:
            await asyncio.wait_for(stop.wait(), 300)
        finally:
            stop.set()
            await asyncio.wait_for(runner, 30)
    if seen < COUNT:
        raise RuntimeError(f"consumed {seen} of {COUNT}")
    return Run(
        seen / (last - first),
        in_deliver / batches * 1000,
        batch_size,
        seen / batches,
        (cpu_last - cpu_first) / seen * 1e6,
    )


async def without_inbox(batch: Sequence[Message]) -> None:
    for message in batch:
        context = HandlerContext(message)
        for handler in registry.handlers_for(message):
            await registry.call(handler, message, context)


#: mode → (registry, one transaction per chunk); ``None``: without inbox.
MODES: dict[str, tuple[HandlerRegistry, bool] | None] = {
    "without": None,
    "inbox": (registry, True),
    "inbox_no_context": (plain_registry, True),
    "inbox_per_message": (registry, False),
}


async def one_round(broker: Broker, inbox_store: PostgresStore) -> dict[str, Run]:
    """Every mode, one after the other."""
    rates = {}
    for mode, inbox_mode in MODES.items():
        name = f"bench_{uuid.uuid4().hex[:10]}"
        topic = f"bench-{uuid.uuid4().hex[:10]}"
        await broker.prepare(topic, name)
        await publish(broker, messages(topic))
        try:
            if inbox_mode is None:
                rates[mode] = await timed_consume(broker, topic, name, without_inbox)
            else:
                handlers, batch_transactions = inbox_mode
                settings = InboxSettings(
                    consumer=name,
                    concurrency=CONCURRENCY,
                    batch_transactions=batch_transactions,
                    sweep_interval=0,
                )
                inbox = Inbox(inbox_store, handlers, settings)
                rates[mode] = await timed_consume(broker, topic, name, inbox.receive_batch)
        finally:
            await broker.cleanup(topic, name)
    return rates


async def main(names: list[str]) -> list[dict[str, Any]]:
    logging.basicConfig(level=logging.WARNING)
    print(f"outboxer from {outboxer.__file__}", flush=True)
    rows = []
    async with (
        fresh_schema(f"bench_consumers_{uuid.uuid4().hex[:6]}") as schema,
        brokers(names) as found,
    ):
        async with PostgresStore(
            PG_URL, TableNames(schema=schema), max_connections=CONCURRENCY + 2
        ) as store:
            await store.migrate()
            for name, broker in found.items():
                best = dict.fromkeys(MODES, Run(0.0, 0.0, 0, 0.0, 0.0))
                for _ in range(ROUNDS):
                    rates = await one_round(broker, store)
                    best = {mode: max(best[mode], rates[mode]) for mode in MODES}
                without = best["without"]
                row: dict[str, Any] = {
                    "broker": name,
                    "batch_size": without.batch_size,
                    "mean_batch": round(without.mean_batch, 1),
                    "without_inbox": round(without.rate),
                    "without_ms_per_batch": round(without.mean_batch / without.rate * 1000, 2),
                    "without_cpu_us": round(without.cpu_us, 1),
                }
                for mode in list(MODES)[1:]:
                    run = best[mode]
                    row[mode] = round(run.rate)
                    row[f"{mode}_over_without"] = round(run.rate / without.rate, 2)
                    row[f"{mode}_ms_in_deliver"] = round(run.ms_in_deliver, 2)
                    row[f"{mode}_mean_batch"] = round(run.mean_batch, 1)
                    row[f"{mode}_cpu_us"] = round(run.cpu_us, 1)
                print(row, flush=True)
                rows.append(row)
    save(
        "_".join(
            ["consumers"]
            + ([] if sorted(names) == sorted(ALL) else list(names))
            + ([] if BATCH is None else [f"batch_{BATCH}"])
        ),
        {
            "count": COUNT,
            "keys": KEYS,
            "batch_size": BATCH or "adapter default",
            "concurrency": CONCURRENCY,
            "rounds": ROUNDS,
            "store": "PostgreSQL (asyncpg), synchronous commit",
            "rows": rows,
        },
    )
    return rows


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] or list(ALL)))
