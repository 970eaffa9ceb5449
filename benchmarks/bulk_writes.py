"""Bulk writes through the public API: ``enqueue`` per message vs ``enqueue_many``.

One connection commits 10,000 messages (≈120-byte JSON payloads, 1,000 keys, an event type) in
one transaction, either by calling ``enqueue``/``enqueue_async`` once per message or by one
``enqueue_many``/``enqueue_many_async`` call; the timed section goes from the first write (the
connection open, its transaction begun) to the commit's return, and includes encoding the
messages. Synchronous commit on. Variants are interleaved in rounds (best of ``ROUNDS``) so
that a noisy neighbour hurts all of them alike. Reported: msg/s each way and the ratio.
Targets (issue "Close to the metal"): ratio ≥ 10 and ``enqueue_many`` ahead of 42k msg/s
(faststream-outbox's batch insert on this machine kind). PostgreSQL through asyncpg, psycopg and
SQLAlchemy on each; SQLite (``sqlite3``, a file in WAL mode as the store sets it up) and MariaDB
(PyMySQL, asyncmy) for comparison.

Run: ``.venv/bin/python -m benchmarks.bulk_writes``
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncmy
import asyncpg
import psycopg
import pymysql  # type: ignore[import-untyped]
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import outboxer
from benchmarks.common import PAYLOAD, PG_URL, fresh_schema, save
from outboxer.config import TableNames
from outboxer.stores.mysql import MysqlStore
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.sqlite import SqliteStore

N = 10_000
ROUNDS = 3
MYSQL_DATABASE = "bench_bulk"  # also the outbox's schema on PostgreSQL
SQLITE_PATH = Path(tempfile.gettempdir()) / "outboxer_bench_bulk.db"


def messages() -> list[dict[str, Any]]:
    return [
        {
            "topic": "orders",
            "payload": {**PAYLOAD, "order_id": n},
            "key": str(n % 1000),
            "type": "OrderCreated",
        }
        for n in range(N)
    ]


# Each driver: an async context manager yielding (connection, is_async) inside a transaction
# that commits when the block ends; it appends the moment the commit returned to ``committed``.
# Opening the connection (and the transaction) is left out of the timed section: PyMySQL 2.2
# loads the system's CA certificates at every connect (20 ms of CPU), a ninth of what
# enqueue_many's 10,000 messages take.
@contextlib.asynccontextmanager
async def asyncpg_tx(committed: list[float]) -> AsyncIterator[tuple[Any, bool]]:
    conn = await asyncpg.connect(PG_URL)
    try:
        async with conn.transaction():
            yield conn, True
        committed.append(time.perf_counter())
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def psycopg_tx(committed: list[float]) -> AsyncIterator[tuple[Any, bool]]:
    with psycopg.connect(PG_URL) as conn:
        with conn.transaction():
            yield conn, False
        committed.append(time.perf_counter())


@contextlib.asynccontextmanager
async def sqlalchemy_psycopg_tx(committed: list[float]) -> AsyncIterator[tuple[Any, bool]]:
    engine = sa.create_engine(PG_URL.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with Session(engine) as session:
            with session.begin():
                # the business statement of a real transaction comes first
                session.execute(sa.text("SELECT 1"))
                yield session, False
            committed.append(time.perf_counter())
    finally:
        engine.dispose()


@contextlib.asynccontextmanager
async def sqlalchemy_asyncpg_tx(committed: list[float]) -> AsyncIterator[tuple[Any, bool]]:
    engine = create_async_engine(PG_URL.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        async with AsyncSession(engine) as session:
            async with session.begin():
                await session.execute(sa.text("SELECT 1"))
                yield session, True
            committed.append(time.perf_counter())
    finally:
        await engine.dispose()


@contextlib.asynccontextmanager
async def sqlite3_tx(committed: list[float]) -> AsyncIterator[tuple[Any, bool]]:
    conn = sqlite3.connect(SQLITE_PATH)
    try:
        with conn:  # commits at the end of the block
            yield conn, False
        committed.append(time.perf_counter())
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def pymysql_tx(committed: list[float]) -> AsyncIterator[tuple[Any, bool]]:
    conn = pymysql.connect(host="127.0.0.1", user="root", database=MYSQL_DATABASE)
    try:
        conn.begin()
        yield conn, False
        conn.commit()
        committed.append(time.perf_counter())
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def asyncmy_tx(committed: list[float]) -> AsyncIterator[tuple[Any, bool]]:
    conn = await asyncmy.connect(host="127.0.0.1", user="root", database=MYSQL_DATABASE)
    try:
        await conn.begin()
        yield conn, True
        await conn.commit()
        committed.append(time.perf_counter())
    finally:
        conn.close()


DRIVERS: dict[
    str, Callable[[list[float]], contextlib.AbstractAsyncContextManager[tuple[Any, bool]]]
] = {
    "asyncpg": asyncpg_tx,
    "psycopg": psycopg_tx,
    "sqlalchemy_psycopg": sqlalchemy_psycopg_tx,
    "sqlalchemy_asyncpg": sqlalchemy_asyncpg_tx,
    "sqlite3": sqlite3_tx,
    "mariadb_pymysql": pymysql_tx,
    "mariadb_asyncmy": asyncmy_tx,
}


def outbox_of(driver: str) -> outboxer.Outbox:
    return outboxer.Outbox() if driver == "sqlite3" else outboxer.Outbox(schema=MYSQL_DATABASE)


async def empty(driver: str) -> None:
    """Delete what a round wrote, so that every round starts from an empty outbox."""
    if driver == "sqlite3":
        with contextlib.closing(sqlite3.connect(SQLITE_PATH)) as lite, lite:
            lite.execute("DELETE FROM outbox")
    elif driver.startswith("mariadb"):
        with contextlib.closing(pymysql.connect(host="127.0.0.1", user="root")) as my:
            my.cursor().execute(f"TRUNCATE `{MYSQL_DATABASE}`.outbox")
    else:
        pg = await asyncpg.connect(PG_URL)
        try:
            await pg.execute(f'TRUNCATE "{MYSQL_DATABASE}".outbox')
        finally:
            await pg.close()


async def write(
    outbox: outboxer.Outbox, conn: Any, is_async: bool, bulk: bool, batch: list[dict[str, Any]]
) -> None:
    """``batch`` through ``enqueue_many`` (``bulk``) or ``enqueue`` per message."""
    if bulk and is_async:
        await outbox.enqueue_many_async(conn, batch)
    elif bulk:
        outbox.enqueue_many(conn, batch)
    elif is_async:
        for message in batch:
            await outbox.enqueue_async(conn, **message)
    else:
        for message in batch:
            outbox.enqueue(conn, **message)


async def rate(driver: str, bulk: bool) -> float:
    outbox = outbox_of(driver)
    batch = messages()
    committed: list[float] = []
    async with DRIVERS[driver](committed) as (conn, is_async):
        started = time.perf_counter()
        await write(outbox, conn, is_async, bulk, batch)
    return N / (committed[0] - started)


async def main() -> dict[str, Any]:
    SQLITE_PATH.unlink(missing_ok=True)
    async with (
        fresh_schema(MYSQL_DATABASE),
        PostgresStore(PG_URL, TableNames(schema=MYSQL_DATABASE)) as pg,
        MysqlStore("mysql://root@127.0.0.1:3306/test", TableNames(schema=MYSQL_DATABASE)) as my,
        SqliteStore(SQLITE_PATH) as lite,
    ):
        for store in (pg, my, lite):
            await store.migrate()
        rates: dict[tuple[str, bool], float] = {}
        try:
            for _ in range(ROUNDS):
                for driver in DRIVERS:
                    for bulk in (False, True):
                        measured = await rate(driver, bulk)
                        rates[driver, bulk] = max(rates.get((driver, bulk), 0.0), measured)
                        await empty(driver)
        finally:
            with contextlib.closing(pymysql.connect(host="127.0.0.1", user="root")) as conn:
                conn.cursor().execute(f"DROP DATABASE IF EXISTS `{MYSQL_DATABASE}`")
            SQLITE_PATH.unlink(missing_ok=True)
    result: dict[str, Any] = {"messages": N, "rounds": ROUNDS}
    for driver in DRIVERS:
        one, many = rates[driver, False], rates[driver, True]
        result[driver] = {
            "enqueue_msg_per_s": round(one),
            "enqueue_many_msg_per_s": round(many),
            "ratio": round(many / one, 1),
        }
        print(
            f"{driver:20} enqueue {one:7.0f} msg/s  enqueue_many {many:7.0f} msg/s  "
            f"×{many / one:.1f}"
        )
    save("bulk_writes", result)
    return result


if __name__ == "__main__":
    asyncio.run(main())
