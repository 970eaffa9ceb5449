"""Shared benchmark helpers: a fresh schema, a pre-filled outbox, a timed drain.

Every benchmark writes to its own PostgreSQL schema (dropped afterwards) and reports msg/s.
Figures are meant to be compared within one run (ratios), not across machines.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg

import outboxer
from outboxer._ids import new_message_id
from outboxer.config import RelaySettings, TableNames
from outboxer.errors import PublishError
from outboxer.message import JSON, Message
from outboxer.ports import ClaimRequest, Publisher, Settlement
from outboxer.relay import Relay
from outboxer.stores.postgres import PostgresStore

PG_URL = os.environ.get("OUTBOXER_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
RESULTS = Path(__file__).parent / "results"
PAYLOAD = {
    "order_id": 0,
    "customer": "c-000000",
    "total": 99.95,
    "currency": "EUR",
    "items": [{"sku": "SKU-0001", "qty": 2}],
}  # ≈120 bytes of JSON, like the runs in docs/benchmarks.md


class NullPublisher:
    """Acknowledges everything at once: the relay's ceiling on the database side."""

    async def __aenter__(self) -> NullPublisher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
        return [None] * len(messages)


@contextlib.asynccontextmanager
async def fresh_schema(name: str) -> AsyncIterator[str]:
    conn = await asyncpg.connect(PG_URL)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        yield name
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        await conn.close()


async def fill(
    schema: str,
    count: int,
    *,
    topic: str = "orders",
    keys: int | None = 1000,
    payload: dict[str, Any] | None = None,
    analyze: bool = True,
) -> list[str]:
    """Commit ``count`` messages (key = n % keys) and ANALYZE, outside the timed section."""
    outbox = outboxer.Outbox(schema=schema)
    body = payload or PAYLOAD
    messages = [
        {
            "topic": topic,
            "payload": {**body, "order_id": n},
            "key": (n % keys) if keys else None,
            "type": "OrderCreated",
        }
        for n in range(count)
    ]
    conn = await asyncpg.connect(PG_URL)
    try:
        # one statement, one commit: the relays see the whole backlog at once
        ids = await outbox.enqueue_many_async(conn, messages)
        if analyze:
            await conn.execute(f'VACUUM ANALYZE "{schema}".outbox')
    finally:
        await conn.close()
    return ids


async def drain_rate(schema: str, publisher: Any, settings: RelaySettings, count: int) -> float:
    """msg/s of one relay draining a pre-filled outbox of ``count`` messages."""
    async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
        return await drain_store(store, publisher, settings, count)


async def drain_store(
    store: Any, publisher: Any, settings: RelaySettings, count: int, timeout: float = 600
) -> float:
    """msg/s of one relay draining ``store`` (open, pre-filled with ``count`` messages)."""
    relay = Relay(store, publisher, settings)
    started = time.perf_counter()
    counters = await relay.drain(timeout=timeout)
    elapsed = time.perf_counter() - started
    if counters.published != count:
        raise RuntimeError(f"published {counters.published} of {count}")
    return count / elapsed


async def claim_cost(store: Any, *, ordered: bool, rounds: int = 20) -> tuple[float, float]:
    """Median µs per message of ``claim_batch`` (500) and of its acknowledgement, on ``store``
    (open, pre-filled)."""
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        claim = await store.claim_batch(
            ClaimRequest(limit=500, lease_seconds=30, ordered=ordered, relay_id="bench")
        )
        claimed = time.perf_counter()
        await store.settle(claim, Settlement(published=[m.id for m in claim.messages]))
        settled = time.perf_counter()
        count = len(claim.messages)
        samples.append(((claimed - started) / count, (settled - claimed) / count))
    return (
        statistics.median(s[0] for s in samples) * 1e6,
        statistics.median(s[1] for s in samples) * 1e6,
    )


CHUNK = 500  # the relay's batch size
WINDOW = 4  # the relay's batches in flight


def build_messages(count: int, topic: str, *, keys: int | None = 64) -> list[Message]:
    """``count`` messages of about 120 payload bytes (``keys`` distinct keys, ``None`` = every
    key distinct), a type and one header: what the raw-client benchmarks publish."""
    now = dt.datetime.now(dt.UTC)
    return [
        Message(
            id=new_message_id(),
            topic=topic,
            payload=json.dumps(
                {"order_id": n, "customer": f"c{n % 997:04d}", "total": "129.90", "pad": "x" * 48}
            ).encode(),
            key=f"order-{n % keys if keys else n}",
            type="OrderCreated",
            headers={"tenant": "acme"},
            content_type=JSON,
            created_at=now,
        )
        for n in range(count)
    ]


async def windowed(
    messages: Sequence[Message], send: Callable[[Sequence[Message]], Awaitable[None]]
) -> float:
    """Send ``messages`` in chunks of CHUNK with at most WINDOW chunks in flight; msg/s."""
    limit = asyncio.Semaphore(WINDOW)

    async def one(chunk: Sequence[Message]) -> None:
        async with limit:
            await send(chunk)

    started = time.perf_counter()
    await asyncio.gather(*(one(messages[i : i + CHUNK]) for i in range(0, len(messages), CHUNK)))
    return len(messages) / (time.perf_counter() - started)


async def publisher_rate(publisher: Publisher, messages: Sequence[Message]) -> float:
    """An entered publisher's ``publish`` with batches of CHUNK, WINDOW at once; msg/s."""

    async def send(chunk: Sequence[Message]) -> None:
        results = await publisher.publish(chunk)
        if any(r is not None for r in results):
            raise RuntimeError(f"publish failed: {next(r for r in results if r)}")

    return await windowed(messages, send)


def save(name: str, result: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    result = {"machine": f"{platform.node()} {os.cpu_count()} cpu", **result}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path
