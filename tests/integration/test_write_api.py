"""``enqueue`` in the caller's transaction, for every supported connection kind.

Each case commits one message and rolls another back, then checks what the outbox holds:
the committed message is there (and a relay delivers it), the rolled-back one never exists.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiosqlite
import asyncpg
import psycopg
import pydantic
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import outboxer
from outboxer.config import Backoff, RelaySettings, TableNames
from outboxer.errors import ConfigurationError
from outboxer.relay import Relay
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.sqlite import SqliteStore
from outboxer.testing import RecordingPublisher
from tests.conftest import wait_past_commit_gate


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


# -- PostgreSQL drivers ------------------------------------------------------------------------


@pytest.fixture
def outbox(pg_schema: str) -> outboxer.Outbox:
    return outboxer.Outbox(schema=pg_schema)


def sync_psycopg(pg_url: str, outbox: outboxer.Outbox) -> tuple[str, str]:
    with psycopg.connect(pg_url) as conn:
        with conn.transaction():
            kept = outbox.enqueue(conn, "orders", {"n": 1}, key="1")
        try:
            with conn.transaction():
                outbox.enqueue(conn, "orders", {"n": 2}, id="rolled-back")
                raise Rollback
        except Rollback:
            pass
    return kept, "rolled-back"


def sync_sqlalchemy_session(pg_url: str, outbox: outboxer.Outbox) -> tuple[str, str]:
    engine = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with Session(engine) as session, session.begin():
            kept = outbox.enqueue(session, "orders", {"n": 1})
        try:
            with Session(engine) as session, session.begin():
                outbox.enqueue(session, "orders", {"n": 2}, id="rolled-back")
                raise Rollback
        except Rollback:
            pass
    finally:
        engine.dispose()
    return kept, "rolled-back"


def sync_sqlalchemy_connection(pg_url: str, outbox: outboxer.Outbox) -> tuple[str, str]:
    engine = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as conn:
            kept = outbox.enqueue(conn, "orders", {"n": 1})
        try:
            with engine.begin() as conn:
                outbox.enqueue(conn, "orders", {"n": 2}, id="rolled-back")
                raise Rollback
        except Rollback:
            pass
    finally:
        engine.dispose()
    return kept, "rolled-back"


@pytest.mark.parametrize(
    "write", [sync_psycopg, sync_sqlalchemy_session, sync_sqlalchemy_connection]
)
async def test_sync_writers_on_postgres(
    write: Callable[[str, outboxer.Outbox], tuple[str, str]],
    pg_store: PostgresStore,
    pg_url: str,
    outbox: outboxer.Outbox,
) -> None:
    kept, rolled_back = write(pg_url, outbox)
    assert await pending_ids(pg_store) == {kept}
    assert await delivered_ids(pg_store) == {kept}
    assert rolled_back not in await pending_ids(pg_store)


async def async_asyncpg(pg_url: str, outbox: outboxer.Outbox) -> tuple[str, str]:
    conn = await asyncpg.connect(pg_url)
    try:
        async with conn.transaction():
            kept = await outbox.enqueue_async(conn, "orders", {"n": 1})
        try:
            async with conn.transaction():
                await outbox.enqueue_async(conn, "orders", {"n": 2}, id="rolled-back")
                raise Rollback
        except Rollback:
            pass
    finally:
        await conn.close()
    return kept, "rolled-back"


async def async_psycopg(pg_url: str, outbox: outboxer.Outbox) -> tuple[str, str]:
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        async with conn.transaction():
            kept = await outbox.enqueue_async(conn, "orders", {"n": 1})
        try:
            async with conn.transaction():
                await outbox.enqueue_async(conn, "orders", {"n": 2}, id="rolled-back")
                raise Rollback
        except Rollback:
            pass
    return kept, "rolled-back"


async def async_sqlalchemy_session(pg_url: str, outbox: outboxer.Outbox) -> tuple[str, str]:
    engine = create_async_engine(pg_url.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        async with AsyncSession(engine) as session, session.begin():
            kept = await outbox.enqueue_async(session, "orders", {"n": 1})
        try:
            async with AsyncSession(engine) as session, session.begin():
                await outbox.enqueue_async(session, "orders", {"n": 2}, id="rolled-back")
                raise Rollback
        except Rollback:
            pass
    finally:
        await engine.dispose()
    return kept, "rolled-back"


async def async_sqlalchemy_connection(pg_url: str, outbox: outboxer.Outbox) -> tuple[str, str]:
    engine = create_async_engine(pg_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        async with engine.begin() as conn:
            kept = await outbox.enqueue_async(conn, "orders", {"n": 1})
        try:
            async with engine.begin() as conn:
                await outbox.enqueue_async(conn, "orders", {"n": 2}, id="rolled-back")
                raise Rollback
        except Rollback:
            pass
    finally:
        await engine.dispose()
    return kept, "rolled-back"


@pytest.mark.parametrize(
    "write",
    [async_asyncpg, async_psycopg, async_sqlalchemy_session, async_sqlalchemy_connection],
)
async def test_async_writers_on_postgres(
    write: Any, pg_store: PostgresStore, pg_url: str, outbox: outboxer.Outbox
) -> None:
    kept, rolled_back = await write(pg_url, outbox)
    assert await pending_ids(pg_store) == {kept}
    assert await delivered_ids(pg_store) == {kept}
    assert rolled_back not in await pending_ids(pg_store)


# -- SQLite drivers ----------------------------------------------------------------------------


async def test_sqlite3_and_sqlalchemy_on_sqlite(
    sqlite_store: SqliteStore, sqlite_path: Path
) -> None:
    conn = sqlite3.connect(sqlite_path)
    with conn:
        kept = outboxer.enqueue(conn, "orders", {"n": 1})
    try:
        with conn:
            outboxer.enqueue(conn, "orders", {"n": 2}, id="rolled-back-1")
            raise Rollback
    except Rollback:
        pass
    conn.close()
    engine = sa.create_engine(f"sqlite:///{sqlite_path}")
    with Session(engine) as session, session.begin():
        kept_sa = outboxer.enqueue(session, "orders", {"n": 3})
    engine.dispose()
    async with aiosqlite.connect(sqlite_path) as aconn:
        kept_aio = await outboxer.enqueue_async(aconn, "orders", {"n": 4})
        await aconn.commit()
        await outboxer.enqueue_async(aconn, "orders", {"n": 5}, id="rolled-back-2")
        await aconn.rollback()
    assert await pending_ids(sqlite_store) == {kept, kept_sa, kept_aio}
    assert await delivered_ids(sqlite_store) == {kept, kept_sa, kept_aio}


# -- payloads and options ----------------------------------------------------------------------


@dataclasses.dataclass
class OrderPlaced:
    order_id: int
    placed_at: dt.datetime


class UserRegistered(pydantic.BaseModel):
    user_id: int
    email: str


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
    claim = await pg_store.claim_batch(limit=10, lease_seconds=5, ordered=True, relay_id="r")
    got = {m.id: m for m in claim.messages}
    for n, (_, body, content_type) in enumerate(payloads):
        message = got[f"id-{n}"]
        assert (message.payload, message.content_type) == (body, content_type)
        assert (message.key, message.type, dict(message.headers)) == (str(n), "T", {"n": str(n)})


async def test_bad_input_is_refused_before_any_write(
    pg_store: PostgresStore, asyncpg_conn: asyncpg.Connection, outbox: outboxer.Outbox
) -> None:
    bad_calls: list[dict[str, Any]] = [
        {"topic": "", "payload": {}},
        {"topic": "t", "payload": object()},
        {"topic": "t", "payload": {}, "headers": {"n": 1}},
        {"topic": "t", "payload": {}, "headers": ["not", "a", "mapping"]},
        {"topic": "t", "payload": {}, "key": 1.5},
        {"topic": "t", "payload": {}, "available_at": "tomorrow"},
    ]
    for call in bad_calls:
        with pytest.raises(ConfigurationError):
            await outbox.enqueue_async(asyncpg_conn, **call)
    with pytest.raises(ConfigurationError, match="asynchronous"):
        outbox.enqueue(asyncpg_conn, "t", {})
    with pytest.raises(ConfigurationError, match="does not know"):
        outboxer.enqueue(object(), "t", {})
    assert await pending_ids(pg_store) == set()


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
