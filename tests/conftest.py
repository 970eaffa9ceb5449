"""Shared fixtures: real services, one fresh schema/file/topic per test.

A missing service fails the test that needs it with the command that starts it; nothing is
skipped.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncmy
import asyncpg
import pytest
import redis.asyncio as aioredis

from outboxer.config import TableNames
from outboxer.outbox import Outbox
from outboxer.stores.mysql import MysqlStore
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.sqlite import SqliteStore
from tests.services import START

PG_URL = os.environ.get("OUTBOXER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
#: The server of MySQL tests; each test gets a fresh database on it (see ``mysql_database``).
MYSQL_URL = os.environ.get("OUTBOXER_TEST_MYSQL", "mysql://root@127.0.0.1:3306/test")


def require_service(name: str, host: str, port: int) -> None:
    """Fail (never skip) with a readable message when a service is not listening."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return
    except OSError as exc:
        pytest.fail(
            f"{name} is not reachable at {host}:{port} ({exc}). Start it with: {START[name]}",
            pytrace=False,
        )


#: The store dialects whose schema tests run on each (``db sql``, Alembic).
DIALECTS = ["postgres", "mysql", "sqlite"]


def require_dialect(dialect: str) -> None:
    """:func:`require_service` for the server of a store dialect (none for SQLite)."""
    if dialect == "postgres":
        require_service("PostgreSQL", "127.0.0.1", 5432)
    elif dialect == "mysql":
        require_service("MariaDB", "127.0.0.1", 3306)


def unique_name(prefix: str = "t") -> str:
    """A short identifier unique to this test run and worker."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def pg_url() -> str:
    require_service("PostgreSQL", "127.0.0.1", 5432)
    return PG_URL


@pytest.fixture
async def pg_schema(pg_url: str) -> AsyncIterator[str]:
    """A fresh PostgreSQL schema for this test, dropped afterwards."""
    schema = unique_name("ob")
    yield schema
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture
async def pg_store(pg_url: str, pg_schema: str) -> AsyncIterator[PostgresStore]:
    """A migrated PostgreSQL store in its own schema."""
    async with PostgresStore(pg_url, TableNames(schema=pg_schema)) as store:
        await store.migrate()
        yield store


async def wait_past_commit_gate(store: PostgresStore, timeout: float = 60.0) -> None:
    """Wait until every committed outbox row has passed the commit-order gate.

    Ordered claims take a row only once no transaction older than its ``txid`` is running
    anywhere in the cluster; tests running in parallel keep short transactions open, so a test
    that expects its rows claimable at once waits for that instant first. The wait is long (60 s)
    because any long transaction in the cluster (another process's bulk load) holds the gate.
    """
    import asyncio
    import time

    deadline = time.monotonic() + timeout
    query = (
        "SELECT coalesce(bool_and(txid IS NULL OR txid <= pg_snapshot_xmin(pg_current_snapshot()))"
        ", true) FROM {outbox}"
    )
    while not (await store.execute(query))[0][0]:
        if time.monotonic() > deadline:
            raise AssertionError("outbox rows stayed behind the commit-order gate")
        await asyncio.sleep(0.005)


async def cached_plan(store: PostgresStore, column: str, value: str, args: str) -> tuple[Any, str]:
    """When the statement cached on the store's (only) connection whose ``column`` of
    ``pg_prepared_statements`` (``statement`` or ``name``) is ``value`` was prepared, and its
    generic plan for ``args`` (``EXPLAIN EXECUTE``: the cached plan, not run)."""
    assert column in ("statement", "name")
    rows = await store.execute(
        f"SELECT name, prepare_time FROM pg_prepared_statements WHERE {column} = $1", value
    )
    assert len(rows) == 1, rows
    plan = await store.execute(f"EXPLAIN EXECUTE {rows[0]['name']}({args})")
    return rows[0]["prepare_time"], "\n".join(r[0] for r in plan)


async def give_up_on(
    store: Any,
    message_id: str,
    *,
    consumer: str = "mailer",
    payload: bytes = b"{}",
    topic: str = "orders",
) -> None:
    """A consumer of ``store`` fails on ``message_id`` (of ``topic``) and gives up at once: a
    consume dead letter, as ``outboxer consume`` writes one."""
    from outboxer.inbox import consume
    from outboxer.message import Message
    from outboxer.ports import ConsumeFailure

    async def failing(message: Message, connection: Any, attempt: int) -> None:
        raise RuntimeError("the mail server said no")

    received = Message(id=message_id, topic=topic, payload=payload)
    outcomes = await consume(
        store,
        consumer,
        [received],
        failing,
        on_failure=lambda message, attempts, error: ConsumeFailure(str(error), None),
        retention_seconds=60,
    )
    assert outcomes == ["dead"]


async def redis_stream_entries(stream: str, page: int = 2000) -> list[tuple[bytes, Any]]:
    """Every entry of a Redis stream, oldest first, read in pages: one XRANGE of tens of
    thousands of entries outlasts redis-py's default 5 s socket timeout (redis-py 8) on a slow
    machine, its RESP3 parser being pure Python."""
    client = aioredis.Redis()
    entries: list[tuple[bytes, Any]] = []
    start = "-"
    try:
        while chunk := await client.xrange(stream, min=start, count=page):
            entries += chunk
            start = "(" + chunk[-1][0].decode()
    finally:
        await client.aclose()
    return entries


@pytest.fixture
def mysql_url() -> str:
    require_service("MariaDB", "127.0.0.1", 3306)
    return MYSQL_URL


async def mysql_connect(database: str | None = None) -> asyncmy.Connection:
    """A plain autocommit connection to the test server, as an application would open one."""
    return await asyncmy.connect(
        host="127.0.0.1", port=3306, user="root", database=database, autocommit=True
    )


@pytest.fixture
async def mysql_database(mysql_url: str) -> AsyncIterator[str]:
    """A fresh MySQL database for this test, dropped afterwards."""
    name = unique_name("ob")
    conn = await mysql_connect()
    try:
        async with conn.cursor() as cur:
            await cur.execute(f"CREATE DATABASE `{name}`")
    finally:
        conn.close()
    yield name
    conn = await mysql_connect()  # a new connection: the test may have restarted the server
    try:
        async with conn.cursor() as cur:
            await cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()


@pytest.fixture
async def mysql_store(mysql_url: str, mysql_database: str) -> AsyncIterator[MysqlStore]:
    """A migrated MySQL store in its own database."""
    async with MysqlStore(mysql_url, TableNames(schema=mysql_database)) as store:
        await store.migrate()
        yield store


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "outbox.db"


@pytest.fixture
async def sqlite_store(sqlite_path: Path) -> AsyncIterator[SqliteStore]:
    async with SqliteStore(sqlite_path) as store:
        await store.migrate()
        yield store


@pytest.fixture
def topic() -> str:
    return unique_name("topic").replace("_", "-")


class Server:
    """One outbox on a server database (PostgreSQL or MariaDB), for tests that run on both: a
    migrated store, more stores of the same outbox, and the application's writes."""

    def __init__(self, url: str, schema: str, store: PostgresStore | MysqlStore) -> None:
        self.url, self.schema, self.store = url, schema, store
        self.mysql = url.startswith("mysql")

    def open_store(self) -> PostgresStore | MysqlStore:
        """Another (not yet opened) store of the same outbox: another relay's."""
        names = TableNames(schema=self.schema)
        return MysqlStore(self.url, names) if self.mysql else PostgresStore(self.url, names)

    async def write(self, messages: list[dict[str, Any]]) -> list[str]:
        """Commit ``messages`` (``enqueue`` arguments) in one transaction, in write order; on
        PostgreSQL, wait until they passed the commit-order gate."""
        outbox = Outbox(schema=self.schema)
        if self.mysql:
            conn = await mysql_connect(self.schema)
            try:
                await conn.begin()
                ids = await outbox.enqueue_many_async(conn, messages)
                await conn.commit()
            finally:
                conn.close()
            return ids
        pg = await asyncpg.connect(self.url)
        try:
            async with pg.transaction():
                ids = await outbox.enqueue_many_async(pg, messages)
        finally:
            await pg.close()
        assert isinstance(self.store, PostgresStore)
        await wait_past_commit_gate(self.store)
        return ids

    async def fill(self, count: int, keys: int | None = None) -> list[str]:
        """``count`` messages of topic ``orders`` (key = n % keys)."""
        return await self.write(
            [
                {"topic": "orders", "payload": {"n": n}, "key": (n % keys) if keys else None}
                for n in range(count)
            ]
        )


@pytest.fixture(params=["postgres", "mariadb"])
def server(request: pytest.FixtureRequest) -> Server:
    """The test runs once on PostgreSQL and once on MariaDB, each in a fresh schema/database."""
    if request.param == "postgres":
        names = ("pg_url", "pg_schema", "pg_store")
    else:
        names = ("mysql_url", "mysql_database", "mysql_store")
    return Server(*(request.getfixturevalue(name) for name in names))
