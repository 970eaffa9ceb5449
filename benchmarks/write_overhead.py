"""What adding the outbox row costs a business transaction.

One connection commits N one-row business transactions (an ``orders`` INSERT returning the
generated id) three ways, taking turns transaction by transaction: the business INSERT alone;
followed by ``enqueue`` of an ``OrderCreated`` message (a second statement in the same
transaction); and as the one-statement write (``with_message``: the outbox INSERT in a
data-modifying CTE of the business INSERT, key and ``order_id`` taken from the returned id).
Synchronous commit on, as in production, then off (the statements' own cost, without the
commit's fsync). Reported: the median transaction's time each way and its ratio to the
business transaction alone (targets: ≤ 1.25 with ``enqueue``, ≤ 1.10 with the one-statement
write), and the ratios of the total times. Runs for asyncpg (raw SQL, ``enqueue_async``) and
for SQLAlchemy Core on psycopg (``insert(orders).returning(...)``, ``enqueue``).

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
from outboxer import Returned
from outboxer.config import TableNames
from outboxer.integrations.sqlalchemy import with_message
from outboxer.stores.postgres import PostgresStore

N = 1000
ROUNDS = 3
VARIANTS = ("alone", "enqueue", "one_statement")


def message(order_id: object) -> dict[str, Any]:
    return {
        "topic": "orders",
        "payload": {**PAYLOAD, "order_id": order_id},
        "key": order_id,
        "type": "OrderCreated",
    }


async def asyncpg_times(conn: asyncpg.Connection, schema: str) -> dict[str, list[float]]:
    """Seconds per transaction of each variant, the variants taking turns transaction by
    transaction (a stall of the shared machine's fsync hits them alike)."""
    outbox = outboxer.Outbox(schema=schema)
    insert = f'INSERT INTO "{schema}".orders (customer, total) VALUES ($1, $2) RETURNING id'
    times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for n in range(N):
        for variant in VARIANTS:
            started = time.perf_counter()
            async with conn.transaction():
                if variant == "one_statement":
                    sql, args = outbox.with_message(
                        insert, (f"c-{n}", 99.95), **message(Returned("id")), driver="asyncpg"
                    )
                    await conn.fetchval(sql, *args)
                else:
                    order_id = await conn.fetchval(insert, f"c-{n}", 99.95)
                    if variant == "enqueue":
                        await outbox.enqueue_async(conn, **message(order_id))
            times[variant].append(time.perf_counter() - started)
    return times


def sqlalchemy_times(engine: sa.Engine, schema: str) -> dict[str, list[float]]:
    """As :func:`asyncpg_times`, with SQLAlchemy Core on psycopg."""
    outbox = outboxer.Outbox(schema=schema)
    orders = sa.Table(
        "orders",
        sa.MetaData(),
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("customer", sa.Text),
        sa.Column("total", sa.Numeric),
        schema=schema,
    )
    times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    with engine.connect() as conn:
        for n in range(N):
            for variant in VARIANTS:
                started = time.perf_counter()
                insert = sa.insert(orders).values(customer=f"c-{n}", total=99.95)
                with conn.begin():
                    if variant == "one_statement":
                        statement = with_message(
                            insert.returning(orders.c.id), **message(Returned("id")), outbox=outbox
                        )
                        conn.execute(statement).scalar_one()
                    else:
                        order_id = conn.execute(insert.returning(orders.c.id)).scalar_one()
                        if variant == "enqueue":
                            outbox.enqueue(conn, **message(order_id))
                times[variant].append(time.perf_counter() - started)
    return times


async def measure(schema: str, commit: str) -> dict[str, dict[str, list[float]]]:
    """Every driver's transaction times with ``synchronous_commit`` set to ``commit``."""
    conn = await asyncpg.connect(PG_URL, server_settings={"synchronous_commit": commit})
    engine = sa.create_engine(
        PG_URL.replace("postgresql://", "postgresql+psycopg://"),
        connect_args={"options": f"-c synchronous_commit={commit}"},
    )
    times: dict[str, dict[str, list[float]]] = {"asyncpg": {}, "sqlalchemy": {}}
    try:
        for _ in range(ROUNDS):
            for driver, measured in (
                ("asyncpg", await asyncpg_times(conn, schema)),
                ("sqlalchemy", await asyncio.to_thread(sqlalchemy_times, engine, schema)),
            ):
                for variant, seconds in measured.items():
                    times[driver].setdefault(variant, []).extend(seconds)
    finally:
        await conn.close()
        engine.dispose()
    return times


def summary(by_variant: dict[str, list[float]]) -> dict[str, float]:
    # The median transaction: robust to the stalls of a shared machine's fsync, which hit one
    # transaction in a hundred for tens of milliseconds.
    alone, with_enqueue, one = (statistics.median(by_variant[v]) for v in VARIANTS)
    total = {variant: sum(seconds) for variant, seconds in by_variant.items()}
    return {
        "median_ms_alone": round(alone * 1e3, 3),
        "median_ms_enqueue": round(with_enqueue * 1e3, 3),
        "median_ms_one_statement": round(one * 1e3, 3),
        "time_ratio_enqueue": round(with_enqueue / alone, 3),
        "time_ratio_one_statement": round(one / alone, 3),
        "total_time_ratio_enqueue": round(total["enqueue"] / total["alone"], 3),
        "total_time_ratio_one_statement": round(total["one_statement"] / total["alone"], 3),
    }


async def main() -> dict[str, Any]:
    result: dict[str, Any] = {"transactions": N * ROUNDS}
    async with fresh_schema("bench_write") as schema:
        async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
            await store.migrate()
            await store.execute(
                f'CREATE TABLE "{schema}".orders (id bigserial PRIMARY KEY, customer text, '
                "total numeric, created_at timestamptz DEFAULT now())"
            )
        # synchronous commit as in production; then without waiting for the commit's fsync,
        # which leaves the statements' own cost (and hides a busy machine's slow fsync)
        for commit, label in (("on", "sync_commit"), ("off", "no_commit_wait")):
            for driver, by_variant in (await measure(schema, commit)).items():
                figures = result.setdefault(label, {})[driver] = summary(by_variant)
                print(
                    f"{label:15} {driver:10} median tx: alone {figures['median_ms_alone']} ms,"
                    f" + enqueue ×{figures['time_ratio_enqueue']:.2f}, one statement "
                    f"×{figures['time_ratio_one_statement']:.2f} (totals "
                    f"×{figures['total_time_ratio_enqueue']:.2f} / "
                    f"×{figures['total_time_ratio_one_statement']:.2f})"
                )
    save("write_overhead", result)
    return result


if __name__ == "__main__":
    asyncio.run(main())
