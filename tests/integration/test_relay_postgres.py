"""The relay on a real PostgreSQL: its NOTIFY doorbell, migrations and commit-order gate (what
every server database does is tested on PostgreSQL and MariaDB in test_relay_servers.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg

import outboxer
from outboxer.config import RelaySettings, TableNames
from outboxer.relay import Relay
from outboxer.stores import _sql
from outboxer.stores.postgres import PostgresStore
from outboxer.testing import RecordingPublisher


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
        finally:
            await conn.close()
        return [tuple(r) for r in columns] + [tuple(r) for r in indexes]

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


async def test_commit_order_gate_never_publishes_past_a_slower_older_transaction(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    """T1 writes key K first but commits last; T2 writes K after it and commits first.

    Without the gate a relay would see only T2's row, take it as K's head and publish it
    before T1's. With the gate nothing of K is published until T1 has committed, then both in
    write order.
    """
    outbox = outboxer.Outbox(schema=pg_schema)
    t1, t2 = await asyncpg.connect(pg_url), await asyncpg.connect(pg_url)
    publisher = RecordingPublisher()
    relay = Relay(pg_store, publisher, RelaySettings(poll_interval=0.05, min_poll_interval=0.01))
    task = asyncio.create_task(relay.run())
    try:
        first = t1.transaction()
        await first.start()
        a = await outbox.enqueue_async(t1, "t", {"n": 1}, key="K")
        async with t2.transaction():
            b = await outbox.enqueue_async(t2, "t", {"n": 2}, key="K")
        await asyncio.sleep(0.5)  # the relay polls ~10 times while T1 is open
        assert publisher.messages == []
        await first.commit()
        deadline = time.monotonic() + 10
        while len(publisher.messages) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert [m.id for m in publisher.messages] == [a, b]
    finally:
        relay.stop()
        await task
        await t1.close()
        await t2.close()


class ListenFails(asyncpg.Connection):
    """A connection whose LISTEN fails or hangs, as during a PostgreSQL restart."""

    mode = "fail"

    async def add_listener(self, channel: str, callback: Any) -> None:
        if ListenFails.mode == "fail":
            raise asyncpg.InterfaceError("connection was closed in the middle of operation")
        if ListenFails.mode == "hang":
            await asyncio.sleep(3600)
        await super().add_listener(channel, callback)


async def test_a_failed_or_cancelled_listen_gives_its_connection_back(
    pg_url: str, pg_schema: str, pg_store: PostgresStore
) -> None:
    pool = await asyncpg.create_pool(pg_url, min_size=1, max_size=2, connection_class=ListenFails)
    try:
        store = PostgresStore(pool, TableNames(schema=pg_schema))
        ListenFails.mode = "fail"
        for _ in range(5):  # more failures than the pool has connections
            assert await asyncio.wait_for(store.wait_for_messages(0.01), 5) is False
        ListenFails.mode = "hang"
        for _ in range(5):
            waiting = asyncio.create_task(store.wait_for_messages(10))
            await asyncio.sleep(0.05)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        assert pool.get_idle_size() == pool.get_size()  # nothing held
        ListenFails.mode = "ok"
        async with pool.acquire() as conn:  # the pool still serves, and LISTEN works again
            await conn.execute("SELECT 1")
        woke = asyncio.create_task(store.wait_for_messages(10))
        await asyncio.sleep(0.1)
        async with pool.acquire() as conn:
            await outboxer.Outbox(schema=pg_schema).enqueue_async(conn, "t", {"n": 1})
        assert await asyncio.wait_for(woke, 10) is True
        await store.close()
    finally:
        pool.terminate()  # close() would wait for the connections a leak never gives back
