"""outboxer in a Django project: enqueue in Django's transactions, the app's migrations, the
management commands and the dead letters in the admin, on PostgreSQL and SQLite.

Transactional tests (``transaction=True``): the relay and the CLI read through their own
connections, which see only what Django committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import IntegrityError, connection, connections, transaction
from django.test import override_settings
from pydantic import BaseModel

import outboxer
from outboxer.errors import ConfigurationError, SchemaError
from outboxer.integrations.django import database_url, enqueue, enqueue_many
from outboxer.integrations.django.conf import (
    environment,
    outbox,
    search_path_schema,
    tool_names,
)
from outboxer.integrations.django.models import DeadLetter
from outboxer.stores import _sql, ddl, open_store
from tests import catalog
from tests.conftest import give_up_on, unique_name
from tests.django.conftest import relay_until_empty

ALIASES = ["default", "other", "mariadb"]
db = pytest.mark.django_db(databases=ALIASES, transaction=True)


@dataclass
class Shipped:
    order_id: int


class Refunded(BaseModel):
    order_id: int
    cents: int


def outbox_rows(alias: str) -> list[tuple[Any, ...]]:
    quote = connections[alias].ops.quote_name
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT topic, {quote('key')}, type, payload FROM outbox ORDER BY seq")
        return [tuple(_text(value) for value in row) for row in cursor.fetchall()]


def _text(value: Any) -> Any:
    # MySQL returns its VARBINARY identifiers as bytes, the payload is bytes everywhere
    return bytes(value).decode() if isinstance(value, bytes | memoryview) else value


@db
@pytest.mark.parametrize("alias", ALIASES)
def test_enqueue_commits_and_rolls_back_with_djangos_transaction(alias: str) -> None:
    with transaction.atomic(using=alias):
        outboxer.enqueue(connections[alias], "orders", {"order": 1}, key="c1")
        outboxer.enqueue(connections[alias], "orders", Shipped(order_id=1), type="Shipped")
        enqueue("orders", Refunded(order_id=1, cents=450), using=alias, type="Refunded")
        enqueue_many([{"topic": "bulk", "payload": {"n": n}} for n in range(3)], using=alias)
    with transaction.atomic(using=alias):
        outboxer.enqueue(connections[alias], "orders", {"order": 2})
        transaction.set_rollback(True, using=alias)  # the order is not saved: nor its message
    assert outbox_rows(alias) == [
        ("orders", "c1", None, '{"order":1}'),
        ("orders", None, "Shipped", '{"order_id":1}'),
        ("orders", None, "Refunded", '{"order_id":1,"cents":450}'),
        *[("bulk", None, None, f'{{"n":{n}}}') for n in range(3)],
    ]


@db
@pytest.mark.parametrize("alias", ALIASES)
def test_a_long_batch_is_all_or_nothing_inside_atomic(alias: str) -> None:
    """A batch longer than ``Outbox.STREAM_CHUNK`` goes to the driver's streaming writer
    (PostgreSQL, MariaDB) when Django has a transaction open: a message refused in a late
    chunk leaves none of the batch and Django's transaction usable."""
    batch = [{"topic": "bulk", "payload": {"n": n}} for n in range(2500)]
    with transaction.atomic(using=alias):
        with pytest.raises(ConfigurationError, match=r"^message 2300: cannot serialize payload"):
            enqueue_many([*batch[:2300], {"topic": "bulk", "payload": float("nan")}], using=alias)
        ids = enqueue_many(batch, using=alias)
    assert len(ids) == 2500
    assert outbox_rows(alias) == [("bulk", None, None, f'{{"n":{n}}}') for n in range(2500)]


@db
@pytest.mark.parametrize("alias", ALIASES)
def test_a_write_the_database_refuses_raises_djangos_exception(alias: str) -> None:
    """An id stored before, in a batch (short, or long: streamed on PostgreSQL and MariaDB) or
    in one large row on MariaDB, all handed to the driver's writer: the application's
    ``except django.db.IntegrityError`` catches it, as when a row goes through Django's cursor
    (the driver's own IntegrityError went past it)."""
    with transaction.atomic(using=alias):
        stored = enqueue("orders", {}, using=alias)
    twice = {"topic": "orders", "payload": {}, "id": stored}
    batch = [{"topic": "bulk", "payload": {"n": n}} for n in range(2500)]
    for refused in ([twice], [*batch[:2200], twice, *batch[2200:]]):
        with pytest.raises(IntegrityError), transaction.atomic(using=alias):
            enqueue_many(refused, using=alias)
    for payload in ({}, b"x" * 70_000):
        with pytest.raises(IntegrityError), transaction.atomic(using=alias):
            enqueue("orders", payload, id=stored, using=alias)
    assert outbox_rows(alias) == [("orders", None, None, "{}")]


@db
def test_a_payload_over_max_allowed_packet_is_refused_and_the_transaction_goes_on() -> None:
    """On MariaDB a statement over ``max_allowed_packet`` makes the server drop the connection,
    and Django's transaction with it: a large row goes to the driver's writer, which refuses it
    before sending it (one byte over the server's own limit: without the check, the server
    would refuse it); a 2 MiB payload is written whole."""
    with connections["mariadb"].cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        (limit,) = cursor.fetchone()
    huge, two_mib = b"x" * (limit + 1), bytes(range(256)) * (2 << 12)
    over = (
        rf"payload of {limit + 1:,} bytes makes a statement of up to [\d,]+ bytes, over the "
        rf"server's max_allowed_packet of {limit:,}"
    )
    with transaction.atomic(using="mariadb"):
        kept = [enqueue("orders", {"n": 1}, using="mariadb")]
        with pytest.raises(ConfigurationError, match=f"^{over}"):
            enqueue("orders", huge, using="mariadb")
        with pytest.raises(ConfigurationError, match=f"^message 1: {over}"):
            enqueue_many([{"topic": "orders", "payload": p} for p in (b"", huge)], using="mariadb")
        kept.append(enqueue("orders", two_mib, using="mariadb"))
    with connections["mariadb"].cursor() as cursor:
        cursor.execute("SELECT id, payload FROM outbox ORDER BY seq")
        stored = [(_text(id_), bytes(payload)) for id_, payload in cursor.fetchall()]
    assert stored == [(kept[0], b'{"n":1}'), (kept[1], two_mib)]


@db
def test_django_db_connection_is_the_default_alias_and_refuses_await() -> None:
    with transaction.atomic():
        outboxer.enqueue(connection, "orders", {"via": "django.db.connection"})
    assert outbox_rows("default") == [("orders", None, None, '{"via":"django.db.connection"}')]
    assert outbox_rows("other") == []
    with pytest.raises(ConfigurationError, match="synchronous: use 'enqueue"):
        asyncio.run(outboxer.enqueue_async(connection, "orders", {}))


@db
@pytest.mark.parametrize("alias", ALIASES)
def test_the_migrations_build_the_schema_db_upgrade_builds(alias: str, tmp_path: Path) -> None:
    # pytest-django migrated the test database: the app's migration ran on it
    url = database_url(alias)
    vendor = connections[alias].vendor
    if vendor == "sqlite":
        reference = tmp_path / "reference.db"
        call_command("outboxer", "db", "upgrade", "--database-url", f"sqlite:///{reference}")
        migrated, upgraded = (
            catalog.sqlite(url.removeprefix("sqlite:///")),
            catalog.sqlite(reference),
        )
    else:
        schema = unique_name("reference")  # a schema beside the test database's (MySQL: a database)
        try:
            call_command("outboxer", "db", "upgrade", "--database-url", url, "--schema", schema)
            if vendor == "postgresql":
                migrated, upgraded = catalog.postgres(url, "public"), catalog.postgres(url, schema)
            else:
                name = connections[alias].settings_dict["NAME"]
                migrated, upgraded = catalog.mysql(name), catalog.mysql(schema)
        finally:
            drop = (
                "DROP SCHEMA IF EXISTS {} CASCADE"
                if vendor == "postgresql"
                else "DROP DATABASE IF EXISTS {}"
            )
            with connections[alias].cursor() as cursor:
                cursor.execute(drop.format(connections[alias].ops.quote_name(schema)))
    assert upgraded["versions"] == list(range(1, ddl.latest_version("postgres") + 1))
    assert migrated == upgraded


@db
@pytest.mark.parametrize("alias", ALIASES)
def test_migrating_again_over_an_installed_schema_keeps_it(
    alias: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with transaction.atomic(using=alias):
        enqueue("orders", {"kept": True}, using=alias)
    call_command("migrate", "outboxer", "zero", database=alias, verbosity=0)
    call_command("migrate", "outboxer", database=alias, verbosity=0)
    assert outbox_rows(alias) == [("orders", None, None, '{"kept":true}')]
    call_command("outboxer", "db", "upgrade")
    assert "up to date" in capsys.readouterr().out


@db
@pytest.mark.parametrize("alias", ALIASES)
def test_migrate_refuses_another_outbox_named_after_one_of_the_outboxes_tables(
    alias: str,
) -> None:
    """Found by a probe: on MariaDB, beside an outbox ``probe_inbox``, ``migrate`` with
    ``TABLE = "probe"`` took the other's outbox table for its inbox (``CREATE TABLE IF NOT
    EXISTS``) and recorded the version around it. Refused before any DDL now, on every
    database, naming the table."""
    url, quote = database_url(alias), connections[alias].ops.quote_name
    other = [f"probe_inbox{suffix}" for suffix in _sql.TABLES.values()]
    call_command("outboxer", "db", "upgrade", "--database-url", url, "--table", "probe_inbox")
    try:
        with override_settings(OUTBOXER={"TABLE": "probe", "DATABASE": alias}):
            call_command("migrate", "outboxer", "zero", database=alias, verbosity=0)
            with pytest.raises(SchemaError, match=r"probe_inbox. already exists and was not"):
                call_command("migrate", "outboxer", database=alias, verbosity=0)
        with connections[alias].cursor() as cursor:
            tables = connections[alias].introspection.table_names(cursor)
            assert not [t for t in tables if t.startswith("probe") and t not in other]
    finally:
        call_command("migrate", "outboxer", database=alias, verbosity=0)
        with connections[alias].cursor() as cursor:
            for table in other:
                cursor.execute(f"DROP TABLE IF EXISTS {quote(table)}")


@db
def test_management_commands_take_the_database_from_the_settings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with transaction.atomic():
        enqueue("orders", {"n": 1}, type="NoHandler")
    call_command("outboxer", "stats", "--json")
    assert json.loads(capsys.readouterr().out)["pending"] == 1
    with override_settings(OUTBOXER={"DATABASE": "other"}):
        call_command("outboxer", "stats", "--json")
        assert json.loads(capsys.readouterr().out)["pending"] == 0
    with (
        override_settings(OUTBOXER={"BATCH": 5}),
        pytest.raises(ImproperlyConfigured, match="BATCH_SIZE"),
    ):
        call_command("outboxer", "stats")
    with pytest.raises(SystemExit) as exited:
        call_command("outboxer", "dlq", "show", "missing")
    assert exited.value.code != 0
    assert "no dead letter" in capsys.readouterr().err


@db
def test_a_schema_is_left_out_on_sqlite_as_the_model_leaves_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``OUTBOXER["SCHEMA"]`` is a PostgreSQL schema (a MySQL database) and SQLite has none: the
    dead-letter model left it out there, but on a SQLite database (a project's tests, another
    alias) ``migrate`` stopped on a traceback ("SQLite has no schemas") and ``enqueue`` failed
    ("no such table: shop_events.outbox") (a probe). The tables, the writes, the commands and
    the admin's store all use the plain names on SQLite."""
    with override_settings(OUTBOXER={"SCHEMA": "shop_events", "DATABASE": "other"}):
        call_command("migrate", "outboxer", "zero", database="other", verbosity=0)
        with connections["other"].cursor() as cursor:  # as on a database never migrated
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            for (table,) in cursor.fetchall():
                if table.startswith("outbox"):
                    cursor.execute(f'DROP TABLE "{table}"')
        call_command("migrate", "outboxer", database="other", verbosity=0)
        with transaction.atomic(using="other"):
            enqueue("orders", {"n": 1}, using="other")
            enqueue_many([{"topic": "orders", "payload": {"n": 2}}], using="other")
        call_command("outboxer", "stats", "--json")
        assert json.loads(capsys.readouterr().out)["pending"] == 2
        assert tool_names("other").schema is None
        assert environment("other").get("OUTBOXER_SCHEMA") is None
    assert [row[3] for row in outbox_rows("other")] == ['{"n":1}', '{"n":2}']


@db
def test_manage_py_outboxer_says_a_setting_it_cannot_take_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It printed a traceback (a probe); ``call_command`` still raises it."""
    from outboxer.integrations.django.management.commands.outboxer import Command

    with override_settings(OUTBOXER={"BATCH": 5}), pytest.raises(SystemExit) as exited:
        Command().run_from_argv(["manage.py", "outboxer", "stats"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("manage.py outboxer: error: OUTBOXER['BATCH'] is no option")
    assert len(err.splitlines()) == 1 and "Traceback" not in err


@contextlib.contextmanager
def database_settings(alias: str, **changes: Any) -> Iterator[None]:
    """``DATABASES[alias]`` with ``changes``, for ``database_url`` (Django keeps one settings
    dict per connection)."""
    conf = connections[alias].settings_dict
    saved = dict(conf)
    conf.update(changes)
    try:
        yield
    finally:
        conf.clear()
        conf.update(saved)


@db
def test_the_database_url_carries_sockets_ipv6_and_the_options_the_store_knows() -> None:
    """Found by a probe: a socket HOST became part of the database name, an IPv6 address was
    not bracketed, ``OPTIONS`` were dropped, and a ``search_path`` in them (where Django's
    migrations put the outbox) was not where the commands and the admin looked."""
    name = connections["default"].settings_dict["NAME"]
    with database_settings("default", HOST="/var/run/postgresql", PORT="5432"):
        url = database_url("default")  # the port names the socket file: kept
        assert url == f"postgresql://postgres@/{name}?host=%2Fvar%2Frun%2Fpostgresql&port=5432"

        async def stats() -> int:
            async with open_store(url, outbox().names) as store:  # through the socket
                return (await store.stats()).pending

        assert asyncio.run(stats()) == 0
    options = {"sslmode": "disable", "options": "-c search_path=elsewhere,public", "pool": True}
    with database_settings("default", HOST="::1", PORT="5432", OPTIONS=options):
        assert database_url("default") == f"postgresql://postgres@[::1]:5432/{name}?sslmode=disable"
        assert search_path_schema("default") == "elsewhere"
        for options, schema in (
            ("-c search_path=ShopSchema", "shopschema"),  # unquoted: lower case
            ('-c search_path="ShopSchema"', "ShopSchema"),
            ("-c search_path=$user,shop", "shop"),
            ("-c statement_timeout=5 -csearch_path=pg_catalog,shop", "shop"),
            ("-c SEARCH_PATH=shop", "shop"),
            ("--search-path=shop", "shop"),
            ("-c statement_timeout=5", None),
        ):
            with database_settings("default", OPTIONS={"options": options}):
                assert search_path_schema("default") == schema, options
        assert environment("default")["OUTBOXER_SCHEMA"] == "elsewhere"
        assert tool_names("default").schema == "elsewhere"
        with override_settings(OUTBOXER={"SCHEMA": "mine"}):
            assert environment("default")["OUTBOXER_SCHEMA"] == "mine"
            assert tool_names("default").schema == "mine"
        # None is no schema of its own (as the docs' example writes it): the search_path's,
        # where the migrations and enqueue put the outbox (the commands read another: a probe)
        with override_settings(OUTBOXER={"SCHEMA": None}):
            assert environment("default")["OUTBOXER_SCHEMA"] == "elsewhere"
            assert tool_names("default").schema == "elsewhere"
    with database_settings("default", HOST="[::1]", PORT="5432", OPTIONS={}):
        assert database_url("default") == f"postgresql://postgres@[::1]:5432/{name}"
    maria = connections["mariadb"].settings_dict["NAME"]
    with database_settings("mariadb", HOST="/run/mysqld/mysqld.sock", PORT=""):
        url = database_url("mariadb")
        assert url == f"mysql://root@/{maria}?unix_socket=%2Frun%2Fmysqld%2Fmysqld.sock"

        async def maria_stats() -> int:
            async with open_store(url, outbox().names) as store:
                return (await store.stats()).pending

        assert asyncio.run(maria_stats()) == 0


@db
@pytest.mark.parametrize("alias", ALIASES)
def test_dead_letters_in_the_admin_replay_and_delete(alias: str, admin_client: Any) -> None:
    with transaction.atomic(using=alias):
        ids = [enqueue("orders", {"n": n}, type="NoHandler", using=alias) for n in range(3)]
    relay_until_empty(alias)  # no handler for NoHandler: dead-lettered at once
    with override_settings(OUTBOXER={"DATABASE": alias}):
        page = admin_client.get("/admin/outboxer/deadletter/")
        assert page.status_code == 200
        for message_id in ids:
            assert message_id in page.content.decode()
        detail = admin_client.get(
            f"/admin/outboxer/deadletter/{DeadLetter.objects.using(alias).get(message_id=ids[0]).pk}/change/"
        )
        assert "no handler" in detail.content.decode().lower()

        action = {
            "action": "replay",
            "_selected_action": [DeadLetter.objects.using(alias).get(message_id=ids[0]).pk],
        }
        replayed = admin_client.post("/admin/outboxer/deadletter/", action, follow=True)
        assert "Replayed 1 dead letter(s)" in replayed.content.decode()
        assert [row[2] for row in outbox_rows(alias)] == ["NoHandler"]

        # A consumer of this database gives up on ids[1] too: two rows of one id. Each action
        # acts on the rows selected, not on every dead letter of their ids.
        consume_dead_letter(alias, ids[1])
        rows = DeadLetter.objects.using(alias).filter(message_id=ids[1])
        assert sorted(rows.values_list("direction", flat=True)) == ["consume", "publish"]
        chosen = {"_selected_action": [rows.get(direction="consume").pk]}
        purged = admin_client.post(
            "/admin/outboxer/deadletter/", {"action": "purge", **chosen}, follow=True
        )
        assert "Deleted 1 dead letter(s)" in purged.content.decode()
        assert list(rows.values_list("direction", flat=True)) == ["publish"]

        purge = {
            "action": "purge",
            "_selected_action": [d.pk for d in DeadLetter.objects.using(alias).all()],
        }
        purged = admin_client.post("/admin/outboxer/deadletter/", purge, follow=True)
        assert "Deleted 2 dead letter(s)" in purged.content.decode()
        assert not DeadLetter.objects.using(alias).exists()

        # The store out of reach: the action says so on the page (it was a 500: a probe).
        if alias != "other":  # (SQLite has no server to be out of reach)
            consume_dead_letter(alias, ids[2])
            chosen = {"_selected_action": [DeadLetter.objects.using(alias).get().pk]}
            with database_settings(alias, PORT="1"):
                failed = admin_client.post(
                    "/admin/outboxer/deadletter/", {"action": "replay", **chosen}, follow=True
                )
            assert failed.status_code == 200
            assert "Nothing replayed: " in failed.content.decode()
            assert DeadLetter.objects.using(alias).count() == 1


def consume_dead_letter(alias: str, message_id: str) -> None:
    """A consumer of ``alias``'s outbox database gives up on ``message_id`` at once."""

    async def give_up() -> None:
        async with open_store(database_url(alias), outbox().names) as store:
            await give_up_on(store, message_id)

    asyncio.run(give_up())


def test_the_last_migration_reaches_the_schema_this_outboxer_expects() -> None:
    """A new schema version of outboxer needs a migration of the Django app (here, not in a
    user's project); without it every Django project would stop one version behind."""
    from django.db.migrations.loader import MigrationLoader

    from outboxer.integrations.django.operations import UpgradeOutbox

    loader = MigrationLoader(None, ignore_no_migrations=True)
    versions = [
        operation.version
        for (app, _), migration in loader.disk_migrations.items()
        if app == "outboxer"
        for operation in migration.operations
        if isinstance(operation, UpgradeOutbox)
    ]
    assert max(versions) == ddl.latest_version("postgres") == ddl.latest_version("sqlite")
    assert max(versions) == ddl.latest_version("mysql")
