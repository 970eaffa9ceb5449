"""The MySQL/MariaDB store on a real MariaDB: the store contract, commit order, schema."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import asyncmy
import pytest

from outboxer.config import RelaySettings, TableNames
from outboxer.errors import SchemaError
from outboxer.outbox import Outbox
from outboxer.ports import ClaimRequest, DeadLetterFilter, MessageFilter, Settlement
from outboxer.relay import Relay
from outboxer.stores import _sql
from outboxer.stores.mysql import MysqlStore
from outboxer.stores.mysql.connection import fetch_value
from outboxer.stores.mysql.dead_letters import REPLAY_CHUNK
from outboxer.stores.mysql.relay import FRONT_PER_MESSAGE, KEYS_PER_MESSAGE
from outboxer.testing import RecordingPublisher
from tests.conftest import mysql_connect
from tests.contracts.store import StoreContract


async def enqueue(
    conn: asyncmy.Connection, database: str, topic: str, payload: object, **options: Any
) -> str:
    """One message through the application's connection, in its open transaction (if any)."""
    return await Outbox(schema=database).enqueue_async(conn, topic, payload, **options)


class TestMysqlStore(StoreContract):
    claims_behind_own_batches = False  # ClaimRequest.behind is not used yet (ADR 0008)

    @pytest.fixture
    def store(self, mysql_store: MysqlStore) -> MysqlStore:
        return mysql_store

    @pytest.fixture
    def add(self, mysql_database: str) -> Any:
        async def add(topic: str, payload: object, **options: Any) -> str:
            conn = await mysql_connect(mysql_database)
            try:
                return await enqueue(conn, mysql_database, topic, payload, **options)
            finally:
                conn.close()

        return add


async def test_commit_order_a_slower_earlier_transaction_is_never_overtaken(
    mysql_store: MysqlStore, mysql_database: str
) -> None:
    """T1 writes key K first (the smaller auto-increment value) but commits last; T2 writes K
    after it and commits first.

    A claim that saw only committed rows would take T2's row as K's head and publish it before
    T1's. The ordered claim counts T1's uncommitted row, so nothing of K is published until T1
    has committed, and then both in write order. Other keys are not held back meanwhile.
    """
    t1, t2 = await mysql_connect(mysql_database), await mysql_connect(mysql_database)
    publisher = RecordingPublisher()
    relay = Relay(mysql_store, publisher, RelaySettings(poll_interval=0.05, min_poll_interval=0.01))
    task = asyncio.create_task(relay.run())
    try:
        async with t1.cursor() as cur:
            await cur.execute("START TRANSACTION")
        a = await enqueue(t1, mysql_database, "t", {"n": 1}, key="K")
        async with t2.cursor() as cur:
            await cur.execute("START TRANSACTION")
        b = await enqueue(t2, mysql_database, "t", {"n": 2}, key="K")
        other = await enqueue(t2, mysql_database, "t", {"n": 3}, key="other")
        async with t2.cursor() as cur:
            await cur.execute("COMMIT")
        async with asyncio.timeout(10):
            while [m.id for m in publisher.messages] != [other]:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # the relay polls ~10 times while T1 is open
        assert [m.id for m in publisher.messages] == [other]
        async with t1.cursor() as cur:
            await cur.execute("COMMIT")
        async with asyncio.timeout(10):
            while len(publisher.messages) < 3:
                await asyncio.sleep(0.01)
        assert [m.id for m in publisher.messages] == [other, a, b]
    finally:
        relay.stop()
        await task
        t1.close()
        t2.close()


async def test_a_writer_holding_a_row_does_not_hold_up_the_settles_of_others(
    mysql_store: MysqlStore, mysql_database: str
) -> None:
    """A writer's open transaction with an outbox row of its own (a long business
    transaction) holds back that row alone.

    On a small table MariaDB read the settles' ``DELETE ... WHERE id IN (...)`` (ack,
    dead letter) through the whole table rather than the id index, and waited for the writer's
    uncommitted row: every settle stalled for the writer's transaction, or for
    ``innodb_lock_wait_timeout`` (50 s) and then failed, its leases ran out and its messages
    went out again (a probe).
    """
    writer = await mysql_connect(mysql_database)
    try:
        async with writer.cursor() as cur:
            await cur.execute("START TRANSACTION")
        await enqueue(writer, mysql_database, "t", {"n": 0}, key="held")
        add = await mysql_connect(mysql_database)
        try:
            for n in range(40):
                await enqueue(add, mysql_database, "t", {"n": n}, key=f"k{n}")
        finally:
            add.close()
        async with asyncio.timeout(20):  # a stall waits 50 s per statement
            for kind in ("extend", "published", "released", "dead"):
                claim = await mysql_store.claim_batch(
                    ClaimRequest(limit=10, lease_seconds=30, ordered=False, relay_id="r")
                )
                ids = [m.id for m in claim.messages]
                assert len(ids) == 10
                if kind == "extend":
                    assert await mysql_store.extend_lease(claim, 30) == 10
                    settlement = Settlement(published=ids)
                elif kind == "dead":
                    settlement = Settlement(dead=[(i, "no") for i in ids])
                else:
                    settlement = Settlement(**{kind: ids})
                await mysql_store.settle(claim, settlement)
        assert (await mysql_store.stats()).pending == 10  # the released ones
    finally:
        writer.close()


async def test_a_rolled_back_transaction_releases_its_key(
    mysql_store: MysqlStore, mysql_database: str
) -> None:
    """An uncommitted row holds its key back only while its transaction runs."""
    t1 = await mysql_connect(mysql_database)
    try:
        async with t1.cursor() as cur:
            await cur.execute("START TRANSACTION")
        await enqueue(t1, mysql_database, "t", {"n": 1}, key="K")
        add = await mysql_connect(mysql_database)
        try:
            b = await enqueue(add, mysql_database, "t", {"n": 2}, key="K")
        finally:
            add.close()
        claim = await mysql_store.claim_batch(
            ClaimRequest(limit=10, lease_seconds=30, ordered=True, relay_id="r")
        )
        assert claim.messages == []
        unordered = await mysql_store.claim_batch(
            ClaimRequest(limit=10, lease_seconds=30, ordered=False, relay_id="r")
        )
        assert [m.id for m in unordered.messages] == [b], "unordered claims promise no order"
        async with t1.cursor() as cur:
            await cur.execute("ROLLBACK")
    finally:
        t1.close()


async def write(database: str, messages: list[dict[str, Any]]) -> list[str]:
    """Commit ``messages`` (``enqueue`` arguments) in one transaction, in write order."""
    conn = await mysql_connect(database)
    try:
        await conn.begin()
        ids = await Outbox(schema=database).enqueue_many_async(conn, messages)
        await conn.commit()
        return ids
    finally:
        conn.close()


def ordered(limit: int) -> ClaimRequest:
    return ClaimRequest(limit=limit, lease_seconds=30, ordered=True, relay_id="r")


async def test_a_key_far_behind_a_key_in_flight_is_claimed(
    mysql_store: MysqlStore, mysql_database: str
) -> None:
    """The ordered claim starts at the claimable heads: the rows of a key in flight are not what
    it looks through, however many, and what lies behind them is found."""
    blocked = await write(mysql_database, [{"topic": "t", "payload": {}, "key": "A"}] * 3000)
    loose = await write(mysql_database, [{"topic": "t", "payload": {}}] * 2)
    behind = await write(
        mysql_database, [{"topic": "t", "payload": {}, "key": k} for k in ("B", "C", "B")]
    )
    first = await mysql_store.claim_batch(ordered(10))
    assert [m.id for m in first.messages] == blocked[:10]  # A's run from its head
    second = await mysql_store.claim_batch(ordered(10))
    assert sorted(m.id for m in second.messages) == sorted(loose + behind)
    assert (await mysql_store.claim_batch(ordered(10))).messages == []  # all three in flight


async def test_with_more_keys_than_it_reads_heads_of_the_claim_scans_behind_the_front(
    mysql_store: MysqlStore, mysql_database: str
) -> None:
    """A front of the table held by a key in flight, and more keys than the claim reads the
    heads of (KEYS_PER_MESSAGE per message): the claim scans on behind the front."""
    front = FRONT_PER_MESSAGE * 2  # a batch of 1 looks at the first FRONT_PER_MESSAGE rows
    keys = KEYS_PER_MESSAGE + 1
    ids = await write(
        mysql_database,
        [{"topic": "t", "payload": {}, "key": "A"}] * front
        + [{"topic": "t", "payload": {}, "key": f"k{n}"} for n in range(keys)]
        + [{"topic": "t", "payload": {}}],
    )
    claimed = [await mysql_store.claim_batch(ordered(1)) for _ in range(keys + 2)]
    assert [[m.id for m in c.messages] for c in claimed] == [[i] for i in [ids[0], *ids[front:]]]


async def test_migrating_step_by_step_equals_a_fresh_install(
    mysql_url: str, mysql_database: str
) -> None:
    fresh, stepwise = (
        TableNames(schema=mysql_database, table="fresh"),
        TableNames(schema=mysql_database, table="stepwise"),
    )
    async with MysqlStore(mysql_url, fresh) as store:
        assert await store.migrate() == [m.version for m in _sql.migrations("mysql")]
        assert await store.migrate() == []
        await store.check_schema()
    async with MysqlStore(mysql_url, stepwise) as store:
        for version in range(1, len(_sql.migrations("mysql")) + 1):
            assert await store.migrate(target=version) == [version]
        await store.check_schema()

        async def columns(table: str) -> list[tuple[Any, ...]]:
            rows = await store.execute(
                "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT "
                "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
                "AND TABLE_NAME LIKE %s ORDER BY TABLE_NAME, ORDINAL_POSITION",
                (mysql_database, f"{table}%"),
            )
            return [(r["TABLE_NAME"].removeprefix(table), *list(r.values())[1:]) for r in rows]

        async def indexes(table: str) -> list[tuple[Any, ...]]:
            rows = await store.execute(
                "SELECT TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX, COLUMN_NAME, NON_UNIQUE "
                "FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s "
                "AND TABLE_NAME LIKE %s ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX",
                (mysql_database, f"{table}%"),
            )
            return sorted(
                (
                    r["TABLE_NAME"].removeprefix(table),
                    r["INDEX_NAME"].removeprefix(table),
                    *list(r.values())[2:],
                )
                for r in rows
            )

        assert await columns("stepwise") == await columns("fresh")
        assert await indexes("stepwise") == await indexes("fresh")


async def test_a_cancelled_statement_always_ends_its_task(mysql_store: MysqlStore) -> None:
    """A cancellation that arrives while the server answers, or while a new connection opens,
    must end the task. asyncmy waits for both with ``asyncio.wait_for`` (for reads only with its
    own read timeout), which on Python 3.11 may return and drop the cancellation: a stopping
    relay's sweeper then slept on for 15 s."""

    async def statements() -> None:
        while True:
            async with mysql_store.db.connection() as conn:
                await fetch_value(conn, "SELECT 1")

    rng = random.Random(7)
    for _ in range(300):
        task = asyncio.create_task(statements())
        await asyncio.sleep(rng.uniform(0, 0.003))
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert done, "a cancellation was lost: the task ran on"


@pytest.mark.parametrize("suffix", ["", "_dead_letters"])
async def test_a_table_of_the_outboxes_name_not_made_by_outboxer_is_refused_first(
    mysql_url: str, mysql_database: str, suffix: str
) -> None:
    """Found by a probe: ``CREATE TABLE IF NOT EXISTS`` let an application's own ``outbox``
    pass, versions 1-4 were recorded around it, and every upgrade then failed on its missing
    columns. Refused before any DDL now, as on PostgreSQL and SQLite (their plain CREATE)."""
    conn = await mysql_connect(mysql_database)
    try:
        async with conn.cursor() as cur:
            await cur.execute(f"CREATE TABLE outbox{suffix} (id int PRIMARY KEY, data text)")
    finally:
        conn.close()
    async with MysqlStore(mysql_url, TableNames(schema=mysql_database)) as store:
        for _ in range(2):  # and again: still nothing done
            with pytest.raises(SchemaError, match=f"table `outbox{suffix}` already exists"):
                await store.migrate()
            tables = await store.execute(
                "SELECT TABLE_NAME AS name FROM information_schema.TABLES "
                f"WHERE TABLE_SCHEMA = '{mysql_database}'"
            )
            assert [row["name"] for row in tables] == [f"outbox{suffix}"]


@pytest.mark.parametrize(
    ("other", "installed"),
    [("outbox_inbox", 0), ("outbox_inbox_failures", 0), ("outbox_inbox", 2), ("outbox_relays", 0)],
)
async def test_another_outbox_named_after_one_of_this_outboxes_tables_is_refused(
    mysql_url: str, mysql_database: str, other: str, installed: int
) -> None:
    """Found by a probe: two outboxes in one database, ``outbox_inbox`` and ``outbox``. The
    ``CREATE TABLE IF NOT EXISTS`` of ``outbox``'s inbox found the other's outbox table and
    passed: ``db upgrade`` reported version 9, and ``outbox``'s consumers would have written
    their inbox rows into the other outbox's messages (also on an upgrade from version 2, before
    the inbox). Refused before any DDL now, the other outbox untouched."""
    names = TableNames(schema=mysql_database)
    async with MysqlStore(mysql_url, names) as store:
        if installed:
            await store.migrate(target=installed)
        async with MysqlStore(mysql_url, TableNames(other, mysql_database)) as neighbour:
            await neighbour.migrate()
            before = await store.execute(
                f"SELECT TABLE_NAME AS t, COUNT(*) AS n FROM information_schema.COLUMNS "
                f"WHERE TABLE_SCHEMA = '{mysql_database}' GROUP BY TABLE_NAME ORDER BY 1"
            )
            for _ in range(2):
                with pytest.raises(SchemaError, match=f"table `{other}` already exists"):
                    await store.migrate()
            after = await store.execute(
                f"SELECT TABLE_NAME AS t, COUNT(*) AS n FROM information_schema.COLUMNS "
                f"WHERE TABLE_SCHEMA = '{mysql_database}' GROUP BY TABLE_NAME ORDER BY 1"
            )
            assert after == before
            assert await store.schema_version() == installed
            await neighbour.check_schema()


async def test_a_bulk_replay_moves_dead_letters_back_in_chunks_of_statements(
    mysql_url: str, mysql_database: str, mysql_store: MysqlStore
) -> None:
    """InnoDB holds its table-level AUTO-INC lock for the whole of an ``INSERT ... SELECT``
    (``innodb_autoinc_lock_mode`` 1, MariaDB's default), and every application ``INSERT`` into
    the outbox waits for it. A probe replayed 200,000 dead letters in one such statement: the
    application's enqueues waited 1.6-4.7 s. Each statement now moves at most ``REPLAY_CHUNK``
    (counted on the store's one connection, not timed), in one transaction, in dead-letter
    order."""
    count = 2 * REPLAY_CHUNK + 1
    conn = await mysql_connect(mysql_database)
    try:
        async with conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO outbox_dead_letters (id, topic, `key`, payload, content_type, "
                "headers, created_at, failure_reason, attempts) "
                "VALUES (%s, 't', %s, '{}', 'application/json', '{}', UTC_TIMESTAMP(6), "
                "'rejected', 3)",
                [(f"dl-{n:05}", f"k{n % 7}") for n in range(count)],
            )
    finally:
        conn.close()

    async def statements(store: MysqlStore) -> int:
        async with store.db.connection() as conn, conn.cursor() as cur:
            await cur.execute("SHOW SESSION STATUS LIKE 'Com_insert_select'")
            _, value = await cur.fetchone()
        return int(value)

    names = TableNames(schema=mysql_database)
    async with MysqlStore(mysql_url, names, max_connections=1) as store:
        before = await statements(store)
        replayed = await store.replay_dead_letters(DeadLetterFilter(topic="t"))
        assert await statements(store) - before == 3  # it was 1
    assert replayed == [f"dl-{n:05}" for n in range(count)]
    page = await mysql_store.list_messages(MessageFilter(), limit=1000, cursor=None)
    assert [m.id for m in page.items] == replayed[:1000]  # back in dead-letter order
    stats = await mysql_store.stats()
    assert stats.dead_letters == 0 and stats.pending == count
