"""Relay throughput per broker against the raw client ceiling and the database ceiling.

For every broker, in one run: the raw client publishing the same 20,000 messages with no
database (``benchmarks/raw_<broker>.py``), ``outboxer``'s relay draining a pre-filled PostgreSQL
outbox of 20,000 messages to that broker (ordered and unordered), and the database-side ceiling
(the relay with a publisher that acknowledges at once). Keys: 1,000 distinct values
(``OUTBOXER_BENCH_KEYS``: 200 keys are 100 messages per key, the conditions of the ordered
target; ``OUTBOXER_BENCH_COUNT`` changes the 20,000). Reported: msg/s, relay / raw client,
relay / database ceiling, ordered / unordered.

``--waves`` also measures ordered mode as it was before a key's run was pipelined in one call
(ADR 0008): the same publisher behind a wrapper that does not declare ``keeps_key_order``, so
the relay publishes runs in waves. Before and after then come from one run.

Run: ``.venv/bin/python -m benchmarks.brokers [--waves] [kafka rabbitmq nats redis http]``
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pika

from benchmarks import raw_http, raw_kafka, raw_nats, raw_rabbitmq, raw_redis
from benchmarks.common import PAYLOAD, PG_URL, NullPublisher, drain_rate, fill, fresh_schema, save
from outboxer.brokers import publisher_from_url
from outboxer.config import RelaySettings, TableNames
from outboxer.message import Message
from outboxer.outbox import Outbox
from outboxer.stores.postgres import PostgresStore

#: Messages per drain; env OUTBOXER_BENCH_COUNT (a drain of 20,000 takes under a second on a
#: fast broker: 100,000 with 1,000 keys gives steadier ratios, at five times the run time).
COUNT = int(os.environ.get("OUTBOXER_BENCH_COUNT", "20000"))
#: Distinct keys (per-key order costs more the fewer keys there are); env OUTBOXER_BENCH_KEYS.
KEYS = int(os.environ.get("OUTBOXER_BENCH_KEYS", "1000"))
ROUNDS = 2  # best of, interleaved


def messages(topic: str, count: int = COUNT) -> list[Message]:
    """The same messages ``fill`` writes, as the raw clients publish them."""
    outbox = Outbox()
    rows = [
        outbox.row(topic, {**PAYLOAD, "order_id": n}, key=n % KEYS, type="OrderCreated")
        for n in range(count)
    ]
    return [
        Message(
            id=r.id,
            topic=r.topic,
            payload=r.payload,
            key=r.key,
            type=r.type,
            content_type=r.content_type,
        )
        for r in rows
    ]


@contextlib.asynccontextmanager
async def kafka() -> AsyncIterator[tuple[str, Callable[[], str]]]:
    from tests.tansu import TansuBroker, create_topic

    broker = await asyncio.to_thread(TansuBroker().start)

    def topic() -> str:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap, name, partitions=3)
        return name

    try:
        yield f"kafka://{broker.bootstrap}", topic
    finally:
        await asyncio.to_thread(broker.stop)


@contextlib.asynccontextmanager
async def rabbitmq() -> AsyncIterator[tuple[str, Callable[[], str]]]:
    exchange = f"bench-{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    channel = conn.channel()
    channel.exchange_declare(exchange, exchange_type="topic", durable=True)
    queues: list[str] = []

    def topic() -> str:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        channel.queue_declare(name, durable=True)  # persistent messages to a durable queue
        channel.queue_bind(name, exchange, routing_key=name)
        queues.append(name)
        return name

    try:
        yield f"amqp://guest:guest@127.0.0.1:5672/%2F?exchange={exchange}", topic
    finally:
        for name in queues:
            channel.queue_delete(name)
        channel.exchange_delete(exchange)
        conn.close()


@contextlib.asynccontextmanager
async def nats() -> AsyncIterator[tuple[str, Callable[[], str]]]:
    yield "nats://127.0.0.1:4222", lambda: f"bench.{uuid.uuid4().hex[:8]}"


@contextlib.asynccontextmanager
async def redis() -> AsyncIterator[tuple[str, Callable[[], str]]]:
    import redis.asyncio as aioredis

    streams: list[str] = []

    def topic() -> str:
        streams.append(f"bench-{uuid.uuid4().hex[:8]}")
        return streams[-1]

    try:
        yield "redis://127.0.0.1:6379/0", topic
    finally:
        client = aioredis.Redis()
        if streams:
            await client.delete(*streams)
        await client.aclose()


@contextlib.asynccontextmanager
async def http() -> AsyncIterator[tuple[str, Callable[[], str]]]:
    process, url = raw_http._start_receiver()
    try:
        yield url, lambda: f"bench-{uuid.uuid4().hex[:8]}"
    finally:
        process.terminate()
        process.wait()


BROKERS: dict[str, tuple[Any, Any]] = {
    "kafka": (kafka, raw_kafka.raw_ceiling),
    "rabbitmq": (rabbitmq, raw_rabbitmq.raw_ceiling),
    "nats": (nats, raw_nats.raw_ceiling),
    "redis": (redis, raw_redis.raw_ceiling),
    # httpx with one big pool is slower than with small pools (httpcore scans its pool on every
    # request); the adapter uses small pools, so the fair ceiling does too.
    "http": (http, raw_http.raw_ceiling_small_pools),
}


class Waves:
    """A publisher as the relay saw every publisher before ADR 0008: without
    ``keeps_key_order``, so ordered mode publishes a key's run in waves."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __aenter__(self) -> Waves:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def publish(self, messages: Any) -> Any:
        return await self.inner.publish(messages)


async def relay_rate(url: str, topic: str, ordered: bool, *, waves: bool = False) -> float:
    async with fresh_schema(f"bench_{uuid.uuid4().hex[:6]}") as schema:
        async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
            await store.migrate()
        await fill(schema, COUNT, topic=topic, keys=KEYS)
        async with publisher_from_url(url) as publisher:
            # Connections, producer ids and topic metadata are set up before the clock starts,
            # as the raw clients' are: the figure is the steady publishing rate.
            [warm] = messages(topic, 1)
            assert list(await publisher.publish([warm])) == [None]
            relayed = Waves(publisher) if waves else publisher
            return await drain_rate(schema, relayed, RelaySettings(ordered=ordered), COUNT)


async def database_ceiling() -> float:
    async with fresh_schema(f"bench_null_{uuid.uuid4().hex[:6]}") as schema:
        async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
            await store.migrate()
        await fill(schema, COUNT, keys=KEYS)
        return await drain_rate(schema, NullPublisher(), RelaySettings(ordered=False), COUNT)


@contextlib.asynccontextmanager
async def nats_streams(url: str, subjects: list[str]) -> AsyncIterator[None]:
    async with raw_nats.fresh_stream(url, subjects):
        yield


async def measure(name: str, *, waves: bool = False) -> dict[str, Any]:
    setup, raw_ceiling = BROKERS[name]
    labels = ["raw", "ordered", "unordered", "database"] + (["ordered_waves"] if waves else [])
    best = dict.fromkeys(labels, 0.0)
    async with setup() as (url, new_topic):
        for _ in range(ROUNDS):
            topics = [new_topic() for _ in range(4)]
            async with contextlib.AsyncExitStack() as stack:
                if name == "nats":  # JetStream needs a stream (raw_ceiling makes its own)
                    await stack.enter_async_context(nats_streams(url, topics[1:]))
                rates = {"raw": await raw_ceiling(url, messages(topics[0]))}
                rates["ordered"] = await relay_rate(url, topics[1], ordered=True)
                rates["unordered"] = await relay_rate(url, topics[2], ordered=False)
                if waves:
                    rates["ordered_waves"] = await relay_rate(
                        url, topics[3], ordered=True, waves=True
                    )
            rates["database"] = await database_ceiling()
            for label, value in rates.items():
                best[label] = max(best[label], value)
    row: dict[str, Any] = {"broker": name, **{k: round(v) for k, v in best.items()}}
    row["relay_over_raw"] = round(best["unordered"] / best["raw"], 2)
    row["relay_over_database"] = round(best["unordered"] / best["database"], 2)
    row["ordered_over_unordered"] = round(best["ordered"] / best["unordered"], 2)
    line = (
        f"{name:9} raw {best['raw']:8.0f}  relay unordered {best['unordered']:8.0f}  "
        f"ordered {best['ordered']:8.0f}  db ceiling {best['database']:8.0f} msg/s  | "
        f"relay/raw {row['relay_over_raw']:.2f}  relay/db {row['relay_over_database']:.2f}  "
        f"ordered/unordered {row['ordered_over_unordered']:.2f}"
    )
    if waves:
        row["waves_over_unordered"] = round(best["ordered_waves"] / best["unordered"], 2)
        line += f"  (waves {best['ordered_waves']:.0f}: {row['waves_over_unordered']:.2f})"
    print(line, flush=True)
    return row


async def main(names: list[str], *, waves: bool = False) -> list[dict[str, Any]]:
    rows = [await measure(name, waves=waves) for name in names]
    name = "brokers" + ("" if KEYS == 1000 else f"_{KEYS}_keys")
    name += "" if COUNT == 20_000 else f"_{COUNT}"
    save(name, {"count": COUNT, "keys": KEYS, "rounds": ROUNDS, "rows": rows})
    return rows


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    args = sys.argv[1:]
    with_waves = "--waves" in args
    names = [a for a in args if a != "--waves"]
    asyncio.run(main(names or list(BROKERS), waves=with_waves))
