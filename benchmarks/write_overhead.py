"""What adding the outbox row costs a business transaction.

One connection commits N one-row business transactions (an ``orders`` INSERT returning the
generated id) three ways, taking turns transaction by transaction: the business INSERT alone;
followed by ``enqueue`` of an ``OrderCreated`` message (a second statement in the same
transaction); and as the one-statement write (``with_message``: the outbox INSERT in a
data-modifying CTE of the business INSERT, key and ``order_id`` taken from the returned id).
Synchronous commit on, as in production, then off (the statements' own cost, without the
commit's fsync). Reported: the median transaction's time each way and its ratio to the
business transaction alone (targets: ≤ 1.25 with ``enqueue``, ≤ 1.10 with the one-statement
write), and the ratios of the total times; then the client and server CPU per transaction
(PostgreSQL on this machine: its backend's CPU read from /proc). Runs for asyncpg (raw SQL,
``enqueue_async``) and for SQLAlchemy Core on psycopg (``insert(orders).returning(...)``,
``enqueue``).

Run: ``.venv/bin/python -m benchmarks.write_overhead``
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
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


class Asyncpg:
    """The three variants' transactions on one asyncpg connection."""

    def __init__(self, conn: asyncpg.Connection, schema: str) -> None:
        self.conn, self.outbox = conn, outboxer.Outbox(schema=schema)
        self.insert = (
            f'INSERT INTO "{schema}".orders (customer, total) VALUES ($1, $2) RETURNING id'
        )

    async def transaction(self, variant: str, n: int) -> None:
        async with self.conn.transaction():
            if variant == "one_statement":
                sql, args = self.outbox.with_message(
                    self.insert, (f"c-{n}", 99.95), **message(Returned("id")), driver="asyncpg"
                )
                await self.conn.fetchval(sql, *args)
            else:
                order_id = await self.conn.fetchval(self.insert, f"c-{n}", 99.95)
                if variant == "enqueue":
                    await self.outbox.enqueue_async(self.conn, **message(order_id))


class Sqlalchemy:
    """The three variants' transactions through SQLAlchemy Core on one psycopg connection."""

    def __init__(self, conn: sa.Connection, schema: str) -> None:
        self.conn, self.outbox = conn, outboxer.Outbox(schema=schema)
        self.orders = sa.Table(
            "orders",
            sa.MetaData(),
            sa.Column("id", sa.BigInteger, primary_key=True),
            sa.Column("customer", sa.Text),
            sa.Column("total", sa.Numeric),
            schema=schema,
        )

    def transaction(self, variant: str, n: int) -> None:
        insert = sa.insert(self.orders).values(customer=f"c-{n}", total=99.95)
        with self.conn.begin():
            if variant == "one_statement":
                returning = insert.returning(self.orders.c.id)
                statement = with_message(returning, **message(Returned("id")), outbox=self.outbox)
                self.conn.execute(statement).scalar_one()
            else:
                order_id = self.conn.execute(insert.returning(self.orders.c.id)).scalar_one()
                if variant == "enqueue":
                    self.outbox.enqueue(self.conn, **message(order_id))


async def asyncpg_times(writes: Asyncpg) -> dict[str, list[float]]:
    """Seconds per transaction of each variant, the variants taking turns transaction by
    transaction (a stall of the shared machine's fsync hits them alike)."""
    times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for n in range(N):
        for variant in VARIANTS:
            started = time.perf_counter()
            await writes.transaction(variant, n)
            times[variant].append(time.perf_counter() - started)
    return times


def sqlalchemy_times(writes: Sqlalchemy) -> dict[str, list[float]]:
    """As :func:`asyncpg_times`, with SQLAlchemy Core on psycopg."""
    times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for n in range(N):
        for variant in VARIANTS:
            started = time.perf_counter()
            writes.transaction(variant, n)
            times[variant].append(time.perf_counter() - started)
    return times


def backend_cpu(pid: int) -> float:
    """CPU seconds (user + system) a local PostgreSQL backend has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def cpu_per_transaction(
    run: Callable[[str, int], Awaitable[None]], pid: int
) -> dict[str, dict[str, float]]:
    """Client CPU (this process) and server CPU (the backend, read from /proc: PostgreSQL on
    this machine) per transaction of each variant, in blocks of N taking turns: CPU time is
    inflated less than wall time by a busy machine."""
    used = {variant: [0.0, 0.0] for variant in VARIANTS}
    for _ in range(ROUNDS):
        for variant in VARIANTS:
            client, server = time.process_time(), backend_cpu(pid)
            for n in range(N):
                await run(variant, n)
            used[variant][0] += time.process_time() - client
            used[variant][1] += backend_cpu(pid) - server
    return {
        variant: {
            "client_us": round(client / (N * ROUNDS) * 1e6, 1),
            "server_us": round(server / (N * ROUNDS) * 1e6, 1),
        }
        for variant, (client, server) in used.items()
    }


async def measure(schema: str, commit: str) -> dict[str, dict[str, list[float]]]:
    """Every driver's transaction times with ``synchronous_commit`` set to ``commit``."""
    conn = await asyncpg.connect(PG_URL, server_settings={"synchronous_commit": commit})
    engine = sa.create_engine(
        PG_URL.replace("postgresql://", "postgresql+psycopg://"),
        connect_args={"options": f"-c synchronous_commit={commit}"},
    )
    times: dict[str, dict[str, list[float]]] = {"asyncpg": {}, "sqlalchemy": {}}
    try:
        with engine.connect() as sa_conn:
            writes = Asyncpg(conn, schema), Sqlalchemy(sa_conn, schema)
            for _ in range(ROUNDS):
                for driver, measured in (
                    ("asyncpg", await asyncpg_times(writes[0])),
                    ("sqlalchemy", await asyncio.to_thread(sqlalchemy_times, writes[1])),
                ):
                    for variant, seconds in measured.items():
                        times[driver].setdefault(variant, []).extend(seconds)
    finally:
        await conn.close()
        engine.dispose()
    return times


async def measure_cpu(schema: str) -> dict[str, Any]:
    """:func:`cpu_per_transaction` of every driver (without the commit's fsync wait, which
    costs no CPU and only lengthens the run)."""
    conn = await asyncpg.connect(PG_URL, server_settings={"synchronous_commit": "off"})
    engine = sa.create_engine(
        PG_URL.replace("postgresql://", "postgresql+psycopg://"),
        connect_args={"options": "-c synchronous_commit=off"},
    )
    try:
        with engine.connect() as sa_conn:
            raw = Asyncpg(conn, schema)
            core = Sqlalchemy(sa_conn, schema)

            async def through_sqlalchemy(variant: str, n: int) -> None:
                core.transaction(variant, n)  # (in this thread: its CPU is this process's)

            sa_pid = sa_conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            sa_conn.commit()
            return {
                "asyncpg": await cpu_per_transaction(
                    raw.transaction, await conn.fetchval("SELECT pg_backend_pid()")
                ),
                "sqlalchemy": await cpu_per_transaction(through_sqlalchemy, sa_pid),
            }
    finally:
        await conn.close()
        engine.dispose()


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
        result["cpu_per_transaction"] = await measure_cpu(schema)
        for driver, variants in result["cpu_per_transaction"].items():
            print(f"cpu per tx      {driver:10}", variants)
    save("write_overhead", result)
    return result


if __name__ == "__main__":
    asyncio.run(main())
