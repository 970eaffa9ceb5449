"""Write throughput with concurrent writers: a business transaction alone vs with ``enqueue``.

Every request of an application pays for ``enqueue``, usually many requests at once. Each
writer (one connection each) commits one-row business transactions (an ``orders`` INSERT), with
and without an ``OrderCreated`` message in the same transaction, for a fixed time; reported:
committed transactions/s of all writers together and the ratio to business-only. Synchronous
commit on, a fresh database, a relay process running on every outbox (a null publisher): busy
while its outbox is written, idle otherwise. The modes of one connection count run back to back
in interleaved rounds, so a noisy neighbour hurts them alike; the median round is reported.

PostgreSQL outboxes (``--variants``), each in its own schema of the fresh database, migrated by
this tree, then given the wake-up to compare:

- ``notify``: the statement trigger of schema versions 1-5 (``pg_notify`` at every inserting
  commit; PostgreSQL serializes the commits of notifying transactions on one global lock);
- ``polling``: no trigger (schema 6: the relay polls adaptively, docs/adr/0007);
- ``gated``: a trigger that notifies only while no relay is awake (it reads an UNLOGGED "relay
  awake until" row and skips ``pg_notify`` meanwhile), measured while the row says "awake": the
  best case of that design.

Drivers: ``asyncpg`` (a pool, one task per connection, ``enqueue_async``), ``sqlalchemy`` (on
psycopg 3, one thread per connection, ``enqueue``), ``sqlite`` (the SQLite store, one thread and
sqlite3 connection per writer, ``BEGIN IMMEDIATE``). SQLite's concurrency model: one write
transaction at a time per database file (WAL journal, ``synchronous = NORMAL`` as the store sets
it); the others wait on the lock (``busy_timeout``), and the relay's claims and settlements take
the same lock. More connections add no throughput there, only queueing.

Run: ``.venv/bin/python -m benchmarks.writers [--seconds 2] [--rounds 3]
[--connections 1,4,16,32] [--drivers asyncpg,sqlalchemy,sqlite] [--variants notify,polling]``;
``.venv/bin/python -m benchmarks.writers --idle 60`` measures an idle relay's CPU instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import sqlalchemy as sa

import outboxer
from benchmarks.common import PAYLOAD, PG_URL, NullPublisher, save
from outboxer.config import RelaySettings, TableNames
from outboxer.relay import Relay
from outboxer.stores import open_store

ROOT = Path(__file__).resolve().parents[1]
DATABASE = "outboxer_bench_writers"
BENCH_URL = PG_URL.rsplit("/", 1)[0] + f"/{DATABASE}"
ORDERS = (
    "CREATE TABLE {orders} (id bigserial PRIMARY KEY, customer text, total numeric, "
    "created_at timestamptz DEFAULT now())"
)

#: The wake-up of each PostgreSQL variant, applied after the tree's own migrations.
NOTIFY_TRIGGER = """
CREATE OR REPLACE FUNCTION "{s}".outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS "outbox_notify" ON "{s}".outbox;
CREATE TRIGGER "outbox_notify" AFTER INSERT ON "{s}".outbox
    FOR EACH STATEMENT EXECUTE FUNCTION "{s}".outbox_notify('outboxer.{s}.outbox');
"""
NO_TRIGGER = """
DROP TRIGGER IF EXISTS "outbox_notify" ON "{s}".outbox;
DROP FUNCTION IF EXISTS "{s}".outbox_notify();
"""
GATED_TRIGGER = """
CREATE UNLOGGED TABLE "{s}".outbox_awake (id int PRIMARY KEY, until timestamptz NOT NULL);
INSERT INTO "{s}".outbox_awake VALUES (1, 'infinity');
CREATE OR REPLACE FUNCTION "{s}".outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT until FROM "{s}".outbox_awake WHERE id = 1) < clock_timestamp() THEN
        PERFORM pg_notify(TG_ARGV[0], '');
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS "outbox_notify" ON "{s}".outbox;
CREATE TRIGGER "outbox_notify" AFTER INSERT ON "{s}".outbox
    FOR EACH STATEMENT EXECUTE FUNCTION "{s}".outbox_notify('outboxer.{s}.outbox');
"""
VARIANTS = {"notify": NOTIFY_TRIGGER, "polling": NO_TRIGGER, "gated": GATED_TRIGGER}


# -- the relay process -----------------------------------------------------------------------


def relay_main(url: str, schema: str | None) -> None:
    """Run a relay with default settings and a null publisher until SIGTERM."""

    async def run() -> None:
        async with open_store(url, TableNames(schema=schema)) as store:
            relay = Relay(store, NullPublisher(), RelaySettings())
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, relay.stop)
            await relay.run()

    asyncio.run(run())


@contextlib.contextmanager
def relay_process(url: str, schema: str | None) -> Iterator[subprocess.Popen[bytes]]:
    args = [sys.executable, "-m", "benchmarks.writers", "--relay", url]
    if schema:
        args.append(schema)
    proc = subprocess.Popen(args, cwd=ROOT)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(30)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- writers ---------------------------------------------------------------------------------


def payload(n: int) -> dict[str, Any]:
    return {**PAYLOAD, "order_id": n}


async def asyncpg_rate(
    pool: asyncpg.Pool, schema: str | None, connections: int, seconds: float
) -> float:
    """Transactions/s of ``connections`` tasks (one pooled connection each); ``schema`` None:
    business only."""
    outbox = outboxer.Outbox(schema=schema) if schema else None
    insert = (
        f'INSERT INTO "{schema or "business"}".orders (customer, total) VALUES ($1, $2) '
        "RETURNING id"
    )
    counts = [0] * connections
    deadline = time.perf_counter() + seconds

    async def writer(i: int) -> None:
        async with pool.acquire() as conn:
            while time.perf_counter() < deadline:
                async with conn.transaction():
                    order_id = await conn.fetchval(insert, f"c-{i}", 99.95)
                    if outbox is not None:
                        await outbox.enqueue_async(
                            conn,
                            "orders",
                            payload(order_id),
                            key=str(order_id),
                            type="OrderCreated",
                        )
                counts[i] += 1

    started = time.perf_counter()
    await asyncio.gather(*(writer(i) for i in range(connections)))
    return sum(counts) / (time.perf_counter() - started)


def threaded_rate(
    transaction: Callable[[int, int], None], connections: int, seconds: float
) -> float:
    """Transactions/s of ``connections`` threads each calling ``transaction(i, n)`` in a loop."""
    counts = [0] * connections
    deadline = time.perf_counter() + seconds
    ready = threading.Barrier(connections + 1)

    def writer(i: int) -> None:
        ready.wait()
        n = 0
        while time.perf_counter() < deadline:
            transaction(i, n)
            n += 1
        counts[i] = n

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    started = time.perf_counter()
    ready.wait()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - started)


def sqlalchemy_transaction(engine: sa.Engine, schema: str | None) -> Callable[[int, int], None]:
    outbox = outboxer.Outbox(schema=schema) if schema else None
    insert = sa.text(
        f'INSERT INTO "{schema or "business"}".orders (customer, total) VALUES (:c, :t) '
        "RETURNING id"
    )

    def transaction(i: int, n: int) -> None:
        with engine.begin() as conn:
            order_id = conn.execute(insert, {"c": f"c-{i}", "t": 99.95}).scalar_one()
            if outbox is not None:
                outbox.enqueue(
                    conn, "orders", payload(order_id), key=str(order_id), type="OrderCreated"
                )

    return transaction


def sqlite_transaction(path: str, with_outbox: bool) -> Callable[[int, int], None]:
    local = threading.local()

    def transaction(i: int, n: int) -> None:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = sqlite3.connect(path, isolation_level=None, timeout=60)
            conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("BEGIN IMMEDIATE")
        order_id = conn.execute(
            "INSERT INTO orders (customer, total) VALUES (?, ?) RETURNING id", (f"c-{i}", 99.95)
        ).fetchone()[0]
        if with_outbox:
            outboxer.enqueue(
                conn, "orders", payload(order_id), key=str(order_id), type="OrderCreated"
            )
        conn.execute("COMMIT")

    return transaction


# -- the run ---------------------------------------------------------------------------------


async def fresh_database() -> None:
    admin = await asyncpg.connect(PG_URL)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await admin.close()


async def setup_postgres(variants: list[str]) -> None:
    await fresh_database()
    for variant in variants:
        async with open_store(BENCH_URL, TableNames(schema=variant)) as store:
            await store.migrate()
    conn = await asyncpg.connect(BENCH_URL)
    try:
        await conn.execute('CREATE SCHEMA "business"')
        for schema in ["business", *variants]:
            await conn.execute(ORDERS.format(orders=f'"{schema}".orders'))
        for variant in variants:
            await conn.execute(VARIANTS[variant].format(s=variant))
    finally:
        await conn.close()


def summarize(rates: dict[tuple[int, str], list[float]], modes: list[str]) -> list[dict[str, Any]]:
    rows = []
    for connections in sorted({c for c, _ in rates}):
        row: dict[str, Any] = {"connections": connections}
        business = statistics.median(rates[connections, "business"])
        row["business"] = round(business)
        for mode in modes[1:]:
            rate = statistics.median(rates[connections, mode])
            row[mode] = round(rate)
            row[f"{mode}_ratio"] = round(rate / business, 3)
        rows.append(row)
    return rows


def show(driver: str, rows: list[dict[str, Any]], modes: list[str]) -> None:
    print(f"\n{driver}: transactions/s (ratio to business only)")
    print("connections  " + "  ".join(f"{m:>16}" for m in modes))
    for row in rows:
        cells = [f"{row['business']:>16}"] + [
            f"{row[m]:>8} ({row[f'{m}_ratio']:.2f})" for m in modes[1:]
        ]
        print(f"{row['connections']:>11}  " + "  ".join(cells))


async def run_postgres(
    args: argparse.Namespace, variants: list[str]
) -> dict[str, list[dict[str, Any]]]:
    await setup_postgres(variants)
    modes = ["business", *variants]
    results: dict[str, list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as relays:
        for variant in variants:
            relays.enter_context(relay_process(BENCH_URL, variant))
        await asyncio.sleep(2)  # the relays are up and idle
        if "asyncpg" in args.drivers:
            rates: dict[tuple[int, str], list[float]] = {}
            pool = await asyncpg.create_pool(
                BENCH_URL, min_size=max(args.connections), max_size=max(args.connections)
            )
            try:
                for _ in range(args.rounds):
                    for connections in args.connections:
                        for mode in modes:
                            schema = None if mode == "business" else mode
                            rate = await asyncpg_rate(pool, schema, connections, args.seconds)
                            rates.setdefault((connections, mode), []).append(rate)
            finally:
                await pool.close()
            results["asyncpg"] = summarize(rates, modes)
            show("asyncpg", results["asyncpg"], modes)
        if "sqlalchemy" in args.drivers:
            rates = {}
            engine = sa.create_engine(
                BENCH_URL.replace("postgresql://", "postgresql+psycopg://"),
                pool_size=max(args.connections),
                max_overflow=0,
            )
            try:
                for _ in range(args.rounds):
                    for connections in args.connections:
                        for mode in modes:
                            schema = None if mode == "business" else mode
                            transaction = sqlalchemy_transaction(engine, schema)
                            rate = await asyncio.to_thread(
                                threaded_rate, transaction, connections, args.seconds
                            )
                            rates.setdefault((connections, mode), []).append(rate)
            finally:
                engine.dispose()
            results["sqlalchemy"] = summarize(rates, modes)
            show("sqlalchemy", results["sqlalchemy"], modes)
    return results


async def run_sqlite(args: argparse.Namespace) -> list[dict[str, Any]]:
    modes = ["business", "enqueue"]
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/bench.db"
        url = f"sqlite:///{path}"
        async with open_store(url) as store:
            await store.migrate()
        with sqlite3.connect(path) as conn:
            conn.execute(
                "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT, total REAL, "
                "created_at REAL DEFAULT (unixepoch('subsec')))"
            )
        rates: dict[tuple[int, str], list[float]] = {}
        with relay_process(url, None):
            await asyncio.sleep(2)
            for _ in range(args.rounds):
                for connections in args.connections:
                    for mode in modes:
                        transaction = sqlite_transaction(path, mode == "enqueue")
                        rate = await asyncio.to_thread(
                            threaded_rate, transaction, connections, args.seconds
                        )
                        rates.setdefault((connections, mode), []).append(rate)
    rows = summarize(rates, modes)
    show("sqlite", rows, modes)
    return rows


async def idle_cost(seconds: float) -> dict[str, float]:
    """CPU seconds of an idle relay process and of its PostgreSQL backends over ``seconds``."""
    await fresh_database()
    name = "idle"
    async with open_store(BENCH_URL, TableNames(schema=name)) as store:
        await store.migrate()
    url = f"{BENCH_URL}?application_name=outboxer-idle-relay"
    with relay_process(url, name) as proc:
        await asyncio.sleep(5)  # started, and backed off to its longest idle wait
        conn = await asyncpg.connect(BENCH_URL)
        try:
            backends = [
                r["pid"]
                for r in await conn.fetch(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
                    "outboxer-idle-relay",
                )
            ]
        finally:
            await conn.close()
        pids = [proc.pid, *backends]
        before = [cpu_seconds(pid) for pid in pids]
        await asyncio.sleep(seconds)
        after = [cpu_seconds(pid) for pid in pids]
    used = [b - a for a, b in zip(before, after, strict=True)]
    result = {
        "seconds": seconds,
        "relay_cpu_s": round(used[0], 3),
        "postgres_cpu_s": round(sum(used[1:]), 3),
        "backends": len(backends),
    }
    print(
        f"idle relay over {seconds:.0f} s: relay process {used[0]:.3f} CPU s, its "
        f"{len(backends)} PostgreSQL backends {sum(used[1:]):.3f} CPU s"
    )
    return result


def main() -> None:
    if sys.argv[1:2] == ["--relay"]:
        relay_main(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
        return
    parser = argparse.ArgumentParser(prog="benchmarks.writers")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", default="1,4,16,32")
    parser.add_argument("--drivers", default="asyncpg,sqlalchemy,sqlite")
    parser.add_argument("--variants", default="notify,polling")
    parser.add_argument("--idle", type=float, default=0, help="measure an idle relay instead")
    parser.add_argument("--save", default="writers")
    args = parser.parse_args()
    if args.idle:
        save(f"{args.save}_idle", asyncio.run(idle_cost(args.idle)))
        return
    args.connections = [int(c) for c in args.connections.split(",")]
    args.drivers = args.drivers.split(",")
    variants = args.variants.split(",")
    result: dict[str, Any] = {
        "seconds_per_sample": args.seconds,
        "rounds": args.rounds,
        "variants": variants,
    }
    if {"asyncpg", "sqlalchemy"} & set(args.drivers):
        result.update(asyncio.run(run_postgres(args, variants)))
    if "sqlite" in args.drivers:
        result["sqlite"] = asyncio.run(run_sqlite(args))
    save(args.save, result)


if __name__ == "__main__":
    main()
