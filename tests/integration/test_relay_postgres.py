"""The relay on a real PostgreSQL: scale-out, order, doorbell, poison, leases, migrations."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import asyncpg

import outboxer
from outboxer.config import Backoff, RelaySettings, TableNames
from outboxer.errors import PublishError, RetryablePublishError
from outboxer.message import Message
from outboxer.relay import Relay
from outboxer.stores import _sql
from outboxer.stores.postgres import PostgresStore
from outboxer.testing import RecordingPublisher
from tests.conftest import wait_past_commit_gate

QUICK = RelaySettings(
    batch_size=500,
    poll_interval=0.2,
    retry=Backoff(base=0.05, factor=2, cap=0.1),
    heartbeat_interval=1,
)


async def fill(pg_url: str, schema: str, count: int, keys: int | None = None) -> list[str]:
    """Commit ``count`` messages in write order (key = n % keys)."""
    outbox = outboxer.Outbox(schema=schema)
    messages = [
        {"topic": "orders", "payload": {"n": n}, "key": (n % keys) if keys else None, "type": "T"}
        for n in range(count)
    ]
    conn = await asyncpg.connect(pg_url)
    try:
        return await outbox.enqueue_many_async(conn, messages)
    finally:
        await conn.close()


async def run_relays(
    pg_url: str, schema: str, publisher: Any, count: int, settings: RelaySettings
) -> list[Any]:
    stores = [PostgresStore(pg_url, TableNames(schema=schema)) for _ in range(count)]
    for store in stores:
        await store.open()
    try:
        relays = [Relay(store, publisher, settings) for store in stores]
        return await asyncio.gather(*(relay.drain(timeout=120) for relay in relays))
    finally:
        for store in stores:
            await store.close()


async def test_three_relays_share_20000_messages_without_loss_or_duplicates(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    ids = await fill(pg_url, pg_schema, 20_000)
    publisher = RecordingPublisher()
    settings = RelaySettings(batch_size=200, ordered=False, poll_interval=0.2)
    counters = await run_relays(pg_url, pg_schema, publisher, 3, settings)
    published = [m.id for m in publisher.messages]
    assert len(published) == 20_000 == len(set(published))
    assert set(published) == set(ids)
    assert all(c.published > 0 for c in counters), "every relay took a share"
    print("\nshare per relay:", [c.published for c in counters])


async def test_three_ordered_relays_keep_per_key_order(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    ids = await fill(pg_url, pg_schema, 6_000, keys=50)
    publisher = RecordingPublisher()
    await run_relays(pg_url, pg_schema, publisher, 3, RelaySettings(batch_size=100))
    assert len(publisher.messages) == 6_000 == len({m.id for m in publisher.messages})
    position = {message_id: n for n, message_id in enumerate(ids)}
    by_key: dict[str | None, list[int]] = collections.defaultdict(list)
    for message in publisher.messages:
        by_key[message.key].append(position[message.id])
    assert len(by_key) == 50
    for key, order in by_key.items():
        assert order == sorted(order), f"key {key} published out of order"


async def test_poison_dead_lettered_after_three_attempts_while_others_flow(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    conn = await asyncpg.connect(pg_url)
    outbox = outboxer.Outbox(schema=pg_schema)
    try:
        async with conn.transaction():
            poison = await outbox.enqueue_async(
                conn, "orders", {"order": 13}, key="13", type="OrderCreated", headers={"a": "b"}
            )
            good = [await outbox.enqueue_async(conn, "orders", {"order": n}) for n in range(50)]
    finally:
        await conn.close()

    def reject(message: Message) -> RetryablePublishError | None:
        return (
            RetryablePublishError("schema registry rejected it") if message.id == poison else None
        )

    publisher = RecordingPublisher(fail=reject)
    await Relay(pg_store, publisher, QUICK).drain(timeout=30)
    assert {m.id for m in publisher.messages} == set(good)
    dead = await pg_store.get_dead_letter(poison)
    assert (dead.topic, dead.key, dead.type, dead.attempts) == ("orders", "13", "OrderCreated", 3)
    assert dead.failure_reason == "schema registry rejected it"
    assert dead.payload == b'{"order":13}'
    assert dict(dead.headers) == {"a": "b"}


async def test_notify_wakes_an_idle_relay_long_before_its_poll(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    publisher = RecordingPublisher()
    # Poll only every 60 s: a delivery within 10 s can only come from the NOTIFY doorbell.
    settings = RelaySettings(poll_interval=60, min_poll_interval=60, heartbeat_interval=5)
    relay = Relay(pg_store, publisher, settings)
    task = asyncio.create_task(relay.run())
    try:
        await asyncio.sleep(0.5)  # the relay is idle and listening
        [message_id] = await fill(pg_url, pg_schema, 1)
        started = time.monotonic()
        while not publisher.messages and time.monotonic() - started < 10:
            await asyncio.sleep(0.01)
        assert [m.id for m in publisher.messages] == [message_id]
    finally:
        relay.stop()
        await task


async def test_expired_lease_is_taken_over_and_the_old_owner_cannot_settle(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    await fill(pg_url, pg_schema, 10)
    await wait_past_commit_gate(pg_store)
    stale = await pg_store.claim_batch(limit=10, lease_seconds=0.3, ordered=True, relay_id="dead")
    await asyncio.sleep(0.5)
    publisher = RecordingPublisher()
    await Relay(pg_store, publisher, QUICK).drain(timeout=20)  # reaps the lease, publishes
    assert len(publisher.messages) == 10
    from outboxer.ports import Settlement

    await pg_store.settle(stale, Settlement(dead=[(m.id, "late") for m in stale.messages]))
    assert (await pg_store.stats()).dead_letters == 0


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


async def test_sweeper_persists_its_report_and_only_one_relay_sweeps(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    from outboxer.ports import Settlement

    [message_id] = await fill(pg_url, pg_schema, 1)
    await wait_past_commit_gate(pg_store)
    claim = await pg_store.claim_batch(limit=1, lease_seconds=0.1, ordered=True, relay_id="gone")
    await asyncio.sleep(0.3)
    assert await pg_store.release_expired_leases() == 1
    again = await pg_store.claim_batch(limit=1, lease_seconds=30, ordered=True, relay_id="r")
    await pg_store.settle(again, Settlement(dead=[(message_id, "rejected")]))
    del claim

    async def sweep(name: str) -> object:
        async with PostgresStore(pg_url, TableNames(schema=pg_schema)) as store:
            return await store.sweep(sweeper=name, interval=60, retention_seconds=0, batch_size=50)

    reports = await asyncio.gather(*(sweep(f"relay-{n}") for n in range(4)))
    done = [r for r in reports if r is not None]
    assert len(done) == 1, "exactly one relay swept"
    report = done[0]
    assert (report.publish_retries, report.publish_failures) == (1, 1)  # type: ignore[attr-defined]
    assert (
        await pg_store.sweep(sweeper="x", interval=60, retention_seconds=0, batch_size=50) is None
    )
    async with PostgresStore(pg_url, TableNames(schema=pg_schema)) as fresh:  # "a restart"
        persisted = await fresh.last_sweep()
        stats = await fresh.stats()
    assert persisted == report
    assert stats.last_sweep == report
    assert stats.to_json()["last_sweep"]["publish_failures"] == 1


async def test_sweeper_purges_dead_letters_past_retention_in_batches(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    from outboxer.ports import Settlement

    ids = await fill(pg_url, pg_schema, 120)
    await wait_past_commit_gate(pg_store)
    claim = await pg_store.claim_batch(limit=120, lease_seconds=30, ordered=False, relay_id="r")
    await pg_store.settle(claim, Settlement(dead=[(i, "bad") for i in ids]))
    await pg_store.execute(
        "UPDATE {dead_letters} SET dead_lettered_at = now() - interval '2 days' "
        "WHERE id = ANY($1::text[])",
        ids[:100],
    )
    report = await pg_store.sweep(
        sweeper="s", interval=0.001, retention_seconds=86400, batch_size=50
    )
    assert report is not None and report.purged == 50
    await asyncio.sleep(0.01)
    report = await pg_store.sweep(
        sweeper="s", interval=0.001, retention_seconds=86400, batch_size=50
    )
    assert report is not None and report.purged == 50
    assert (await pg_store.stats()).dead_letters == 20  # the young ones stay


async def test_stats_flag_work_nobody_owns(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    await fill(pg_url, pg_schema, 5)
    await wait_past_commit_gate(pg_store)
    publisher = RecordingPublisher()
    live = Relay(pg_store, publisher)
    await pg_store.heartbeat(live.info)
    await pg_store.claim_batch(limit=2, lease_seconds=30, ordered=True, relay_id=live.relay_id)
    await pg_store.claim_batch(limit=3, lease_seconds=30, ordered=True, relay_id="crashed")
    stats = await pg_store.stats()
    assert stats.in_flight == 5
    assert stats.unowned_in_flight == 3
    [relay] = stats.relays
    assert (relay.relay_id, relay.in_flight) == (live.relay_id, 2)


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


async def test_a_publish_slower_than_the_lease_is_published_once(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    lease = 1.0
    ids = await fill(pg_url, pg_schema, 20)
    slow_id = ids[0]
    await wait_past_commit_gate(pg_store)

    class SlowWebhook(RecordingPublisher):
        """One message takes three leases to be acknowledged."""

        async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
            if any(m.id == slow_id for m in messages):
                await asyncio.sleep(3 * lease)
            return await super().publish(messages)

    publisher = SlowWebhook()
    settings = replace(
        QUICK, batch_size=5, lease_seconds=lease, heartbeat_interval=lease / 4, ordered=False
    )
    await run_relays(pg_url, pg_schema, publisher, 2, settings)  # both drain the outbox
    published = collections.Counter(m.id for m in publisher.messages)
    assert published[slow_id] == 1  # the other relay never took it over
    assert set(published) == set(ids) and max(published.values()) == 1
