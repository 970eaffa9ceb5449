"""What adding the outbox row costs a business transaction.

One connection commits N one-row business transactions (an ``orders`` INSERT) with and without
``enqueue`` of an ``OrderCreated`` message in the same transaction; synchronous commit on, as in
production. Reported: transactions/s each way and the ratio (target ≤ 1.25× the time).
Runs for asyncpg (``enqueue_async``) and for SQLAlchemy on psycopg (``enqueue``), interleaved
in rounds so that a noisy neighbour hurts both sides alike.

Run: ``.venv/bin/python -m benchmarks.write_overhead``
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import asyncpg
import sqlalchemy as sa

import outboxer
from benchmarks.common import PAYLOAD, PG_URL, fresh_schema, save
from outboxer.config import TableNames
from outboxer.stores.postgres import PostgresStore

N = 1000
ROUNDS = 5


async def asyncpg_rate(conn: asyncpg.Connection, schema: str, with_outbox: bool) -> float:
    outbox = outboxer.Outbox(schema=schema)
    insert = f'INSERT INTO "{schema}".orders (customer, total) VALUES ($1, $2) RETURNING id'
    started = time.perf_counter()
    for n in range(N):
        async with conn.transaction():
            order_id = await conn.fetchval(insert, f"c-{n}", 99.95)
            if with_outbox:
                await outbox.enqueue_async(
                    conn,
                    "orders",
                    {**PAYLOAD, "order_id": order_id},
                    key=str(order_id),
                    type="OrderCreated",
                )
    return N / (time.perf_counter() - started)


def sqlalchemy_rate(engine: sa.Engine, schema: str, with_outbox: bool) -> float:
    outbox = outboxer.Outbox(schema=schema)
    insert = sa.text(
        f'INSERT INTO "{schema}".orders (customer, total) VALUES (:c, :t) RETURNING id'
    )
    started = time.perf_counter()
    with engine.connect() as conn:
        for n in range(N):
            with conn.begin():
                order_id = conn.execute(insert, {"c": f"c-{n}", "t": 99.95}).scalar_one()
                if with_outbox:
                    outbox.enqueue(
                        conn,
                        "orders",
                        {**PAYLOAD, "order_id": order_id},
                        key=str(order_id),
                        type="OrderCreated",
                    )
    return N / (time.perf_counter() - started)


async def main() -> dict[str, Any]:
    async with fresh_schema("bench_write") as schema:
        async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
            await store.migrate()
        conn = await asyncpg.connect(PG_URL)
        engine = sa.create_engine(PG_URL.replace("postgresql://", "postgresql+psycopg://"))
        try:
            await conn.execute(
                f'CREATE TABLE "{schema}".orders (id bigserial PRIMARY KEY, customer text, '
                "total numeric, created_at timestamptz DEFAULT now())"
            )
            rates: dict[str, list[float]] = {}
            for _ in range(ROUNDS):
                for with_outbox in (False, True):
                    tag = "with" if with_outbox else "without"
                    rates.setdefault(f"asyncpg_{tag}", []).append(
                        await asyncpg_rate(conn, schema, with_outbox)
                    )
                    rates.setdefault(f"sqlalchemy_{tag}", []).append(
                        await asyncio.to_thread(sqlalchemy_rate, engine, schema, with_outbox)
                    )
        finally:
            await conn.close()
            engine.dispose()
    result: dict[str, Any] = {"transactions": N, "rounds": ROUNDS}
    for driver in ("asyncpg", "sqlalchemy"):
        without = statistics.median(rates[f"{driver}_without"])
        with_ = statistics.median(rates[f"{driver}_with"])
        result[driver] = {
            "tx_per_s_without": round(without),
            "tx_per_s_with": round(with_),
            "time_ratio": round(without / with_, 3),
        }
        print(
            f"{driver:10} without {without:7.0f} tx/s  with enqueue {with_:7.0f} tx/s  "
            f"time ×{without / with_:.2f}"
        )
    save("write_overhead", result)
    return result


if __name__ == "__main__":
    asyncio.run(main())
