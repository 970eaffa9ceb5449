"""Schema upgrades under the faults found by trying: concurrent upgrades into one new schema, a
schema newer than the package, a mistyped SQLite path; and upgrades that rebuild what holds data."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from outboxer.config import TableNames
from outboxer.errors import SchemaError
from outboxer.inbox import consume
from outboxer.message import Message
from outboxer.ports import ConsumeFailure, DeadLetterFilter
from outboxer.stores import _sql, ddl
from outboxer.stores.mysql import MysqlStore
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.sqlite import SqliteStore
from tests.conftest import unique_name


async def test_concurrent_upgrades_of_different_tables_into_one_new_postgres_schema(
    pg_url: str, pg_schema: str
) -> None:
    # Before the lock was per schema, one run in three failed on CREATE SCHEMA (unique
    # violation); three tables in five fresh schemas make that failure near certain.
    for round_ in range(5):
        schema = pg_schema if round_ == 0 else f"{pg_schema}_{round_}"
        stores = [PostgresStore(pg_url, TableNames(f"t{i}", schema)) for i in range(3)]
        try:
            for store in stores:
                await store.open()
            applied = await asyncio.gather(*(store.migrate() for store in stores))
            latest = _sql.migrations("postgres")[-1].version
            assert all(versions[-1] == latest for versions in applied)
            assert [await store.schema_version() for store in stores] == [latest] * 3
        finally:
            await stores[0].execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            for store in stores:
                await store.close()


async def test_concurrent_upgrades_of_different_tables_into_one_new_mysql_database(
    mysql_url: str,
) -> None:
    database = unique_name("obu")
    stores = [MysqlStore(mysql_url, TableNames(f"t{i}", database)) for i in range(3)]
    try:
        for store in stores:
            await store.open()
        await asyncio.gather(*(store.migrate() for store in stores))
        latest = _sql.migrations("mysql")[-1].version
        assert [await store.schema_version() for store in stores] == [latest] * 3
    finally:
        await stores[0].execute(f"DROP DATABASE IF EXISTS `{database}`")
        for store in stores:
            await store.close()


async def _mark_newer(store: PostgresStore | SqliteStore | MysqlStore, dialect: str) -> None:
    newer = _sql.migrations(dialect)[-1].version + 1
    await store.execute(f"INSERT INTO {{schema_version}} (version) VALUES ({newer})")


async def test_a_newer_postgres_schema_is_refused_not_reported_current(
    pg_store: PostgresStore,
) -> None:
    await _mark_newer(pg_store, "postgres")
    with pytest.raises(SchemaError, match="newer than this outboxer"):
        await pg_store.migrate()
    with pytest.raises(SchemaError):
        await pg_store.check_schema()


async def test_a_newer_sqlite_schema_is_refused_not_reported_current(
    sqlite_store: SqliteStore,
) -> None:
    await _mark_newer(sqlite_store, "sqlite")
    with pytest.raises(SchemaError, match="newer than this outboxer"):
        await sqlite_store.migrate()


async def test_a_newer_mysql_schema_is_refused_not_reported_current(
    mysql_store: MysqlStore,
) -> None:
    await _mark_newer(mysql_store, "mysql")
    with pytest.raises(SchemaError, match="newer than this outboxer"):
        await mysql_store.migrate()


async def test_a_schema_from_before_the_inbox_still_gives_stats_without_consume_failures(
    pg_url: str, pg_schema: str, mysql_url: str, mysql_database: str, tmp_path: Path
) -> None:
    """The stats read the inbox's failures table too (``consume_failures``): on a schema older
    than the inbox (version 2, as a library user may still run) there is no such table, no
    consumer, and the figures of the outbox are given all the same."""
    stores = [
        PostgresStore(pg_url, TableNames(schema=pg_schema)),
        SqliteStore(tmp_path / "v2.db"),
        MysqlStore(mysql_url, TableNames(schema=mysql_database)),
    ]
    for store in stores:
        async with store:
            assert await store.migrate(target=2) == [1, 2]
            await store.execute(
                "INSERT INTO {outbox} (id, topic, payload, content_type, headers) "
                "VALUES ('m-1', 'orders', 'x', 'application/json', '{}')"
            )
            stats = await store.stats()
            assert (stats.pending, stats.dead_letters, list(stats.consume_failures)) == (1, 0, [])
            assert stats.to_json()["consume_failures"] == {}


async def test_a_mistyped_sqlite_path_is_reported_missing_and_not_created(tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    async with SqliteStore(path) as store:
        with pytest.raises(SchemaError, match="does not exist: run 'outboxer db upgrade'"):
            await store.check_schema()
        with pytest.raises(SchemaError):
            await store.stats()
        assert not path.exists()
        # 'db upgrade' is the one operation that creates it; the open store then works.
        await store.migrate()
        assert path.exists()
        await store.check_schema()
        assert (await store.stats()).pending == 0


async def test_a_sqlite_table_name_in_other_letter_case_is_the_same_outbox(tmp_path: Path) -> None:
    """Found by a probe: SQLite's names ignore case, so ``--table Outbox`` is the outbox
    ``outbox``: ``db upgrade --table Outbox`` said "up to date", while ``stats``, the relay and
    every other command said "outbox table Outbox ... is missing: run 'outboxer db upgrade'"
    (the version table was looked up with a case-sensitive comparison), for good."""
    path = tmp_path / "case.db"
    async with SqliteStore(path) as store:
        await store.migrate()
    for spelling in ("Outbox", "OUTBOX"):
        async with SqliteStore(path, TableNames(spelling)) as same:
            assert await same.migrate() == []
            assert await same.schema_version() == ddl.latest_version("sqlite")
            await same.check_schema()
            assert (await same.stats()).pending == 0


@pytest.mark.parametrize("other", ["outbox_schema_version", "outbox_inbox"])
async def test_another_outbox_named_after_one_of_the_outboxes_tables_is_refused_in_one_line(
    pg_url: str, pg_schema: str, tmp_path: Path, other: str
) -> None:
    """Found by a probe: beside an outbox ``outbox_schema_version``, ``db upgrade`` (and every
    command) of the outbox ``outbox`` failed with "column "version" does not exist", naming
    neither table (PostgreSQL, SQLite). Refused as on MySQL now, naming the table; the other
    outbox untouched."""
    for names, store in (
        (TableNames(schema=pg_schema), PostgresStore(pg_url, TableNames(other, pg_schema))),
        (TableNames(), SqliteStore(tmp_path / "two.db", TableNames(other))),
    ):
        async with store as neighbour:
            await neighbour.migrate()
            same = type(store)(pg_url if names.schema else tmp_path / "two.db", names)
            async with same:
                for _ in range(2):
                    with pytest.raises(
                        SchemaError, match=f'table "{other}" already exists and was not created'
                    ):
                        await same.migrate()
            await neighbour.check_schema()


async def test_a_store_opened_before_the_upgrade_sees_the_new_database(tmp_path: Path) -> None:
    path = tmp_path / "later.db"
    async with SqliteStore(path) as relay_side:
        with pytest.raises(SchemaError):
            await relay_side.check_schema()
        async with SqliteStore(path) as upgrader:
            await upgrader.migrate()
        await relay_side.check_schema()


async def test_the_upgrade_to_8_keeps_every_dead_letter_and_lets_an_id_fail_both_ways(
    pg_url: str, pg_schema: str, mysql_url: str, mysql_database: str, tmp_path: Path
) -> None:
    """Version 8 makes the dead letters unique by (id, direction) (SQLite rebuilds the table):
    the dead letters of version 7 stay as they were, in the same order, and the next one is
    numbered after every number used before (list cursors go on), also after the newest was
    purged; then an id with a publish dead letter can get a consume dead letter too."""

    async def failing(message: Message, connection: Any, attempt: int) -> None:
        raise ValueError("cannot handle")

    def judge(message: Message, attempts: int, error: Exception) -> ConsumeFailure:
        return ConsumeFailure(f"gave up: {error}", None)

    stores = [
        (PostgresStore(pg_url, TableNames(schema=pg_schema)), "'x'", "now()"),
        (SqliteStore(tmp_path / "v7.db"), "X'78'", "1.0e9"),
        (MysqlStore(mysql_url, TableNames(schema=mysql_database)), "'x'", "UTC_TIMESTAMP(6)"),
    ]
    for store, x, now in stores:
        async with store:
            assert await store.migrate(target=7) == list(range(1, 8))
            for n in (1, 2, 3):  # as version 7's relays wrote them
                await store.execute(
                    "INSERT INTO {dead_letters} (id, topic, payload, content_type, headers,"
                    " created_at, failure_reason, attempts) VALUES"
                    f" ('m-{n}', 'orders', {x}, 'application/json', '{{}}', {now}, 'r{n}', 3)"
                )
            assert await store.purge_dead_letters(DeadLetterFilter(ids=["m-3"])) == ["m-3"]
            everything = DeadLetterFilter()
            before = (await store.list_dead_letters(everything, limit=10, cursor=None)).items
            assert [(d.id, d.direction) for d in before] == [("m-2", "publish"), ("m-1", "publish")]

            assert await store.migrate() == [8, 9]
            await store.check_schema()
            assert (
                await store.list_dead_letters(everything, limit=10, cursor=None)
            ).items == before
            received = Message(id="m-1", topic="orders", payload=b"x")
            options: dict[str, Any] = {"on_failure": judge, "retention_seconds": 60}
            assert await consume(store, "c", [received], failing, **options) == ["dead"]
            page = await store.list_dead_letters(everything, limit=1, cursor=None)
            assert [(d.id, d.direction) for d in page.items] == [("m-1", "consume")]
            assert page.next_cursor == "4"  # after m-3's number, which was purged
            rest = await store.list_dead_letters(everything, limit=10, cursor=page.next_cursor)
            assert rest.items == before


async def test_a_mysql_upgrade_killed_after_its_ddl_can_be_run_again(
    mysql_url: str, mysql_database: str
) -> None:
    """Found by a probe: `db upgrade` killed while MariaDB ran 0008's ALTER (the server finished
    it, the version was never recorded) left a schema every later upgrade failed on ("Can't DROP
    INDEX"), and every other command said "run 'outboxer db upgrade'". A DDL statement finds
    what it would create there (or what it would drop gone) only if it was applied: it is
    skipped, and the upgrade goes on."""
    names = TableNames(schema=mysql_database)
    async with MysqlStore(mysql_url, names) as store:
        assert await store.migrate(target=7) == list(range(1, 8))
        [step] = [m for m in _sql.migrations("mysql") if m.version == 8]
        await store.execute(_sql.render(step.sql, names, quote="`"))  # as the killed upgrade
        assert await store.migrate() == [8, 9]
        await store.check_schema()
        # Every migration: the versions forgotten, as if each upgrade had been killed.
        await store.execute("DELETE FROM {schema_version} WHERE version > 1")
        assert await store.migrate() == list(range(2, 10))
        await store.check_schema()
        assert await store.migrate() == []
