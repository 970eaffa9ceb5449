"""``enqueue`` and ``enqueue_many`` in the caller's transaction, for every supported connection.

Each connection kind opens a connection and a transaction that commits when its block ends and
rolls back when the block raises. For every kind: a committed message is there (and a relay
delivers it), a rolled-back one never exists; ``enqueue_many`` writes the same rows as
``enqueue``, in order, atomically; every refused value raises an ``OutboxerError`` and leaves
the transaction usable (a later statement succeeds and commits).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import inspect
import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import aiomysql
import aiosqlite
import asyncmy
import asyncpg
import MySQLdb
import psycopg
import pydantic
import pymysql
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    MappedAsDataclass,
    Session,
    mapped_column,
    scoped_session,
    sessionmaker,
)

import outboxer
from outboxer.config import Backoff, RelaySettings, TableNames
from outboxer.errors import ConfigurationError, OutboxerError
from outboxer.ports import ClaimRequest
from outboxer.relay import Relay
from outboxer.stores.postgres import PostgresStore
from outboxer.testing import RecordingPublisher
from tests.conftest import unique_name, wait_past_commit_gate


class Rollback(Exception):
    pass


async def pending_ids(store: Any) -> set[str]:
    rows = await store.execute("SELECT id FROM {outbox}")
    return {r["id"] for r in rows}


async def delivered_ids(store: Any) -> set[str]:
    publisher = RecordingPublisher()
    quick = RelaySettings(poll_interval=0.05, retry=Backoff(0.01, 2, 0.02))
    await Relay(store, publisher, quick).drain(timeout=10)
    return {m.id for m in publisher.messages}


# -- connection kinds --------------------------------------------------------------------------


class MyPsycopgConnection(psycopg.Connection[Any]):
    """An application's own subclass: dispatch must recognise it by isinstance."""


class MySqliteConnection(sqlite3.Connection):
    pass


@contextlib.contextmanager
def psycopg_tx(url: str) -> Iterator[Any]:
    with psycopg.connect(url) as conn, conn.transaction():
        yield conn


@contextlib.contextmanager
def psycopg_subclass_tx(url: str) -> Iterator[Any]:
    with MyPsycopgConnection.connect(url) as conn, conn.transaction():
        yield conn


@contextlib.contextmanager
def psycopg_cursor_tx(url: str) -> Iterator[Any]:
    with psycopg.connect(url) as conn, conn.transaction(), conn.cursor() as cursor:
        yield cursor


@contextlib.contextmanager
def engine(url: str, driver: str) -> Iterator[sa.Engine]:
    if url.startswith("postgresql://"):
        url = url.replace("postgresql://", f"postgresql+{driver}://")
    made = sa.create_engine(url)
    try:
        yield made
    finally:
        made.dispose()


@contextlib.asynccontextmanager
async def async_engine(url: str, driver: str) -> AsyncIterator[AsyncEngine]:
    made = create_async_engine(url.replace("postgresql://", f"postgresql+{driver}://"))
    try:
        yield made
    finally:
        await made.dispose()


@contextlib.contextmanager
def sqlalchemy_session_tx(url: str) -> Iterator[Any]:
    with engine(url, "psycopg") as made, Session(made) as session, session.begin():
        yield session


@contextlib.contextmanager
def sqlalchemy_connection_tx(url: str) -> Iterator[Any]:
    with engine(url, "psycopg") as made, made.begin() as conn:
        yield conn


@contextlib.contextmanager
def scoped_session_tx(url: str) -> Iterator[Any]:
    with engine(url, "psycopg") as made:
        registry = scoped_session(sessionmaker(made))
        try:
            with registry.begin():
                yield registry
        finally:
            registry.remove()


@contextlib.asynccontextmanager
async def asyncpg_tx(url: str) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            yield conn
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def asyncpg_jsonb_codec_tx(url: str) -> AsyncIterator[Any]:
    # A codec many applications install: it must change nothing in what the outbox stores.
    conn = await asyncpg.connect(url)
    try:
        await conn.set_type_codec(
            "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )
        async with conn.transaction():
            yield conn
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def asyncpg_pool_tx(url: str) -> AsyncIterator[Any]:
    async with (
        asyncpg.create_pool(url, min_size=1, max_size=1) as pool,
        pool.acquire() as conn,
        conn.transaction(),
    ):
        yield conn  # a PoolConnectionProxy


@contextlib.asynccontextmanager
async def psycopg_async_tx(url: str) -> AsyncIterator[Any]:
    async with await psycopg.AsyncConnection.connect(url) as conn, conn.transaction():
        yield conn


@contextlib.asynccontextmanager
async def sqlalchemy_async_session_tx(url: str) -> AsyncIterator[Any]:
    async with (
        async_engine(url, "asyncpg") as made,
        AsyncSession(made) as session,
        session.begin(),
    ):
        yield session


@contextlib.asynccontextmanager
async def sqlalchemy_async_connection_tx(url: str) -> AsyncIterator[Any]:
    async with async_engine(url, "psycopg") as made, made.begin() as conn:
        yield conn


@contextlib.contextmanager
def sqlite3_tx(path: str, factory: type[sqlite3.Connection] = sqlite3.Connection) -> Iterator[Any]:
    conn = sqlite3.connect(path, factory=factory)
    try:
        with conn:  # commits, or rolls back on an exception
            yield conn
    finally:
        conn.close()


@contextlib.contextmanager
def sqlite3_subclass_tx(path: str) -> Iterator[Any]:
    with sqlite3_tx(path, MySqliteConnection) as conn:
        yield conn


@contextlib.contextmanager
def sqlite3_cursor_tx(path: str) -> Iterator[Any]:
    with sqlite3_tx(path) as conn:
        yield conn.cursor()


@contextlib.contextmanager
def sqlalchemy_sqlite_tx(path: str) -> Iterator[Any]:
    with engine(f"sqlite:///{path}", "") as made, Session(made) as session, session.begin():
        yield session


@contextlib.asynccontextmanager
async def aiosqlite_tx(path: str) -> AsyncIterator[Any]:
    async with aiosqlite.connect(path) as conn:
        try:
            yield conn
        except BaseException:
            await conn.rollback()
            raise
        await conn.commit()


@contextlib.asynccontextmanager
async def sqlalchemy_aiosqlite_tx(path: str) -> AsyncIterator[Any]:
    async with async_engine(f"sqlite+aiosqlite:///{path}", "") as made, made.begin() as conn:
        yield conn


@contextlib.contextmanager
def pymysql_tx(database: str, cursor: bool = False) -> Iterator[Any]:
    conn = pymysql.connect(host="127.0.0.1", user="root", database=database)
    try:
        with conn.cursor() as cur:
            cur.execute("START TRANSACTION")
            yield cur if cursor else conn
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.close()


@contextlib.contextmanager
def pymysql_cursor_tx(database: str) -> Iterator[Any]:
    with pymysql_tx(database, cursor=True) as cursor:
        yield cursor


@contextlib.contextmanager
def mysqlclient_tx(database: str) -> Iterator[Any]:
    conn = MySQLdb.connect(host="127.0.0.1", user="root", database=database)
    try:
        yield conn  # MySQLdb connections start outside autocommit: the INSERT opens a tx
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def async_mysql_tx(conn: Any) -> AsyncIterator[Any]:
    """``conn`` (asyncmy or aiomysql, same API) in a transaction, committed at the end."""
    await conn.begin()
    try:
        yield conn
        await conn.commit()
    except BaseException:
        await conn.rollback()
        raise


@contextlib.asynccontextmanager
async def asyncmy_tx(database: str) -> AsyncIterator[Any]:
    conn = await asyncmy.connect(host="127.0.0.1", user="root", database=database)
    try:
        async with async_mysql_tx(conn):
            yield conn
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def asyncmy_pool_tx(database: str) -> AsyncIterator[Any]:
    async with (
        asyncmy.create_pool(host="127.0.0.1", user="root", database=database, maxsize=1) as pool,
        pool.acquire() as conn,
        async_mysql_tx(conn),
    ):
        yield conn


@contextlib.asynccontextmanager
async def aiomysql_tx(database: str) -> AsyncIterator[Any]:
    conn = await aiomysql.connect(host="127.0.0.1", user="root", db=database)
    try:
        async with async_mysql_tx(conn):
            yield conn
    finally:
        conn.close()


def mysql_url(database: str, driver: str, dialect: str = "mysql") -> str:
    return f"{dialect}+{driver}://root@127.0.0.1:3306/{database}"


@contextlib.contextmanager
def sqlalchemy_mysql_session_tx(database: str) -> Iterator[Any]:
    with (
        engine(mysql_url(database, "pymysql"), "") as made,
        Session(made) as session,
        session.begin(),
    ):
        yield session


@contextlib.contextmanager
def sqlalchemy_mariadb_connection_tx(database: str) -> Iterator[Any]:
    with engine(mysql_url(database, "pymysql", "mariadb"), "") as made, made.begin() as conn:
        yield conn


@contextlib.asynccontextmanager
async def sqlalchemy_asyncmy_session_tx(database: str) -> AsyncIterator[Any]:
    async with (
        async_engine(mysql_url(database, "asyncmy"), "") as made,
        AsyncSession(made) as session,
        session.begin(),
    ):
        yield session


@contextlib.asynccontextmanager
async def sqlalchemy_aiomysql_connection_tx(database: str) -> AsyncIterator[Any]:
    async with async_engine(mysql_url(database, "aiomysql"), "") as made, made.begin() as conn:
        yield conn


@dataclasses.dataclass(frozen=True)
class Kind:
    """A way of holding a connection in a transaction, on PostgreSQL, SQLite or MariaDB."""

    open: Callable[[str], Any]  # target -> (async) context manager of a connection in a tx
    database: str

    @property
    def is_async(self) -> bool:
        return inspect.isasyncgenfunction(getattr(self.open, "__wrapped__", None))

    def __str__(self) -> str:
        return self.open.__name__.removesuffix("_tx")


KINDS = [
    *(
        Kind(opener, "postgres")
        for opener in (
            psycopg_tx,
            psycopg_subclass_tx,
            psycopg_cursor_tx,
            sqlalchemy_session_tx,
            sqlalchemy_connection_tx,
            scoped_session_tx,
            asyncpg_tx,
            asyncpg_jsonb_codec_tx,
            asyncpg_pool_tx,
            psycopg_async_tx,
            sqlalchemy_async_session_tx,
            sqlalchemy_async_connection_tx,
        )
    ),
    *(
        Kind(opener, "sqlite")
        for opener in (
            sqlite3_tx,
            sqlite3_subclass_tx,
            sqlite3_cursor_tx,
            sqlalchemy_sqlite_tx,
            aiosqlite_tx,
            sqlalchemy_aiosqlite_tx,
        )
    ),
    *(
        Kind(opener, "mysql")
        for opener in (
            pymysql_tx,
            pymysql_cursor_tx,
            mysqlclient_tx,
            asyncmy_tx,
            asyncmy_pool_tx,
            aiomysql_tx,
            sqlalchemy_mysql_session_tx,
            sqlalchemy_mariadb_connection_tx,
            sqlalchemy_asyncmy_session_tx,
            sqlalchemy_aiomysql_connection_tx,
        )
    ),
]


@dataclasses.dataclass
class Tx:
    """The write API on one connection, awaited the same way whatever the kind."""

    conn: Any
    is_async: bool
    outbox: outboxer.Outbox

    async def enqueue(self, topic: str, payload: object, **options: Any) -> str:
        if self.is_async:
            return await self.outbox.enqueue_async(self.conn, topic, payload, **options)
        return self.outbox.enqueue(self.conn, topic, payload, **options)

    async def enqueue_many(self, messages: list[dict[str, Any]]) -> list[str]:
        if self.is_async:
            return await self.outbox.enqueue_many_async(self.conn, messages)
        return self.outbox.enqueue_many(self.conn, messages)


@dataclasses.dataclass
class Database:
    kind: Kind
    target: str  # URL or SQLite path
    store: Any
    outbox: outboxer.Outbox

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        if self.kind.is_async:
            async with self.kind.open(self.target) as conn:
                yield Tx(conn, True, self.outbox)
        else:
            with self.kind.open(self.target) as conn:
                yield Tx(conn, False, self.outbox)

    async def rows(self) -> list[dict[str, Any]]:
        """Every outbox row in write order, as comparable values."""
        headers = "headers::text" if self.kind.database == "postgres" else "headers"
        key = "`key`" if self.kind.database == "mysql" else "key"
        found = await self.store.execute(
            f"SELECT id, topic, {key}, type, payload, content_type, "
            f"{headers} AS headers, available_at, created_at FROM {{outbox}} ORDER BY seq"
        )
        return [
            {
                **{name: mysql_value(value) for name, value in dict(r).items()},
                "payload": bytes(r["payload"]),
                "headers": json.loads(r["headers"]),
            }
            for r in found
        ]


def mysql_value(value: Any) -> Any:
    """MySQL's UTC DATETIME as an aware datetime."""
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value


@pytest.fixture(params=KINDS, ids=str)
def database(request: pytest.FixtureRequest) -> Database:
    return _database(request, request.param)


@pytest.fixture(params=[kind for kind in KINDS if kind.database != "sqlite"], ids=str)
def streaming_database(request: pytest.FixtureRequest) -> Database:
    """The kinds whose writer streams a long batch (``insert_chunks``): PostgreSQL's, MySQL's."""
    return _database(request, request.param)


@pytest.fixture(
    params=[kind for kind in KINDS if kind.database != "sqlite" and kind.is_async], ids=str
)
def async_streaming_database(request: pytest.FixtureRequest) -> Database:
    """The asynchronous kinds of :func:`streaming_database`: a task that may be cancelled."""
    return _database(request, request.param)


@pytest.fixture(
    params=[kind for kind in KINDS if kind.database == "postgres" and kind.is_async], ids=str
)
def async_postgres_database(request: pytest.FixtureRequest) -> Database:
    """The asynchronous kinds on PostgreSQL: their streamed batch is held by a savepoint that a
    cancellation rolls back too."""
    return _database(request, request.param)


@pytest.fixture(
    params=[
        kind for kind in KINDS if kind.open in (sqlalchemy_session_tx, sqlalchemy_mysql_session_tx)
    ],
    ids=str,
)
def orm_database(request: pytest.FixtureRequest) -> Database:
    """SQLAlchemy ``Session`` on PostgreSQL (psycopg) and MariaDB (PyMySQL)."""
    return _database(request, request.param)


@pytest.fixture(params=[kind for kind in KINDS if kind.database != "postgres"], ids=str)
def lenient_database(request: pytest.FixtureRequest) -> Database:
    """The kinds whose transaction goes on after a failed statement (SQLite's, MySQL's; on
    PostgreSQL it is aborted, so nothing of it can commit)."""
    return _database(request, request.param)


@pytest.fixture(params=[kind for kind in KINDS if kind.database == "mysql"], ids=str)
def mysql_kind(request: pytest.FixtureRequest) -> Database:
    """The MySQL/MariaDB kinds: their writers check a large statement against the server."""
    return _database(request, request.param)


@pytest.fixture(
    params=[kind for kind in KINDS if str(kind).startswith(("sqlalchemy", "scoped_session"))],
    ids=str,
)
def sqlalchemy_database(request: pytest.FixtureRequest) -> Database:
    """The SQLAlchemy kinds, sync and async, on every database."""
    return _database(request, request.param)


def _database(request: pytest.FixtureRequest, kind: Kind) -> Database:
    if kind.database == "postgres":
        store = request.getfixturevalue("pg_store")
        url = request.getfixturevalue("pg_url")
        return Database(kind, url, store, outboxer.Outbox(schema=store.names.schema))
    if kind.database == "mysql":
        store = request.getfixturevalue("mysql_store")
        database = request.getfixturevalue("mysql_database")
        return Database(kind, database, store, outboxer.Outbox(schema=database))
    store = request.getfixturevalue("sqlite_store")
    return Database(kind, str(request.getfixturevalue("sqlite_path")), store, outboxer.Outbox())


# -- enqueue: atomic with the caller's transaction ------------------------------------------------


async def test_enqueue_commits_and_rolls_back_with_the_caller(database: Database) -> None:
    async with database.transaction() as tx:
        kept = await tx.enqueue("orders", {"n": 1}, key="1")
    with contextlib.suppress(Rollback):
        async with database.transaction() as tx:
            await tx.enqueue("orders", {"n": 2}, id="rolled-back")
            raise Rollback
    assert await pending_ids(database.store) == {kept}
    assert await delivered_ids(database.store) == {kept}


def test_a_connection_of_no_known_driver_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="does not know"):
        outboxer.enqueue(object(), "t", {})
    with pytest.raises(ConfigurationError, match="does not know"):
        outboxer.enqueue_many(object(), [{"topic": "t", "payload": {}}])


# -- enqueue_many ---------------------------------------------------------------------------------

# Text that COPY's text format must escape (tab, newline, backslash) and non-ASCII text.
SPECS: list[dict[str, Any]] = [
    {
        "topic": "orders",
        "payload": {"n": 1, "é": "ü"},
        "key": "k\t1",
        "type": "OrderCreated",
        "headers": {"h": "v\tw\nx\\y", "ü": "ß"},
    },
    {"topic": "orders", "payload": "text\tü\\"},
    {"topic": "orders\nsub", "payload": b"\x00\xff\\", "key": 7},
    {"topic": "t2", "payload": [1, 2.5, None], "headers": {}},
]
LATER = dt.datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    """A row without what differs between two writes of one message (id, clocks)."""
    available = row["available_at"]
    return {
        **{k: v for k, v in row.items() if k not in ("id", "created_at", "available_at")},
        # the database's now() when not given; the given instant otherwise
        "available_at": None if available == row["created_at"] else available,
    }


async def test_enqueue_many_writes_what_enqueue_writes_in_order(database: Database) -> None:
    async with database.transaction() as tx:
        singles = [
            await tx.enqueue(**spec) for spec in [*SPECS, {**SPECS[0], "available_at": LATER}]
        ]
        many = await tx.enqueue_many(SPECS)  # COPY where the driver has it
        delayed = await tx.enqueue_many([SPECS[1], {**SPECS[0], "available_at": LATER}])
    rows = await database.rows()
    assert [r["id"] for r in rows] == singles + many + delayed  # ids returned in write order
    by_id = {r["id"]: comparable(r) for r in rows}
    expected = [by_id[i] for i in singles]
    assert [by_id[i] for i in many] == expected[:4]
    assert [by_id[i] for i in delayed] == [expected[1], expected[4]]
    assert expected[4]["available_at"] in (LATER, LATER.timestamp())


class NoOffset(dt.tzinfo):
    """A zone that gives no offset: Python treats such a datetime as naive."""

    def utcoffset(self, when: dt.datetime | None) -> None:
        return None

    def dst(self, when: dt.datetime | None) -> None:
        return None


async def test_a_datetime_whose_zone_gives_no_offset_is_utc_like_a_naive_one(
    database: Database,
) -> None:
    """Found by a probe: psycopg raised a bare TypeError for it (asyncpg and PyMySQL took
    it as UTC)."""
    naive = LATER.replace(tzinfo=None)
    async with database.transaction() as tx:
        ids = [
            await tx.enqueue(topic="t", payload={}, available_at=naive.replace(tzinfo=zone))
            for zone in (None, NoOffset())
        ]
    stored = {r["id"]: r["available_at"] for r in await database.rows()}
    assert stored[ids[0]] == stored[ids[1]] and stored[ids[0]] in (LATER, LATER.timestamp())


async def test_enqueue_many_of_thousands_keeps_their_order(database: Database) -> None:
    # more rows than a writer puts in one chunk of its COPY or multi-row INSERT
    messages = [{"topic": "t", "payload": {"n": n}, "key": f"k{n % 7}"} for n in range(2500)]
    async with database.transaction() as tx:
        ids = await tx.enqueue_many(messages)
    rows = await database.rows()
    assert [r["id"] for r in rows] == ids
    assert [json.loads(r["payload"])["n"] for r in rows] == list(range(2500))


async def test_large_payloads_are_written_whole(database: Database) -> None:
    # MySQL: more than one chunk by bytes (about 1 MB of SQL each), and payloads over 64 kB,
    # which go as parameters (aiomysql: hex digits), beside small ones written as literals
    large = bytes(range(256)) * 1000 + b"%s%%'\\"
    payloads = [large[: 300_000 + n] if n % 3 else b"%s'\x00" for n in range(10)]
    async with database.transaction() as tx:
        many = await tx.enqueue_many([{"topic": "t", "payload": p} for p in payloads])
        one = await tx.enqueue("t", large)
    rows = await database.rows()
    assert [r["id"] for r in rows] == [*many, one]
    assert [r["payload"] for r in rows] == [*payloads, large]


async def test_enqueue_many_is_atomic_with_the_caller(database: Database) -> None:
    for size in (len(SPECS), 150):  # (150: SQLAlchemy's asyncpg adapter begins, then COPY)
        with contextlib.suppress(Rollback):
            async with database.transaction() as tx:
                # the first statement of the transaction (SQLAlchemy's asyncpg adapter: not
                # begun on the database yet)
                await tx.enqueue_many(
                    [{**SPECS[n % len(SPECS)], "id": f"gone-{n}"} for n in range(size)]
                )
                raise Rollback
    async with database.transaction() as tx:
        kept = await tx.enqueue_many(SPECS[:2])
        assert await tx.enqueue_many([]) == []
    assert [r["id"] for r in await database.rows()] == kept


# -- payloads and options ----------------------------------------------------------------------


@dataclasses.dataclass
class OrderPlaced:
    order_id: int
    placed_at: dt.datetime


class UserRegistered(pydantic.BaseModel):
    user_id: int
    email: str


@pytest.fixture
def outbox(pg_schema: str) -> outboxer.Outbox:
    return outboxer.Outbox(schema=pg_schema)


@pytest.fixture
async def asyncpg_conn(pg_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(pg_url)
    yield conn
    await conn.close()


async def test_payload_kinds_and_options_round_trip(
    pg_store: PostgresStore, asyncpg_conn: asyncpg.Connection, outbox: outboxer.Outbox
) -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    payloads: list[tuple[object, bytes, str]] = [
        ({"a": [1, 2]}, b'{"a":[1,2]}', "application/json"),
        ([1, "x"], b'[1,"x"]', "application/json"),
        ("héllo", "héllo".encode(), "text/plain; charset=utf-8"),
        (b"\x00\xff", b"\x00\xff", "application/octet-stream"),
        (
            OrderPlaced(7, when),
            b'{"order_id":7,"placed_at":"2026-01-02T03:04:05+00:00"}',
            "application/json",
        ),
        (
            UserRegistered(user_id=1, email="a@b.c"),
            b'{"user_id":1,"email":"a@b.c"}',
            "application/json",
        ),
    ]
    async with asyncpg_conn.transaction():
        for n, (payload, _, _) in enumerate(payloads):
            await outbox.enqueue_async(
                asyncpg_conn, "t", payload, key=n, type="T", headers={"n": str(n)}, id=f"id-{n}"
            )
    await wait_past_commit_gate(pg_store)
    claim = await pg_store.claim_batch(
        ClaimRequest(limit=10, lease_seconds=5, ordered=True, relay_id="r")
    )
    got = {m.id: m for m in claim.messages}
    for n, (_, body, content_type) in enumerate(payloads):
        message = got[f"id-{n}"]
        assert (message.payload, message.content_type) == (body, content_type)
        assert (message.key, message.type, dict(message.headers)) == (str(n), "T", {"n": str(n)})


def circular() -> dict[str, Any]:
    payload: dict[str, Any] = {}
    payload["self"] = payload
    return payload


def deeply_nested(depth: int = 100_000) -> list[Any]:
    payload: list[Any] = []
    for _ in range(depth):
        payload = [payload]
    return payload


WEST, EAST = (dt.timezone(dt.timedelta(hours=hours)) for hours in (-5, 5))
# Every value PostgreSQL (or a broker's short string) would refuse, and every type we cannot encode.
BAD_CALLS: list[dict[str, Any]] = [
    {"topic": "", "payload": {}},
    {"topic": 5, "payload": {}},
    {"topic": "t\x00", "payload": {}},
    {"topic": "t\ud800", "payload": {}},
    {"topic": "t" * 256, "payload": {}},
    {"topic": "t", "payload": object()},
    {"topic": "t", "payload": float("nan")},
    {"topic": "t", "payload": {"x": [float("inf")]}},
    {"topic": "t", "payload": circular()},
    {"topic": "t", "payload": deeply_nested()},
    {"topic": "t", "payload": {(1, 2): "tuple key"}},
    {"topic": "t", "payload": 10**5000},
    {"topic": "t", "payload": "lone \udfff surrogate"},
    {"topic": "t", "payload": {}, "key": 1.5},
    {"topic": "t", "payload": {}, "key": "k\x00"},
    {"topic": "t", "payload": {}, "key": "\ud83d"},
    {"topic": "t", "payload": {}, "key": "k" * 256},
    {"topic": "t", "payload": {}, "key": "é" * 128},  # 256 bytes of UTF-8
    {"topic": "t", "payload": {}, "key": 10**5000},
    {"topic": "t", "payload": {}, "type": 3},
    {"topic": "t", "payload": {}, "type": "T\x00"},
    {"topic": "t", "payload": {}, "type": "T" * 256},
    {"topic": "t", "payload": {}, "id": ""},
    {"topic": "t", "payload": {}, "id": "id\x00"},
    {"topic": "t", "payload": {}, "id": "i" * 256},
    {"topic": "t", "payload": {}, "headers": {"n": 1}},
    {"topic": "t", "payload": {}, "headers": {1: "v"}},
    {"topic": "t", "payload": {}, "headers": ["not", "a", "mapping"]},
    {"topic": "t", "payload": {}, "headers": {"h": "v\x00"}},
    {"topic": "t", "payload": {}, "headers": {"h": "\udc80"}},
    {"topic": "t", "payload": {}, "headers": {"\ud800": "v"}},
    {"topic": "t", "payload": {}, "headers": {"h" * 256: "v"}},
    {"topic": "t", "payload": {}, "available_at": "tomorrow"},
    {"topic": "t", "payload": {}, "available_at": dt.timedelta(days=999_999_999)},
    {"topic": "t", "payload": {}, "available_at": -dt.timedelta(days=999_999_999)},
    # within years 1-9999 as given, not in UTC (which asyncpg and the MySQL writers convert to)
    {"topic": "t", "payload": {}, "available_at": dt.datetime.max.replace(tzinfo=WEST)},
    {"topic": "t", "payload": {}, "available_at": dt.datetime.min.replace(tzinfo=EAST)},
]
GOOD = {"topic": "t", "payload": {"fine": True}}
BAD_BATCHES: list[list[Any]] = [
    [GOOD, {"topic": "t"}],
    [GOOD, {"topic": "t", "payload": {}, "bogus": 1}],
    [GOOD, ("t", {})],
    [{**GOOD, "id": "twice"}, {**GOOD, "id": "twice"}],
    *([GOOD, call] for call in BAD_CALLS),
]


# What is no batch at all: one message's mapping (whose keys were taken for messages), a string,
# nothing.
NOT_BATCHES: list[Any] = [GOOD, "topic", b"topic", None, 3]


async def test_refused_values_leave_the_transaction_usable(database: Database) -> None:
    async with database.transaction() as tx:
        for call in BAD_CALLS:
            with pytest.raises(OutboxerError):
                await tx.enqueue(**call)
        for batch in BAD_BATCHES:
            with pytest.raises(OutboxerError, match=r"^message 1: "):
                await tx.enqueue_many(batch)
        for not_a_batch in NOT_BATCHES:
            with pytest.raises(OutboxerError, match=r"^messages must be an iterable of mappings"):
                await tx.enqueue_many(not_a_batch)
        # the wrong twin is refused before any SQL too
        if tx.is_async:
            with pytest.raises(ConfigurationError, match=r"asynchronous: use 'await enqueue_as"):
                database.outbox.enqueue(tx.conn, "t", {})
            with pytest.raises(ConfigurationError, match=r"use 'await enqueue_many_async\("):
                database.outbox.enqueue_many(tx.conn, [GOOD])
        else:
            with pytest.raises(ConfigurationError, match=r"synchronous: use 'enqueue\("):
                await database.outbox.enqueue_async(tx.conn, "t", {})
            with pytest.raises(ConfigurationError, match=r"synchronous: use 'enqueue_many\("):
                await database.outbox.enqueue_many_async(tx.conn, [GOOD])
        # on PostgreSQL, any failed statement would have aborted the transaction
        kept = [await tx.enqueue(**GOOD), *await tx.enqueue_many([GOOD])]
    assert [r["id"] for r in await database.rows()] == kept


async def test_a_message_refused_late_in_a_long_batch_writes_none_of_it(
    database: Database,
) -> None:
    """PostgreSQL's COPY stores a long batch a chunk at a time while the next is validated
    (``Outbox.STREAM_CHUNK``): a message refused in a later chunk rolls the earlier ones back,
    and the caller's transaction stays usable, as when the whole batch is validated first."""
    good = [{"topic": "t", "payload": {"n": n}, "key": f"k{n % 7}"} for n in range(2500)]
    refused = {**GOOD, "payload": float("nan")}
    twice = {**GOOD, "id": "twice"}
    async with database.transaction() as tx:
        before = await tx.enqueue_many(good[:3])
        with pytest.raises(OutboxerError, match=r"^message 2300: cannot serialize payload"):
            await tx.enqueue_many([*good[:2300], refused, *good[2300:]])
        with pytest.raises(OutboxerError, match=r"^message 2200: id 'twice' appears twice"):
            await tx.enqueue_many([twice, *good[1:2200], twice, *good[2200:]])
        after = await tx.enqueue_many(good)
    assert [r["id"] for r in await database.rows()] == [*before, *after]


async def test_a_chunk_the_database_refuses_late_in_a_long_batch_writes_none_of_it(
    streaming_database: Database,
) -> None:
    """The database itself refuses a later chunk of a streamed batch (an id stored before):
    the chunks it stored are rolled back with it, and the caller's transaction stays usable."""
    database = streaming_database
    good = [{"topic": "t", "payload": {"n": n}} for n in range(2500)]
    async with database.transaction() as tx:
        [stored] = await tx.enqueue_many([GOOD])
        with pytest.raises(Exception, match=r"(?i)duplicate|unique") as refused:
            await tx.enqueue_many([*good[:2200], {**GOOD, "id": stored}, *good[2200:]])
        assert not isinstance(refused.value, OutboxerError)  # the database's, not ours
        after = await tx.enqueue_many(good)
    assert [r["id"] for r in await database.rows()] == [stored, *after]


def forging(filler: int) -> bytes:
    """A payload that, escaped with backslashes in a session that reads them as plain
    characters, ends its string and writes a second, forged outbox row."""
    forged = ", ".join(
        f"0x{text.encode().hex()}" if text else text
        for text in ("forged-id", "payments", "NULL", "NULL", '{"amount":1}', "application/json")
    )
    return b"A" * filler + f"', 0x7b7d, 0x7b7d, DEFAULT), ({forged}, 0x7b7d, DEFAULT) -- ".encode()


@pytest.mark.parametrize("through", ["asyncmy", "sqlalchemy"])
async def test_values_cannot_write_sql_of_their_own_without_backslash_escapes(
    through: str, mysql_database: str, mysql_store: Any
) -> None:
    """asyncmy escapes parameters with backslashes even in a session with
    ``NO_BACKSLASH_ESCAPES``: a payload sent as one (a large one, or any through SQLAlchemy)
    wrote a forged row. Every value goes as hex digits now: stored as given, nothing else."""
    outbox = outboxer.Outbox(schema=mysql_database)
    mode = "SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')"
    messages = [
        {"topic": "t'\\", "payload": forging(filler), "key": "k'\\", "headers": {"h": "'\\\""}}
        for filler in (100, 70_000)
    ]
    if through == "asyncmy":
        conn = await asyncmy.connect(host="127.0.0.1", user="root", database=mysql_database)
        try:
            async with conn.cursor() as cursor:
                await cursor.execute(mode)
            ids = [await outbox.enqueue_async(conn, **m) for m in messages]
            ids += await outbox.enqueue_many_async(conn, messages)
            await conn.commit()
        finally:
            conn.close()
    else:
        url = mysql_url(mysql_database, "asyncmy")
        async with (
            async_engine(url, "") as made,
            AsyncSession(made) as session,
            session.begin(),
        ):
            await session.execute(sa.text(mode))
            ids = [await outbox.enqueue_async(session, **m) for m in messages]
            ids += await outbox.enqueue_many_async(session, messages)
    rows = await mysql_store.execute(
        "SELECT id, topic, `key`, payload, headers FROM {outbox} ORDER BY seq"
    )
    stored = [
        (r["id"], r["topic"], r["key"], bytes(r["payload"]), json.loads(r["headers"])) for r in rows
    ]
    assert stored == [
        (id_, m["topic"], m["key"], m["payload"], m["headers"])
        for id_, m in zip(ids, [*messages, *messages], strict=True)
    ]


@pytest.mark.parametrize("driver", ["pymysql", "asyncmy"])
async def test_sqlalchemy_in_autocommit_refuses_a_payload_over_max_allowed_packet_first(
    driver: str, mysql_database: str, mysql_store: Any
) -> None:
    """In autocommit mode each statement commits at once: the check before anything is sent
    is what keeps a batch with one oversize message from committing its first rows (and the
    server from dropping the connection), through SQLAlchemy as through the drivers."""
    [row] = await mysql_store.execute("SELECT @@max_allowed_packet AS packet")
    huge = {"topic": "t", "payload": b"x" * (int(row["packet"]) + 1)}
    outbox = outboxer.Outbox(schema=mysql_database)
    url = mysql_url(mysql_database, driver)
    if driver == "pymysql":
        with engine(url, "") as made, made.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            with pytest.raises(ConfigurationError, match=r"^message 2: .*max_allowed_packet"):
                outbox.enqueue_many(conn, [GOOD, GOOD, huge])
            with pytest.raises(ConfigurationError, match="max_allowed_packet"):
                outbox.enqueue(conn, **huge)
            ids = [outbox.enqueue(conn, **GOOD)]
    else:
        async with async_engine(url, "") as made, made.connect() as aconn:
            aconn = await aconn.execution_options(isolation_level="AUTOCOMMIT")
            with pytest.raises(ConfigurationError, match=r"^message 2: .*max_allowed_packet"):
                await outbox.enqueue_many_async(aconn, [GOOD, GOOD, huge])
            with pytest.raises(ConfigurationError, match="max_allowed_packet"):
                await outbox.enqueue_async(aconn, **huge)
            ids = [await outbox.enqueue_async(aconn, **GOOD)]
    assert [r["id"] for r in await mysql_store.execute("SELECT id FROM {outbox}")] == ids


@pytest.mark.parametrize("driver", ["pymysql", "aiomysql", "asyncmy"])
async def test_an_unread_unbuffered_result_is_not_thrown_away(
    driver: str, mysql_database: str, mysql_store: Any
) -> None:
    """With an ``SSCursor``'s rows still to read, the next statement on the connection would
    drain them without a word (these drivers do): the write is refused, nothing written, and
    the caller reads all its rows, then writes."""
    outbox = outboxer.Outbox(schema=mysql_database)
    query = "SELECT seq FROM seq_1_to_100"  # (MariaDB's sequence engine)
    if driver == "pymysql":
        conn = pymysql.connect(host="127.0.0.1", user="root", database=mysql_database)
        try:
            cursor = conn.cursor(pymysql.cursors.SSCursor)
            cursor.execute(query)
            first = cursor.fetchone()
            with pytest.raises(ConfigurationError, match="unbuffered query"):
                outbox.enqueue(conn, "t", {})
            with pytest.raises(ConfigurationError, match="unbuffered query"):
                outbox.enqueue_many(conn, [GOOD])
            rest = cursor.fetchall()
            ids = [outbox.enqueue(conn, "t", {})]
            conn.commit()
        finally:
            conn.close()
    else:
        module: Any = aiomysql if driver == "aiomysql" else asyncmy
        database = {"db" if driver == "aiomysql" else "database": mysql_database}
        conn = await module.connect(host="127.0.0.1", user="root", **database)
        try:
            cursor = conn.cursor(module.cursors.SSCursor)
            if driver == "aiomysql":
                cursor = await cursor
            await cursor.execute(query)
            first = await cursor.fetchone()
            with pytest.raises(ConfigurationError, match="unbuffered query"):
                await outbox.enqueue_async(conn, "t", {})
            with pytest.raises(ConfigurationError, match="unbuffered query"):
                await outbox.enqueue_many_async(conn, [GOOD])
            rest = await cursor.fetchall()
            ids = [await outbox.enqueue_async(conn, "t", {})]
            await conn.commit()
        finally:
            conn.close()
    assert [first[0], *(row[0] for row in rest)] == list(range(1, 101))
    assert [row["id"] for row in await mysql_store.execute("SELECT id FROM {outbox}")] == ids


class Interrupt(BaseException):
    """As ``KeyboardInterrupt`` (which pytest would take for its own)."""


class Interrupting(dt.datetime):
    """A value whose encoding is interrupted."""

    def isoformat(self, *args: Any, **kwargs: Any) -> str:
        raise Interrupt


async def test_an_interrupt_while_a_long_batch_streams_leaves_none_of_it(
    streaming_database: Database,
) -> None:
    """An interrupt (a ``BaseException``) while a chunk is encoded ends the COPY or the INSERTs
    cleanly and rolls the stored chunks back: the connection and the caller's transaction go on
    (asyncpg's connection stayed in the COPY for good, psycopg's transaction was aborted)."""
    database = streaming_database
    batch = [{"topic": "t", "payload": {"n": n}} for n in range(3000)]
    late = {"topic": "t", "payload": {"at": Interrupting(2026, 12, 2)}}
    async with database.transaction() as tx:
        before = await tx.enqueue(**GOOD)
        with pytest.raises(Interrupt):
            await tx.enqueue_many([*batch[:1500], late])
        after = await tx.enqueue_many(batch)
    assert [r["id"] for r in await database.rows()] == [before, *after]


async def test_a_long_batch_of_orm_dataclasses_loading_through_the_session_is_written(
    orm_database: Database,
) -> None:
    """A long batch is encoded a chunk at a time while the connection stores the chunk before,
    but not a payload whose encoding runs the application's code: here ORM dataclasses that the
    commit which stored them expired, whose fields load again through the caller's session, on
    the connection busy with the batch (streamed, it hung psycopg and broke PyMySQL's
    connection). Such a batch is encoded whole first."""
    database = orm_database
    schema = database.outbox.names.schema

    class Base(MappedAsDataclass, DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = "orm_orders"
        __table_args__ = {"schema": schema}  # noqa: RUF012 - SQLAlchemy's own class attribute
        id: Mapped[int] = mapped_column(primary_key=True, init=False)
        customer: Mapped[str] = mapped_column(sa.String(50))

    url = (
        database.target.replace("postgresql://", "postgresql+psycopg://")
        if database.kind.database == "postgres"
        else mysql_url(database.target, "pymysql")
    )
    with engine(url, "") as made, Session(made) as session:
        with session.begin():
            Base.metadata.create_all(session.connection())
            orders = [Order(customer=f"c{n}") for n in range(1500)]
            session.add_all(orders)
        with session.begin():  # the orders are expired: each load is a SELECT on the session
            ids = database.outbox.enqueue_many(
                session, [{"topic": "orders", "payload": order} for order in orders]
            )
            expected = [{"id": order.id, "customer": f"c{n}"} for n, order in enumerate(orders)]
    rows = await database.rows()
    assert [r["id"] for r in rows] == ids
    assert [json.loads(r["payload"]) for r in rows] == expected


@pytest.mark.parametrize("refused", [False, True], ids=["good", "refused"])
async def test_a_long_batch_cancelled_at_any_moment_is_stored_whole_or_not_at_all(
    async_streaming_database: Database, refused: bool
) -> None:
    """``enqueue_many_async`` of a long batch cancelled after 0, 3, 6, ... turns of the event
    loop (a timeout around it), and the caller, taking the cancellation for "skip it", commits:
    the batch is there whole or not at all, never a part (with a message refused late: never
    anything). The undo of the stored chunks runs to its end even when the cancellation comes
    while it runs. A cancellation the driver cannot survive (asyncmy and aiomysql close the
    connection when a statement is cut in half) makes the commit fail: nothing either."""
    database = async_streaming_database
    batch = [{"topic": "t", "payload": {"n": n}} for n in range(3000)]
    if refused:
        batch[2500] = {**GOOD, "payload": float("nan")}
    outcomes = set()
    for turns in range(0, 120, 3):
        with contextlib.suppress(Exception):  # the commit of a connection the driver closed
            async with database.transaction() as tx:
                task = asyncio.ensure_future(tx.enqueue_many(batch))
                for _ in range(turns):
                    await asyncio.sleep(0)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, OutboxerError):
                    await task
        stored = len(await database.rows())
        assert stored in ((0,) if refused else (0, len(batch))), f"after {turns} turns"
        outcomes.add(stored)
        await database.store.execute("DELETE FROM {outbox}")
    assert 0 in outcomes  # (the cancellations did reach the batch)


@pytest.mark.parametrize("refused", [False, True], ids=["good", "refused"])
async def test_a_long_batch_cancelled_on_postgresql_leaves_the_transaction_usable(
    async_postgres_database: Database, refused: bool
) -> None:
    """On PostgreSQL the savepoint that holds a streamed batch keeps the caller's transaction
    usable after a cancellation too, wherever it comes: the caller, taking it for "skip it",
    writes on and commits (psycopg's COPY cut by the cancellation left the connection in the
    COPY: the next statement failed, "another command is already in progress")."""
    database = async_postgres_database
    batch = [{"topic": "t", "payload": {"n": n}} for n in range(3000)]
    if refused:
        batch[2500] = {**GOOD, "payload": float("nan")}
    outcomes = set()
    for turns in range(0, 120, 3):
        async with database.transaction() as tx:
            before = await tx.enqueue(**GOOD)
            task = asyncio.ensure_future(tx.enqueue_many(batch))
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, OutboxerError):
                await task
            after = await tx.enqueue(**GOOD)
        ids = [r["id"] for r in await database.rows()]
        assert ids[0] == before and ids[-1] == after, f"after {turns} turns"
        assert len(ids) in ((2,) if refused else (2, 2 + len(batch))), f"after {turns} turns"
        outcomes.add(len(ids))
        await database.store.execute("DELETE FROM {outbox}")
    assert 2 in outcomes  # (the cancellations did reach the batch)


async def test_a_batch_the_database_refuses_in_part_writes_none_of_it(
    lenient_database: Database,
) -> None:
    """A short batch (one statement, one per row on SQLite, one per large row on MySQL) with an
    id stored before: the database refuses it, and the rows before that one go too, in a
    transaction that goes on."""
    database = lenient_database
    async with database.transaction() as tx:
        [stored] = await tx.enqueue_many([GOOD])
    refused = [GOOD, GOOD, {**GOOD, "id": stored}, GOOD]
    async with database.transaction() as tx:
        # as the transaction's first statement (SQLite's module begins it for the INSERT)
        with pytest.raises(Exception, match=r"(?i)duplicate|unique") as error:
            await tx.enqueue_many(refused)
        assert not isinstance(error.value, OutboxerError)  # the database's, not ours
        before = await tx.enqueue(**GOOD)
        with pytest.raises(Exception, match=r"(?i)duplicate|unique"):
            await tx.enqueue_many(refused)  # within the transaction
        # rows of 600 kB: a statement each on MySQL, the third refused after two were stored
        bulky = {"topic": "t", "payload": b"\x00x" * 300_000}
        with pytest.raises(Exception, match=r"(?i)duplicate|unique"):
            await tx.enqueue_many([bulky, bulky, {**GOOD, "id": stored}])
        after = await tx.enqueue_many([GOOD, GOOD])
    assert [r["id"] for r in await database.rows()] == [stored, before, *after]


async def test_through_sqlalchemy_a_refused_write_raises_sqlalchemys_exception(
    sqlalchemy_database: Database,
) -> None:
    """Whichever way the rows go (SQLAlchemy's execute, or the driver's writer underneath: COPY,
    multi-row INSERTs, a streamed batch, every row on MySQL), an id stored before raises
    ``sqlalchemy.exc.IntegrityError`` with the driver's exception as ``orig``, as SQLAlchemy's
    own statements do: the application's ``except sqlalchemy.exc.IntegrityError`` catches it
    (it caught nothing on MySQL, nor for ``enqueue_many`` anywhere, where the driver's own
    exception went through)."""
    database = sqlalchemy_database
    async with database.transaction() as tx:
        [stored] = await tx.enqueue_many([GOOD])
    calls = {
        "enqueue": lambda tx: tx.enqueue(**{**GOOD, "id": stored}),
        "short batch": lambda tx: tx.enqueue_many([GOOD, {**GOOD, "id": stored}]),
        "long batch": lambda tx: tx.enqueue_many([*[GOOD] * 2200, {**GOOD, "id": stored}]),
    }
    for name, call in calls.items():
        with contextlib.suppress(Rollback):  # (on PostgreSQL the transaction is aborted)
            async with database.transaction() as tx:
                with pytest.raises(sa.exc.IntegrityError, match=r"(?i)duplicate|unique") as error:
                    await call(tx)
                assert not isinstance(error.value.orig, sa.exc.SQLAlchemyError), name
                raise Rollback
    assert [r["id"] for r in await database.rows()] == [stored]


async def test_through_sqlalchemy_a_connection_lost_under_the_driver_is_invalidated(
    pg_url: str,
) -> None:
    """A connection that dies under the driver's writer (COPY) is invalidated as SQLAlchemy
    invalidates one its own statement finds dead: ``rollback()`` then works (it raised the
    driver's error again) and the pool hands out a fresh connection."""
    with engine(pg_url, "psycopg") as made, Session(made) as session:
        pid = session.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        with psycopg.connect(pg_url, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", [pid])
        with pytest.raises(sa.exc.OperationalError) as error:
            outboxer.enqueue_many(session, [GOOD, GOOD])
        assert error.value.connection_invalidated
        session.rollback()
        assert session.execute(sa.text("SELECT 1")).scalar_one() == 1
    async with async_engine(pg_url, "asyncpg") as made, AsyncSession(made) as asession:
        pid = (await asession.execute(sa.text("SELECT pg_backend_pid()"))).scalar_one()
        with psycopg.connect(pg_url, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", [pid])
        with pytest.raises(sa.exc.DBAPIError) as aerror:
            await outboxer.enqueue_many_async(asession, [GOOD] * 200)
        assert aerror.value.connection_invalidated
        await asession.rollback()
        assert (await asession.execute(sa.text("SELECT 1"))).scalar_one() == 1


async def max_allowed_packet(database: Database) -> int:
    [row] = await database.store.execute("SELECT @@max_allowed_packet AS packet")
    return int(row["packet"])


def escaped(size: int) -> bytes:
    """``size`` bytes that the drivers escaping a parameter send as two bytes each (PyMySQL
    and aiomysql send every byte as two hex digits)."""
    return (b"'\"\\\x00\n\r\x1a" * (size // 7 + 1))[:size]


def refusal(payload: int, limit: int) -> str:
    """The pattern of the refusal of a payload of ``payload`` bytes."""
    return (
        rf"payload of {payload:,} bytes makes a statement of up to [\d,]+ bytes, over the "
        rf"server's max_allowed_packet of {limit:,}; raise max_allowed_packet or send large "
        r"payloads by reference$"
    )


async def test_a_payload_over_max_allowed_packet_is_refused_and_changes_nothing(
    mysql_kind: Database,
) -> None:
    """MariaDB drops the connection on a statement over ``max_allowed_packet``, and with it
    the caller's transaction: the writer refuses the message before sending anything of its
    batch (streamed: the chunks sent before are rolled back), and the transaction goes on.

    The limit is the server's own, read, not lowered (``SET GLOBAL`` would change it under the
    tests running in parallel), and each payload refused here is one the server would refuse:
    one byte over the limit, or half of it escaped (twice its size, and the SQL around)."""
    database = mysql_kind
    limit = await max_allowed_packet(database)
    huge, half = b"x" * (limit + 1), escaped(limit // 2)
    good = [{"topic": "t", "payload": {"n": n}} for n in range(2500)]
    async with database.transaction() as tx:
        kept = [await tx.enqueue("t", {"good": 1})]
        for payload in (huge, half):
            with pytest.raises(ConfigurationError, match=f"^{refusal(len(payload), limit)}"):
                await tx.enqueue("t", payload)
        with pytest.raises(ConfigurationError, match=f"^message 1: {refusal(len(huge), limit)}"):
            await tx.enqueue_many([GOOD, {"topic": "t", "payload": huge}, GOOD])
        with pytest.raises(ConfigurationError, match=f"^message 2300: {refusal(len(huge), limit)}"):
            await tx.enqueue_many([*good[:2300], {"topic": "t", "payload": huge}, *good[2300:]])
        kept.append(await tx.enqueue("t", {"good": 2}))
    assert [r["id"] for r in await database.rows()] == kept


async def test_a_payload_that_fits_max_allowed_packet_is_written_whole(
    mysql_kind: Database,
) -> None:
    """A payload just under what the check refuses, of bytes that the drivers send as two
    each, reaches the server and is stored whole (the check's estimate of the statement is not
    smaller than what the driver sends, nor much larger); payloads of 2 MiB, a statement over
    one chunk of SQL, are not refused, nor are their neighbours in the batch."""
    database = mysql_kind
    limit = await max_allowed_packet(database)
    largest = escaped((limit - 2048) // 2)  # (twice its size, the SQL and the margin: fits)
    two_mib = bytes(range(256)) * (2 << 12)
    async with database.transaction() as tx:
        ids = [
            await tx.enqueue("t", largest),
            *await tx.enqueue_many([GOOD, {"topic": "t", "payload": two_mib}, GOOD]),
            await tx.enqueue("t", two_mib),
        ]
    rows = await database.rows()
    assert [r["id"] for r in rows] == ids
    fine = b'{"fine":true}'
    assert [r["payload"] for r in rows] == [largest, fine, two_mib, fine, two_mib]


@pytest.mark.parametrize("name", ['outbox"; DROP TABLE users; --', "1abc", "a b", "x" * 64, "ütf"])
def test_hostile_table_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid"):
        outboxer.Outbox(table=name)
    with pytest.raises(ConfigurationError, match="invalid"):
        TableNames(schema=name)


async def test_custom_table_name(pg_url: str, pg_schema: str) -> None:
    names = TableNames(table="events_outbox", schema=pg_schema)
    async with PostgresStore(pg_url, names) as store:
        await store.migrate()
        conn = await asyncpg.connect(pg_url)
        try:
            await outboxer.Outbox("events_outbox", pg_schema).enqueue_async(conn, "t", {})
        finally:
            await conn.close()
        assert (await store.stats()).pending == 1


async def test_longest_accepted_names_work(pg_url: str) -> None:
    schema = unique_name("ob")  # dropped below
    names = TableNames(table="t" * (53 - len(schema)), schema=schema)
    # PostgreSQL's limit, reached: schema 1 creates a NOTIFY trigger on this channel (schema 6
    # drops it again), and the derived names (indexes, sibling tables) fit as well
    assert len(names.channel) == 63
    admin = await asyncpg.connect(pg_url)
    try:
        async with PostgresStore(pg_url, names) as store:
            await store.migrate()
            conn = await asyncpg.connect(pg_url)
            try:
                async with conn.transaction():  # COPY
                    ids = await outboxer.Outbox(names.table, schema).enqueue_many_async(
                        conn, [{"topic": "t", "payload": {"n": n}} for n in range(3)]
                    )
            finally:
                await conn.close()
            assert await delivered_ids(store) == set(ids)
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.close()


# -- the connection as the application holds it ---------------------------------------------------


@pytest.fixture(
    params=[
        ("postgres", "psycopg"),
        ("mysql", "pymysql"),
        ("sqlite", "pysqlite"),
        ("postgres", "asyncpg"),
        ("mysql", "asyncmy"),
        ("mysql", "aiomysql"),
        ("sqlite", "aiosqlite"),
    ],
    ids="-".join,
)
def engine_url(request: pytest.FixtureRequest) -> tuple[str, Any]:
    """A SQLAlchemy URL on a migrated outbox and the store that reads it."""
    database, driver = request.param
    if database == "postgres":
        url = request.getfixturevalue("pg_url").replace("postgresql://", f"postgresql+{driver}://")
        return url, request.getfixturevalue("pg_store")
    if database == "mysql":
        url = mysql_url(request.getfixturevalue("mysql_database"), driver)
        return url, request.getfixturevalue("mysql_store")
    url = f"sqlite+{driver}:///{request.getfixturevalue('sqlite_path')}"
    return url, request.getfixturevalue("sqlite_store")


async def test_a_connection_that_has_not_begun_commits_the_messages(
    engine_url: tuple[str, Any],
) -> None:
    """SQLAlchemy 2's "commit as you go": ``engine.connect()``, the outbox call first, then
    ``conn.commit()``. The rows went to the driver's connection behind SQLAlchemy, which had
    not begun: its commit did nothing and the pool rolled the messages back (a probe)."""
    url, store = engine_url
    outbox = outboxer.Outbox(schema=store.names.schema)
    ids: list[str] = []
    for count in (1, 3, 1500):  # enqueue; a short batch; a streamed one
        batch = [{"topic": "orders", "payload": {"n": n}} for n in range(count)]
        if "+async" in url or "+aio" in url:
            made = create_async_engine(url)
            async with made.connect() as aconn:
                if count == 1:
                    ids.append(await outbox.enqueue_async(aconn, **batch[0]))
                else:
                    ids += await outbox.enqueue_many_async(aconn, batch)
                await aconn.commit()
            await made.dispose()
        else:
            with engine(url, "") as made, made.connect() as conn:
                if count == 1:
                    ids.append(outbox.enqueue(conn, **batch[0]))
                else:
                    ids += outbox.enqueue_many(conn, batch)
                conn.commit()
    assert len(ids) == 1504
    assert await pending_ids(store) == set(ids)


def test_a_sqlite3_cursor_keeps_its_rows_and_lastrowid(sqlite_path: Any, sqlite_store: Any) -> None:
    """A loop enqueueing one message per row it reads from its cursor wrote one message and
    stopped: the INSERT ran on the caller's cursor (a probe). It runs on the cursor's
    connection now, as with psycopg and the MySQL drivers."""
    conn = sqlite3.connect(sqlite_path)
    try:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT)")
        conn.executemany("INSERT INTO orders (customer) VALUES (?)", [("a",), ("b",), ("c",)])
        cursor = conn.cursor()
        cursor.execute("SELECT id FROM orders ORDER BY id")
        ids = [outboxer.enqueue(cursor, "orders", {"order_id": n}) for (n,) in cursor]
        assert len(ids) == 3
        cursor.execute("INSERT INTO orders (customer) VALUES ('d')")
        outboxer.enqueue_many(cursor, [{"topic": "orders", "payload": {}}])
        assert cursor.lastrowid == 4  # the order's, not the outbox row's
        conn.commit()
    finally:
        conn.close()


async def test_an_aiosqlite_cursor_keeps_its_rows_and_lastrowid(
    sqlite_path: Any, sqlite_store: Any
) -> None:
    async with aiosqlite.connect(sqlite_path) as conn:
        await conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT)")
        await conn.executemany("INSERT INTO orders (customer) VALUES (?)", [("a",), ("b",)])
        cursor = await conn.execute("INSERT INTO orders (customer) VALUES ('c')")
        await outboxer.enqueue_async(cursor, "orders", {"customer": "c"})
        assert cursor.lastrowid == 3
        cursor = await conn.execute("SELECT id FROM orders ORDER BY id")
        first = await cursor.fetchone()
        assert first is not None
        await outboxer.enqueue_many_async(cursor, [{"topic": "orders", "payload": {}}] * 2)
        assert await cursor.fetchall() == [(2,), (3,)]
        await conn.rollback()


async def test_psycopg_in_another_client_encoding_writes_what_enqueue_writes(
    pg_url: str, pg_store: PostgresStore
) -> None:
    """A binary COPY's text is read in the client encoding: on a LATIN1 connection
    ``enqueue_many`` stored 'Ã©' for 'é' (another topic and key than ``enqueue`` wrote)."""
    outbox = outboxer.Outbox(schema=pg_store.names.schema)
    message = {"topic": "commandes-été", "payload": {"n": 1}, "key": "clé-1", "type": "Créée"}
    with psycopg.connect(pg_url, client_encoding="LATIN1") as conn:
        outbox.enqueue(conn, **message)
        outbox.enqueue_many(conn, [message, message])
        outbox.enqueue_many(conn, [message] * 1500)  # streamed
    rows = await pg_store.execute("SELECT DISTINCT topic, key, type FROM {outbox}")
    assert [tuple(row) for row in rows] == [("commandes-été", "clé-1", "Créée")]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_text_a_client_encoding_cannot_carry_is_refused_and_writes_nothing(
    pg_url: str, pg_store: PostgresStore, is_async: bool
) -> None:
    """Found by a probe: on a LATIN1 connection a key, topic, type or id outside LATIN1 raised
    psycopg's UnicodeEncodeError at its row of ``executemany``, after the rows before it were
    written: a caller that caught it and committed stored part of the batch."""
    outbox = outboxer.Outbox(schema=pg_store.names.schema)
    good = {"topic": "t", "payload": {"n": 1}, "key": "clé"}
    bad_calls = [{"key": "ключ"}, {"topic": "тема"}, {"type": "Создан"}, {"id": "идентификатор"}]
    kept = []
    if is_async:
        async with await psycopg.AsyncConnection.connect(pg_url, client_encoding="LATIN1") as a:
            kept.append(await outbox.enqueue_async(a, **good))
            for bad in bad_calls:
                with pytest.raises(ConfigurationError, match="client encoding LATIN1"):
                    await outbox.enqueue_async(a, **{**good, **bad})
                for size in (6, 1500):
                    with pytest.raises(ConfigurationError, match=rf"^message {size - 1}: "):
                        await outbox.enqueue_many_async(a, [good] * (size - 1) + [{**good, **bad}])
            kept += await outbox.enqueue_many_async(a, [good, good])
    else:
        with psycopg.connect(pg_url, client_encoding="LATIN1") as conn:
            kept.append(outbox.enqueue(conn, **good))
            for bad in bad_calls:
                with pytest.raises(ConfigurationError, match="client encoding LATIN1"):
                    outbox.enqueue(conn, **{**good, **bad})
                for size in (6, 1500):
                    with pytest.raises(ConfigurationError, match=rf"^message {size - 1}: "):
                        outbox.enqueue_many(conn, [good] * (size - 1) + [{**good, **bad}])
            kept += outbox.enqueue_many(conn, [good, good])  # the transaction goes on
    assert await pending_ids(pg_store) == set(kept)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_psycopg_with_raw_cursors_writes(
    pg_url: str, pg_store: PostgresStore, is_async: bool
) -> None:
    """A connection whose ``cursor_factory`` is psycopg's ``RawCursor`` ($1 placeholders):
    outboxer's %s statement was a syntax error that aborted the caller's transaction."""
    outbox = outboxer.Outbox(schema=pg_store.names.schema)
    delayed = {"topic": "t", "payload": {}, "available_at": dt.timedelta(0)}  # executemany
    if is_async:
        async with await psycopg.AsyncConnection.connect(
            pg_url, cursor_factory=psycopg.AsyncRawCursor
        ) as aconn:
            ids = [await outbox.enqueue_async(aconn, "t", {})]
            ids += await outbox.enqueue_many_async(aconn, [delayed, delayed])
            await aconn.execute("SELECT $1::int", [1])  # the caller's transaction goes on
    else:
        with psycopg.connect(pg_url, cursor_factory=psycopg.RawCursor) as conn:
            ids = [outbox.enqueue(conn, "t", {})]
            ids += outbox.enqueue_many(conn, [delayed, delayed])
            conn.execute("SELECT $1::int", [1])
    assert await pending_ids(pg_store) == set(ids)
