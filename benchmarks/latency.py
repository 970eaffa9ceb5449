"""Commit → broker-ack latency at a steady 1,000 messages/s.

A writer process commits one-message transactions at a fixed rate (1 ms apart, scheduled on
absolute times) and records each commit's wall-clock time; in this process a relay with default
settings publishes them, and a thin wrapper around the real publisher records the wall-clock time
at which the broker acknowledged each message. Latency = ack - commit, over 10 s after a 1 s
warm-up. Target: p50 ≤ 5 ms, p99 ≤ 25 ms.

Then the first message after a long idle period: ``IDLE_MESSAGES`` single-message transactions,
each committed after the relay had nothing to do for ``IDLE_GAP`` seconds (plus a random fraction
of the relay's longest idle wait, so commits do not keep one phase of its polling); latency as
above. Target: within 100 ms.

Run: ``.venv/bin/python -m benchmarks.latency [null kafka rabbitmq nats redis]`` (``null``: no
broker, every message acknowledged at once: the relay's own share of the latency).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import random
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import asyncpg

import outboxer
from benchmarks.brokers import BROKERS, nats_streams
from benchmarks.common import PAYLOAD, PG_URL, NullPublisher, fresh_schema, save
from outboxer.brokers import publisher_from_url
from outboxer.config import RelaySettings, TableNames
from outboxer.errors import PublishError
from outboxer.message import Message
from outboxer.relay import Relay
from outboxer.stores.postgres import PostgresStore

RATE = 1000
SECONDS = 11
WARMUP = 1.0
IDLE_MESSAGES = 20
IDLE_GAP = 2.0


def writer(schema: str, topic: str, start_at: float, out: Any) -> None:
    """Commit RATE messages/s for SECONDS; send {id: commit wall time} back."""

    async def run() -> dict[str, float]:
        outbox = outboxer.Outbox(schema=schema)
        conn = await asyncpg.connect(PG_URL)
        commits: dict[str, float] = {}
        try:
            await asyncio.sleep(max(0.0, start_at - time.time()))
            for n in range(RATE * SECONDS):
                due = start_at + n / RATE
                await asyncio.sleep(max(0.0, due - time.time()))
                async with conn.transaction():
                    message_id = await outbox.enqueue_async(
                        conn,
                        topic,
                        {**PAYLOAD, "order_id": n},
                        key=str(n % 1000),
                        type="OrderCreated",
                    )
                commits[message_id] = time.time()
        finally:
            await conn.close()
        return commits

    out.send(asyncio.run(run()))


class Timed:
    """Wraps a publisher; records when each message was acknowledged."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.acks: dict[str, float] = {}

    async def __aenter__(self) -> Timed:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.inner.__aexit__(*exc)

    async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
        results = await self.inner.publish(messages)
        now = time.time()
        for message, result in zip(messages, results, strict=True):
            if result is None:
                self.acks.setdefault(message.id, now)
        return results


@contextlib.asynccontextmanager
async def no_broker() -> AsyncIterator[tuple[str, Callable[[], str]]]:
    """``null``: no broker, every message acknowledged at once (the relay's own share: the
    wake-up, the claim and the settle, without a broker's or a shared server's noise)."""
    yield "null", lambda: "orders"


async def measure(name: str) -> dict[str, Any]:
    setup = no_broker if name == "null" else BROKERS[name][0]
    async with setup() as (url, new_topic):
        topic = new_topic()
        async with contextlib.AsyncExitStack() as stack:
            if name == "nats":
                await stack.enter_async_context(nats_streams(url, [topic]))
            async with fresh_schema(f"bench_lat_{uuid.uuid4().hex[:6]}") as schema:
                async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
                    await store.migrate()
                    inner = NullPublisher() if name == "null" else publisher_from_url(url)
                    publisher = await stack.enter_async_context(Timed(inner))
                    relay = Relay(store, publisher)
                    task = asyncio.create_task(relay.run())
                    receive, send = multiprocessing.Pipe(duplex=False)
                    start_at = time.time() + 1.0
                    proc = multiprocessing.Process(
                        target=writer, args=(schema, topic, start_at, send)
                    )
                    proc.start()
                    commits: dict[str, float] = await asyncio.to_thread(receive.recv)
                    await asyncio.to_thread(proc.join)
                    deadline = time.monotonic() + 30
                    while len(publisher.acks) < len(commits) and time.monotonic() < deadline:
                        await asyncio.sleep(0.05)
                    after_idle = await idle_latencies(schema, topic, publisher)
                    relay.stop()
                    await task
    latencies = sorted(
        (publisher.acks[i] - t) * 1000
        for i, t in commits.items()
        if t >= start_at + WARMUP and i in publisher.acks
    )
    lost = sum(i not in publisher.acks for i in commits)
    p50 = statistics.median(latencies)
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    row = {
        "broker": name,
        "rate": RATE,
        "messages": len(latencies),
        "p50_ms": round(p50, 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(latencies[-1], 2),
        "unacked": lost,
        "after_idle_s": IDLE_GAP,
        "after_idle_p50_ms": round(statistics.median(after_idle), 2),
        "after_idle_max_ms": round(after_idle[-1], 2),
    }
    print(
        f"{name:9} {RATE} msg/s: p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  max "
        f"{latencies[-1]:7.2f} ms  ({len(latencies)} messages); first after {IDLE_GAP:.0f} s "
        f"idle: p50 {row['after_idle_p50_ms']:6.2f} ms  max {row['after_idle_max_ms']:6.2f} ms "
        f"({len(after_idle)} messages)"
    )
    return row


async def idle_latencies(schema: str, topic: str, publisher: Timed) -> list[float]:
    """Commit → ack (ms) of single messages, each committed after the relay sat idle."""
    outbox = outboxer.Outbox(schema=schema)
    longest_wait = RelaySettings().poll_interval
    conn = await asyncpg.connect(PG_URL)
    latencies = []
    try:
        for n in range(IDLE_MESSAGES):
            await asyncio.sleep(IDLE_GAP + random.uniform(0, longest_wait))
            async with conn.transaction():
                message_id = await outbox.enqueue_async(conn, topic, {**PAYLOAD, "order_id": n})
            committed = time.time()
            deadline = time.monotonic() + 10
            while message_id not in publisher.acks and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            latencies.append((publisher.acks.get(message_id, float("inf")) - committed) * 1000)
    finally:
        await conn.close()
    return sorted(latencies)


async def main(names: list[str]) -> list[dict[str, Any]]:
    rows = [await measure(name) for name in names]
    save("latency", {"rate": RATE, "seconds": SECONDS - WARMUP, "rows": rows})
    return rows


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    asyncio.run(main(sys.argv[1:] or ["kafka", "rabbitmq", "nats", "redis"]))
