"""The store contract against real SQLite and PostgreSQL, writing through ``enqueue``."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import aiosqlite
import asyncpg
import pytest

from outboxer.errors import StoreError
from outboxer.inbox import consume
from outboxer.message import Message
from outboxer.outbox import Outbox
from outboxer.ports import ClaimRequest, ConsumeFailure, DeadLetterFilter, Settlement
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.postgres import relay as postgres_relay
from outboxer.stores.sqlite import SqliteStore
from outboxer.stores.sqlite.connection import immediate
from tests.conftest import wait_past_commit_gate
from tests.contracts.store import StoreContract


class ReplayIsOneTransaction:
    """Replaying publish and consume dead letters together is all or nothing."""

    async def refuse_consume_replays(self, store: Any) -> None:
        raise NotImplementedError

    async def test_a_failing_consume_replay_undoes_the_publish_replay(
        self, store: Any, add: Any
    ) -> None:
        published = await add("t", {"n": 1})
        c = await store.claim_batch(
            ClaimRequest(limit=1, lease_seconds=30, ordered=True, relay_id="r")
        )
        await store.settle(c, Settlement(dead=[(published, "rejected")]))

        async def broken(message: Message, conn: Any, attempt: int) -> None:
            raise RuntimeError("handler bug")

        consumed = Message(id="consumed", topic="t", payload=b"{}")
        assert await consume(
            store,
            "c",
            [consumed],
            broken,
            on_failure=lambda m, a, e: ConsumeFailure("gave up", None),
            retention_seconds=60,
        ) == ["dead"]
        await self.refuse_consume_replays(store)
        with pytest.raises((StoreError, sqlite3.IntegrityError)):
            await store.replay_dead_letters(DeadLetterFilter(topic="t"))
        page = await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
        assert sorted(d.id for d in page.items) == sorted([published, "consumed"])
        assert (await store.stats()).pending == 0  # the publish replay was rolled back too


class TestSqliteStore(StoreContract, ReplayIsOneTransaction):
    async def refuse_consume_replays(self, store: Any) -> None:
        await store.execute(
            "CREATE TRIGGER refuse BEFORE UPDATE ON {inbox_failures} "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )

    @pytest.fixture
    def store(self, sqlite_store: SqliteStore) -> SqliteStore:
        return sqlite_store

    @pytest.fixture
    def add(self, sqlite_store: SqliteStore, sqlite_path: Path) -> Any:
        async def add(topic: str, payload: object, **options: Any) -> str:
            conn = sqlite3.connect(sqlite_path)
            try:
                with conn:
                    return Outbox().enqueue(conn, topic, payload, **options)
            finally:
                conn.close()

        return add


class TestPostgresStore(StoreContract, ReplayIsOneTransaction):
    async def refuse_consume_replays(self, store: Any) -> None:
        schema = store.names.schema
        await store.execute(
            f'CREATE FUNCTION "{schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS '
            "$$ BEGIN RAISE EXCEPTION 'refused'; END $$"
        )
        await store.execute(
            "CREATE TRIGGER refuse BEFORE UPDATE ON {inbox_failures} "
            f'FOR EACH ROW EXECUTE FUNCTION "{schema}".refuse()'
        )

    @pytest.fixture
    def store(self, pg_store: PostgresStore) -> PostgresStore:
        return pg_store

    @pytest.fixture
    def add(self, pg_store: PostgresStore, pg_url: str, pg_schema: str) -> Any:
        outbox = Outbox(schema=pg_schema)

        async def add(topic: str, payload: object, **options: Any) -> str:
            conn = await asyncpg.connect(pg_url)
            try:
                async with conn.transaction():
                    message_id = await outbox.enqueue_async(conn, topic, payload, **options)
            finally:
                await conn.close()
            await wait_past_commit_gate(pg_store)
            return message_id

        return add


class TestPostgresClaimBehindTheFront(TestPostgresStore):
    """The contract again with an ordered claim whose front is a single row, so that what it
    claims comes from behind the front: the key heads' runs and the unkeyed index
    (``claim_ordered``, docs/adr/0010)."""

    @pytest.fixture(autouse=True)
    def no_front(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(postgres_relay, "FRONT_PER_MESSAGE", 0)


class TestPostgresClaimWithManyKeys(TestPostgresClaimBehindTheFront):
    """... and with more keys than the claim reads the heads of: the walk behind the front."""

    @pytest.fixture(autouse=True)
    def no_heads(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(postgres_relay, "KEYS_PER_MESSAGE", 0)


async def test_a_sqlite_transaction_cancelled_while_it_begins_is_rolled_back(
    tmp_path: Path,
) -> None:
    """aiosqlite runs ``BEGIN`` in its thread even when the caller, cancelled, no longer waits
    for it: the transaction stayed open and the connection's next statements ran in it, never
    committed (a relay stopped while its sweep began lost its unregister: its row stayed in
    ``stats`` after a clean stop, now and then under load)."""
    conn = await aiosqlite.connect(tmp_path / "t.db", isolation_level=None)
    try:

        async def begin_and_wait() -> None:
            async with immediate(conn):
                await asyncio.sleep(10)

        task = asyncio.create_task(begin_and_wait())
        await asyncio.sleep(0)  # it sent BEGIN and waits for the answer
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await conn.execute("SELECT 1")  # after whatever the cancelled task queued
        assert not conn.in_transaction
    finally:
        await conn.close()
