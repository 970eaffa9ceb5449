"""MariaDB against PostgreSQL, side by side in one run: relay throughput and the claim's cost.

For each database, on a pre-filled outbox of 20,000 messages over 1,000 keys:

- ``claim``: one ``claim_batch`` of 500 and its acknowledgement, per message (median of 20);
- ``null``: one relay draining to a publisher that acknowledges at once (the database-side
  ceiling of the relay);
- ``redis``, ``kafka``: one relay draining to Redis Streams and to Kafka (Tansu);

each ordered (the default) and unordered; the write overhead: 2,000 one-row business
transactions on one connection, alone and with an ``enqueue`` (asyncpg / asyncmy); and
``backlog``: MariaDB alone, one relay draining ``OUTBOXER_BENCH_BACKLOG`` messages (default
500,000) to the null publisher, its rate in each tenth of the drain (does the claim slow down as
InnoDB's purge falls behind the deleted rows at the front of the table?), and before the ordered
drain the time of an ordered claim that finds every key in flight (does it walk the backlog?).

Run: ``.venv/bin/python -m benchmarks.mysql [claim null redis kafka write backlog]``
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import asyncmy
import asyncpg

import outboxer
from benchmarks.brokers import kafka, redis
from benchmarks.common import PAYLOAD, PG_URL, NullPublisher, claim_cost, drain_store, save
from outboxer.brokers import publisher_from_url
from outboxer.config import RelaySettings, TableNames
from outboxer.errors import PublishError
from outboxer.message import Message
from outboxer.ports import ClaimRequest, DatabaseStore, Settlement
from outboxer.stores.mysql import MysqlStore
from outboxer.stores.postgres import PostgresStore

MYSQL_URL = "mysql://root@127.0.0.1:3306/test"
COUNT = 20_000
KEYS = 1000
WRITES = 2000


@contextlib.asynccontextmanager
async def connect(database: str, schema: str) -> AsyncIterator[Any]:
    """An application's connection to ``schema`` (a PostgreSQL schema or a MySQL database)."""
    if database == "postgres":
        pg = await asyncpg.connect(PG_URL)
        try:
            yield pg
        finally:
            await pg.close()
        return
    my = await asyncmy.connect(host="127.0.0.1", user="root", database=schema, autocommit=True)
    try:
        yield my
    finally:
        my.close()


@contextlib.asynccontextmanager
async def fresh(database: str) -> AsyncIterator[tuple[str, Callable[[], DatabaseStore]]]:
    """A new, migrated outbox; yields its schema and a store factory. Dropped afterwards."""
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    names = TableNames(schema=schema)

    def store() -> DatabaseStore:
        if database == "postgres":
            return PostgresStore(PG_URL, names)
        return MysqlStore(MYSQL_URL, names)

    async with store() as created:
        await created.migrate()
    try:
        yield schema, store
    finally:
        async with connect(database, schema) as conn:
            drop = f'DROP SCHEMA "{schema}" CASCADE' if database == "postgres" else None
            if drop:
                await conn.execute(drop)
            else:
                async with conn.cursor() as cur:
                    await cur.execute(f"DROP DATABASE `{schema}`")


async def fill(database: str, schema: str, topic: str = "orders", count: int = COUNT) -> None:
    """Commit ``count`` messages over KEYS keys through the write API, in one transaction."""
    messages = [
        {
            "topic": topic,
            "payload": {**PAYLOAD, "order_id": n},
            "key": n % KEYS,
            "type": "OrderCreated",
        }
        for n in range(count)
    ]
    outbox = outboxer.Outbox(schema=schema)
    async with connect(database, schema) as conn:
        if database == "postgres":
            async with conn.transaction():
                await outbox.enqueue_many_async(conn, messages)
            await conn.execute(f'VACUUM ANALYZE "{schema}".outbox')
        else:
            await conn.begin()
            await outbox.enqueue_many_async(conn, messages)
            await conn.commit()
            async with conn.cursor() as cur:
                await cur.execute(f"ANALYZE TABLE `{schema}`.outbox")


async def claim_costs(database: str, ordered: bool) -> dict[str, Any]:
    async with fresh(database) as (schema, store):
        await fill(database, schema)
        async with store() as opened:
            claim_us, ack_us = await claim_cost(opened, ordered=ordered)
    return {"claim_us_per_msg": round(claim_us, 2), "ack_us_per_msg": round(ack_us, 2)}


async def relay_rate(database: str, broker: str, ordered: bool) -> dict[str, Any]:
    async with contextlib.AsyncExitStack() as stack:
        if broker == "null":
            url, topic = None, "orders"
        else:
            url, new_topic = await stack.enter_async_context(BROKERS[broker]())
            topic = new_topic()
        schema, store = await stack.enter_async_context(fresh(database))
        await fill(database, schema, topic)
        if url is None:
            publisher: Any = NullPublisher()
        else:
            publisher = await stack.enter_async_context(publisher_from_url(url))
        opened = await stack.enter_async_context(store())
        settings = RelaySettings(ordered=ordered)
        return {"msg_per_s": round(await drain_store(opened, publisher, settings, COUNT))}


async def write_overhead(database: str) -> dict[str, Any]:
    """One-row business transactions on one connection: alone, then each with an enqueue."""
    async with fresh(database) as (schema, _), connect(database, schema) as conn:
        outbox = outboxer.Outbox(schema=schema)
        if database == "postgres":
            await conn.execute(f'CREATE TABLE "{schema}".orders (id bigint, total numeric)')
            insert = f'INSERT INTO "{schema}".orders VALUES ($1, $2)'

            async def business(n: int, with_message: bool) -> None:
                async with conn.transaction():
                    await conn.execute(insert, n, 99)
                    if with_message:
                        await outbox.enqueue_async(conn, "orders", {"order_id": n}, key=n)

        else:
            async with conn.cursor() as cur:
                await cur.execute(f"CREATE TABLE `{schema}`.orders (id BIGINT, total DECIMAL)")
            insert = f"INSERT INTO `{schema}`.orders VALUES (%s, %s)"

            async def business(n: int, with_message: bool) -> None:
                await conn.begin()
                async with conn.cursor() as cur:
                    await cur.execute(insert, (n, 99))
                if with_message:
                    await outbox.enqueue_async(conn, "orders", {"order_id": n}, key=n)
                await conn.commit()

        rates = {}
        for with_message in (False, True):
            started = time.perf_counter()
            for n in range(WRITES):
                await business(n, with_message)
            rates[with_message] = WRITES / (time.perf_counter() - started)
    return {
        "business_tx_per_s": round(rates[False]),
        "with_enqueue_tx_per_s": round(rates[True]),
        "ratio": round(rates[True] / rates[False], 2),
    }


class TimedNullPublisher(NullPublisher):
    """Acknowledges at once and notes when each tenth of ``total`` messages was reached."""

    def __init__(self, total: int) -> None:
        self.total, self.published, self.marks = total, 0, [time.perf_counter()]

    async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
        self.published += len(messages)
        while self.published >= self.total * len(self.marks) // 10 and len(self.marks) <= 10:
            self.marks.append(time.perf_counter())
            rate = self.total / 10 / (self.marks[-1] - self.marks[-2])
            print(f"  tenth {len(self.marks) - 1}: {rate:.0f} msg/s", file=sys.stderr, flush=True)
        return [None] * len(messages)


async def blocked_claim_ms(store: DatabaseStore) -> float:
    """ms of an ordered claim (of 500) that finds nothing because every key is in flight: the
    heads of all KEYS keys are leased first, and released afterwards."""
    request = ClaimRequest(limit=500, lease_seconds=300, ordered=True, relay_id="bench")
    held = [await store.claim_batch(request) for _ in range(KEYS // 500)]
    started = time.perf_counter()
    empty = await store.claim_batch(request)
    elapsed = (time.perf_counter() - started) * 1000
    if empty.messages:
        raise RuntimeError(f"claimed {len(empty.messages)} with every key in flight")
    for claim in held:
        await store.settle(claim, Settlement(released=[m.id for m in claim.messages]))
    return round(elapsed, 1)


async def backlog(ordered: bool) -> dict[str, Any]:
    total = int(os.environ.get("OUTBOXER_BENCH_BACKLOG", "500000"))
    blocked: dict[str, float] = {}
    async with fresh("mariadb") as (schema, store):
        for start in range(0, total, 100_000):
            await fill("mariadb", schema, count=min(100_000, total - start))
        publisher = TimedNullPublisher(total)
        async with store() as opened:
            if ordered:
                blocked["every_key_in_flight_claim_ms"] = await blocked_claim_ms(opened)
            print(f"  filled, {blocked}", file=sys.stderr, flush=True)
            await drain_store(opened, publisher, RelaySettings(ordered=ordered), total, 3600)
    tenth = total / 10
    rates = [round(tenth / (b - a)) for a, b in itertools.pairwise(publisher.marks)]
    return {"backlog": total, "msg_per_s_by_tenth": rates, **blocked}


BROKERS = {"redis": redis, "kafka": kafka}
PARTS = ("claim", "null", "redis", "kafka", "write", "backlog")


async def main(parts: list[str]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for part in parts:
        for database in ("postgres", "mariadb") if part != "backlog" else ("mariadb",):
            for ordered in (True, False) if part != "write" else (True,):
                if part == "backlog":
                    figures = await backlog(ordered)
                elif part == "claim":
                    figures = await claim_costs(database, ordered)
                elif part == "write":
                    figures = await write_overhead(database)
                else:
                    figures = await relay_rate(database, part, ordered)
                row = {"part": part, "database": database, "ordered": ordered, **figures}
                rows.append(row)
                print(row, flush=True)
    result = {"count": COUNT, "keys": KEYS, "rows": rows}
    save("mysql" if "backlog" not in parts else "mysql_backlog", result)
    return result


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] or list(PARTS)))
