"""The relay on a real PostgreSQL: migrations (the upgrade that drops the NOTIFY doorbell on a live
outbox) and the commit-order gate (what every server database does is tested on PostgreSQL and
MariaDB in test_relay_servers.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest

import outboxer
from outboxer.config import RelaySettings, TableNames
from outboxer.ports import ClaimRequest
from outboxer.relay import Relay
from outboxer.stores import _sql
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.postgres.connection import PlanWatch
from outboxer.testing import RecordingPublisher
from tests.conftest import cached_plan, wait_past_commit_gate


async def test_upgrade_is_idempotent_and_equals_a_fresh_install(
    pg_url: str, pg_schema: str
) -> None:
    """Applying migrations one by one (from every older version) equals a fresh install."""
    versions = [m.version for m in _sql.migrations("postgres")]

    async def catalog(schema: str) -> list[tuple[Any, ...]]:
        conn = await asyncpg.connect(pg_url)
        try:
            columns = await conn.fetch(
                "SELECT table_name, column_name, data_type, is_nullable, column_default "
                "FROM information_schema.columns WHERE table_schema = $1 ORDER BY 1, 2",
                schema,
            )
            indexes = await conn.fetch(
                "SELECT tablename, indexname, regexp_replace(indexdef, $1, 'S', 'g') "
                "FROM pg_indexes WHERE schemaname = $2 ORDER BY 1, 2",
                schema,
                schema,
            )
            # triggers and functions: an upgrade must drop what a fresh install no longer has
            routines = await conn.fetch(
                "SELECT 'trigger', event_object_table, trigger_name"
                " FROM information_schema.triggers WHERE trigger_schema = $1"
                " UNION ALL SELECT 'function', '', routine_name"
                " FROM information_schema.routines WHERE routine_schema = $1 ORDER BY 1, 2, 3",
                schema,
            )
        finally:
            await conn.close()
        return [tuple(r) for r in [*columns, *indexes, *routines]]

    async with PostgresStore(pg_url, TableNames(schema=pg_schema)) as store:
        assert await store.migrate() == versions
        assert await store.migrate() == []
        assert await store.schema_version() == versions[-1]
        reference = await catalog(pg_schema)
    assert reference
    for start in versions[:-1]:
        stepwise = f"{pg_schema}_from_{start}"
        async with PostgresStore(pg_url, TableNames(schema=stepwise)) as store:
            try:
                await store.migrate(target=start)
                assert await store.schema_version() == start
                await store.migrate()
                assert await catalog(stepwise) == reference
            finally:
                await store.execute(f'DROP SCHEMA "{stepwise}" CASCADE')


@asynccontextmanager
async def relay_and_writers(
    store: PostgresStore, url: str, writers: int
) -> AsyncIterator[tuple[RecordingPublisher, list[asyncpg.Connection]]]:
    """An ordered relay polling every 50 ms, and ``writers`` connections of the application."""
    connections = [await asyncpg.connect(url) for _ in range(writers)]
    publisher = RecordingPublisher()
    relay = Relay(store, publisher, RelaySettings(poll_interval=0.05, min_poll_interval=0.01))
    task = asyncio.create_task(relay.run())
    try:
        yield publisher, connections
    finally:
        relay.stop()
        await task
        for conn in connections:
            await conn.close()


async def published(publisher: RecordingPublisher, count: int) -> list[str]:
    """The ids published once ``count`` are (or 10 s have passed)."""
    deadline = time.monotonic() + 10
    while len(publisher.messages) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return [m.id for m in publisher.messages]


async def test_commit_order_gate_never_publishes_past_a_slower_older_transaction(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    """T1 writes key K first but commits last; T2 writes K after it and commits first.

    Without the gate a relay would see only T2's row, take it as K's head and publish it
    before T1's. With the gate nothing of K is published until T1 has committed, then both in
    write order.
    """
    outbox = outboxer.Outbox(schema=pg_schema)
    async with relay_and_writers(pg_store, pg_url, 2) as (publisher, (t1, t2)):
        first = t1.transaction()
        await first.start()
        a = await outbox.enqueue_async(t1, "t", {"n": 1}, key="K")
        async with t2.transaction():
            b = await outbox.enqueue_async(t2, "t", {"n": 2}, key="K")
        await asyncio.sleep(0.5)  # the relay polls ~10 times while T1 is open
        assert publisher.messages == []
        await first.commit()
        assert await published(publisher, 2) == [a, b]


async def test_commit_order_gate_waits_for_a_younger_transaction_that_wrote_the_key_first(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    """T1 begins writing first (the older xid), T2 after it (a younger xid); T2 enqueues key K
    first, T1 enqueues K after it and commits first.

    A gate on the row's own xid let T1's row through as soon as T1 committed (no older xid was
    running) and published it ahead of T2's: ``[2, 1]``. The gate is on the snapshot of the
    row's statement (one past the latest xid to complete), so with any younger transaction
    completed in between (T3; on a live database the relays' own commits) nothing of K goes
    before T2 commits, then both in write order.
    """
    outbox = outboxer.Outbox(schema=pg_schema)
    async with relay_and_writers(pg_store, pg_url, 3) as (publisher, (t1, t2, t3)):
        first, second = t1.transaction(), t2.transaction()
        await first.start()
        await second.start()
        older = await t1.fetchval("SELECT pg_current_xact_id()::text::bigint")  # a first write
        younger = await t2.fetchval("SELECT pg_current_xact_id()::text::bigint")
        assert older < younger
        async with t3.transaction():
            assert await t3.fetchval("SELECT pg_current_xact_id()::text::bigint") > younger
        one = await outbox.enqueue_async(t2, "t", {"n": 1}, key="K")
        two = await outbox.enqueue_async(t1, "t", {"n": 2}, key="K")
        await first.commit()
        await asyncio.sleep(0.5)  # the relay polls ~10 times while T2 is open
        assert publisher.messages == []
        await second.commit()
        assert await published(publisher, 2) == [one, two]


async def test_a_row_written_after_a_younger_transaction_completed_is_claimable_at_commit(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    """The gate's value for such a row is its snapshot's xmax, an xid its writer may never see
    complete; the claim waits only for the xids below it, so on a quiet database the row is not
    held until some later transaction happens to commit."""
    outbox = outboxer.Outbox(schema=pg_schema)
    writer, other = await asyncpg.connect(pg_url), await asyncpg.connect(pg_url)
    try:
        async with writer.transaction():
            own = await writer.fetchval("SELECT pg_current_xact_id()::text::bigint")
            async with other.transaction():
                assert await other.fetchval("SELECT pg_current_xact_id()::text::bigint") > own
            sent = await outbox.enqueue_async(writer, "t", {"n": 1}, key="K")
        # Other tests' transactions may hold the gate a moment: wait until no xid below the
        # row's value runs (none below it can begin any more), then the claim must take it.
        await wait_past_commit_gate(pg_store)
        request = ClaimRequest(limit=10, lease_seconds=30, ordered=True, relay_id="r")
        assert [m.id for m in (await pg_store.claim_batch(request)).messages] == [sent]
    finally:
        await writer.close()
        await other.close()


async def test_the_upgrade_to_6_drops_the_doorbell_on_a_live_outbox_and_loses_nothing(
    pg_url: str, pg_schema: str
) -> None:
    """Schema 6 drops the NOTIFY trigger (docs/adr/0007-polling-wakeup.md) while the application
    writes: the upgrade waits for a writing transaction that is open, messages written before,
    during and after it are all published, and no trigger or function is left."""
    names = TableNames(schema=pg_schema)
    outbox = outboxer.Outbox(schema=pg_schema)
    writer = await asyncpg.connect(pg_url)
    try:
        async with PostgresStore(pg_url, names) as store, PostgresStore(pg_url, names) as other:
            assert await store.migrate(target=5) == [1, 2, 3, 4, 5]
            async with writer.transaction():
                before = await outbox.enqueue_async(writer, "t", {"n": 1}, key="K")
            open_transaction = writer.transaction()
            await open_transaction.start()
            during = await outbox.enqueue_async(writer, "t", {"n": 2}, key="K")
            upgrade = asyncio.create_task(other.migrate())
            await asyncio.sleep(0.3)
            assert not upgrade.done()  # DROP TRIGGER waits for the writer's lock on the table
            await open_transaction.commit()
            assert await asyncio.wait_for(upgrade, 10) == [6, 7, 8, 9]
            async with writer.transaction():
                after = await outbox.enqueue_async(writer, "t", {"n": 3}, key="K")
            left = await store.execute(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal"
                " UNION ALL SELECT proname FROM pg_proc WHERE pronamespace = $2::regnamespace",
                f'"{pg_schema}".outbox',
                pg_schema,
            )
            assert left == []
            publisher = RecordingPublisher()
            await Relay(store, publisher, RelaySettings()).drain(timeout=30)
            assert [m.id for m in publisher.messages] == [before, during, after]
    finally:
        await writer.close()


async def test_a_cancel_goes_on_when_the_pool_took_the_connection_back(
    pg_store: PostgresStore,
) -> None:
    """A block cancelled after the pool took its connection back (its close at a stop):
    discarding the connection failed ("connection has been released back to the pool") and
    the cancel became a StoreError, logged as "store unavailable" by a stopping relay (a
    probe)."""

    async def cancelled_after_the_pool_took_it_back() -> None:
        async with pg_store.db.connection() as conn:
            await pg_store.db.pool.release(conn)
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await cancelled_after_the_pool_took_it_back()
    assert await pg_store.stats()  # the pool still serves


async def _claim_plan(store: PostgresStore) -> tuple[Any, str]:
    """The cached ordered claim's prepare time and generic plan."""
    args = "100, 1, 'r', 30.0, false, '{}'::bigint[], 400, 400"
    return await cached_plan(store, "statement", store.q["claim_ordered"], args)


async def test_a_claim_after_a_burst_is_not_planned_on_the_empty_outbox(
    pg_url: str, pg_schema: str
) -> None:
    """A relay started on an empty outbox caches the claim's generic plan made on it: seq scans
    everywhere, also one per row (the table had 0 pages). The first claim after a burst must not
    run it: the store sees the table grew and plans the claim again (autovacuum is off here, so
    no analyze invalidates the plan)."""
    names = TableNames(schema=pg_schema)
    request = ClaimRequest(limit=100, lease_seconds=30, ordered=True, relay_id="r")
    async with PostgresStore(pg_url, names, max_connections=1) as store:
        await store.migrate()
        await store.execute("ALTER TABLE {outbox} SET (autovacuum_enabled = off)")
        await store.execute("ANALYZE {outbox}")
        for _ in range(3):
            assert not (await store.claim_batch(request)).messages
        first, stale = await _claim_plan(store)
        assert "Seq Scan on outbox" in stale, stale  # the scenario: a plan for an empty table
        conn = await asyncpg.connect(pg_url)
        try:
            await conn.copy_records_to_table(
                "outbox",
                records=[(f"m{n}", "t", str(n % 500), "T", b"{}") for n in range(5000)],
                columns=["id", "topic", "key", "type", "payload"],
                schema_name=pg_schema,
            )
        finally:
            await conn.close()
        await wait_past_commit_gate(store)
        assert len((await store.claim_batch(request)).messages) == 100
        prepared, plan = await _claim_plan(store)
        assert prepared > first, "the claim ran the plan made on the empty outbox"
        assert "Seq Scan on outbox" not in plan, plan


async def test_dropping_the_plans_of_a_lent_pool_leaves_the_applications_statements_working(
    pg_url: str, pg_schema: str
) -> None:
    """On a pool the application lends the store, the drop after a burst empties the pool's
    statement caches: the application's own prepared statement and its cached queries go on."""
    pool = await asyncpg.create_pool(pg_url, min_size=2, max_size=2)
    try:
        async with PostgresStore(pool, TableNames(schema=pg_schema)) as store:
            await store.migrate()
            request = ClaimRequest(limit=100, lease_seconds=30, ordered=True, relay_id="r")
            async with pool.acquire() as app:
                mine = await app.prepare("SELECT $1::int + 1")
                assert await app.fetchval("SELECT $1::int * 3", 2) == 6
                assert not (await store.claim_batch(request)).messages  # sizes seen: empty
                await app.execute(
                    f'INSERT INTO "{pg_schema}".outbox (id, topic, key, payload) '
                    "SELECT 'm' || g, 't', (g % 100)::text, '{}'::bytea "
                    "FROM generate_series(1, 20000) g"
                )
                drops = PlanWatch.drops
                await wait_past_commit_gate(store)
                assert len((await store.claim_batch(request)).messages) == 100
                assert PlanWatch.drops == drops + 1, "the burst dropped the pool's plans"
                assert await mine.fetchval(1) == 2
                assert await app.fetchval("SELECT $1::int * 3", 3) == 9
            assert (await store.stats()).pending == 19_900
    finally:
        await pool.close()
