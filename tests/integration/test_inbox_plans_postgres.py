"""The inbox's cached plans after its tables grew (PostgreSQL, ``plan_cache_mode``)."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from outboxer.config import TableNames
from outboxer.message import Message
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.postgres import inbox as postgres_inbox
from tests.conftest import cached_plan


async def _receive_plan(store: PostgresStore) -> tuple[Any, str]:
    """The prepare time and generic plan of the recording of a batch (the server-side prepared
    ``inbox_receive_at_begin``)."""
    name = postgres_inbox._prepared_name(store.q["inbox_receive_at_begin"])
    return await cached_plan(store, "name", name, """'c', '["x"]', '["k"]', 60.0""")


async def _receive(store: PostgresStore, n: int) -> None:
    async with store.inbox_session() as session, session.transaction():
        message = Message(id=f"m{n}", topic="t", payload=b"{}", key=str(n), type="T")
        await session.receive("c", [message], 60.0)


async def test_a_batch_after_the_failures_grew_is_not_planned_on_the_empty_table(
    pg_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plans made on an empty {inbox_failures} read all of it for every message of a batch (the
    key's "earlier failure?" check). Once the table grew (failures piled up: an outage), the
    next chunk's size check drops the plans; the recording is prepared and planned again
    (autovacuum is off here, so no analyze invalidates the plan)."""
    monkeypatch.setattr(postgres_inbox, "PLAN_CHECK_SECONDS", 0.0)
    # batches recorded by the prepared plain INSERT (not after another test's redelivery)
    monkeypatch.setattr(postgres_inbox._Session, "plain_insert_from", 0.0)
    async with PostgresStore(pg_url, TableNames(schema=pg_schema), max_connections=1) as store:
        await store.migrate()
        for table in ("{inbox}", "{inbox_failures}"):
            await store.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
            await store.execute(f"ANALYZE {table}")
        await _receive(store, 0)
        first, stale = await _receive_plan(store)
        assert "Seq Scan on outbox_inbox_failures" in stale, stale  # the scenario
        conn = await asyncpg.connect(pg_url)
        try:
            await conn.execute(
                f"""INSERT INTO "{pg_schema}".outbox_inbox_failures
                    (consumer, message_id, topic, key, payload, content_type, created_at, state)
                SELECT 'c', 'f' || g, 't', (g % 100)::text, '\\x00', 'application/json',
                       now(), 'dead'
                FROM generate_series(1, 20000) g"""
            )
        finally:
            await conn.close()
        await _receive(store, 1)
        prepared, plan = await _receive_plan(store)
        assert prepared > first, "the batch ran the plan made on the empty table"
        assert "Seq Scan on outbox_inbox_failures" not in plan, plan
        await _receive(store, 2)  # and the plan is kept while the table does not grow
        assert (await _receive_plan(store))[0] == prepared


async def _purge_plan(store: PostgresStore) -> tuple[Any, str]:
    """The prepare time and generic plan of the sweeper's purge (an asyncpg cached statement)."""
    return await cached_plan(store, "statement", store.q["inbox_purge"], "1000")


async def test_a_purge_after_the_inbox_grew_is_not_planned_on_the_empty_table(
    pg_url: str, pg_schema: str
) -> None:
    """A purge planned on an empty inbox is a nested loop over sequential scans (one purge
    batch of 1,000 over 200,000 rows took 10 minutes). Once the inbox grew, the next purge
    batch is planned again."""
    async with PostgresStore(pg_url, TableNames(schema=pg_schema), max_connections=1) as store:
        await store.migrate()
        await store.execute("ALTER TABLE {inbox} SET (autovacuum_enabled = off)")
        await store.execute("ANALYZE {inbox}")
        assert await store._purge_inbox_batch(1000) == 0
        first, stale = await _purge_plan(store)
        assert "Seq Scan on outbox_inbox" in stale, stale  # the scenario
        await store.execute(
            "INSERT INTO {inbox} (consumer, message_id, expires_at) "
            "SELECT 'c', 'm' || g, now() - interval '1 day' FROM generate_series(1, 30000) g"
        )
        assert await store._purge_inbox_batch(1000) == 1000
        prepared, _ = await _purge_plan(store)
        assert prepared > first, "the purge ran the plan made on the empty inbox"
        assert await store._purge_inbox_batch(1000) == 1000
        assert (await _purge_plan(store))[0] == prepared, "kept while the inbox does not grow"
