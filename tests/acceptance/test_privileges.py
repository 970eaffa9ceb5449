"""A database role without the privileges outboxer needs (docs/operations.md, "Privileges").

A refusal is not an outage: the relay stops with ``PermissionDenied`` (the CLI with one line and
exit 2) instead of retrying forever, and loses nothing. A refused acknowledgement stops it too,
after one publish, rather than publishing the batch again each time its lease expires.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncmy
import asyncpg
import httpx
import pytest

from outboxer.admin import create_app
from outboxer.config import RelaySettings, TableNames
from outboxer.errors import PermissionDenied
from outboxer.ports import ClaimRequest, Settlement
from outboxer.relay import Relay
from outboxer.stores import open_store
from outboxer.testing import RecordingPublisher
from tests.acceptance.conftest import Cli, assert_one_line_error
from tests.conftest import mysql_connect, unique_name

INPROCESS = "inprocess://tests.acceptance.handlers:registry"
TOKEN = "test-admin-token-0123456789abcdef"


@dataclass
class Restricted:
    """The outbox tables, migrated by an administrator, and a role to give some privileges."""

    admin: Any  # the store, as the administrator
    url: str  # the role's database URL
    names: TableNames
    grant: Callable[..., Awaitable[None]]  # grant(all_but_outbox_delete: bool)


async def _execute(url_or_conn: Any, *statements: str) -> None:
    for statement in statements:
        if isinstance(url_or_conn, asyncpg.Connection):
            await url_or_conn.execute(statement)
        else:
            async with url_or_conn.cursor() as cur:
                await cur.execute(statement)


@pytest.fixture(params=["postgres", "mariadb"])
def migrated(request: pytest.FixtureRequest) -> tuple[str, Any, str]:
    """(database kind, the administrator's migrated store, its schema or database)."""
    if request.param == "postgres":
        return "postgres", request.getfixturevalue("pg_store"), request.getfixturevalue("pg_schema")
    return (
        "mariadb",
        request.getfixturevalue("mysql_store"),
        request.getfixturevalue("mysql_database"),
    )


@pytest.fixture
async def restricted(migrated: tuple[str, Any, str], pg_url: str) -> AsyncIterator[Restricted]:
    kind, admin, schema = migrated
    role = unique_name("r")
    conn: asyncpg.Connection | asyncmy.Connection
    if kind == "postgres":
        conn = await asyncpg.connect(pg_url)
        await _execute(
            conn, f"CREATE ROLE {role} LOGIN", f'GRANT USAGE ON SCHEMA "{schema}" TO {role}'
        )
        on_all = f'ALL TABLES IN SCHEMA "{schema}"'

        async def grant(all_but_outbox_delete: bool = False) -> None:
            if not all_but_outbox_delete:
                await _execute(conn, f"GRANT SELECT ON {on_all} TO {role}")
                return
            await _execute(
                conn,
                f"GRANT SELECT, INSERT, UPDATE, DELETE ON {on_all} TO {role}",
                f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" TO {role}',
                f'REVOKE DELETE ON "{schema}".outbox FROM {role}',
            )

        url = f"postgresql://{role}@127.0.0.1:5432/test"
    else:
        conn = await mysql_connect(schema)
        await _execute(conn, f"CREATE USER '{role}'@'%'")

        async def grant(all_but_outbox_delete: bool = False) -> None:
            if not all_but_outbox_delete:
                await _execute(conn, f"GRANT SELECT ON `{schema}`.* TO '{role}'@'%'")
                return
            for row in await admin.execute(f"SHOW TABLES FROM `{schema}`"):
                (table,) = row.values()
                rights = "SELECT, INSERT, UPDATE" + ("" if table == "outbox" else ", DELETE")
                await _execute(conn, f"GRANT {rights} ON `{schema}`.`{table}` TO '{role}'@'%'")

        url = f"mysql://{role}@127.0.0.1:3306/{schema}"
    try:
        yield Restricted(admin, url, TableNames(schema=schema), grant)
    finally:
        if kind == "postgres":
            await _execute(conn, f"DROP OWNED BY {role}", f"DROP ROLE {role}")
            await conn.close()
        else:
            await _execute(conn, f"DROP USER '{role}'@'%'")
            conn.close()


async def _write(admin: Any, *ids: str) -> None:
    for id_ in ids:
        await admin.execute(
            "INSERT INTO {outbox} (id, topic, payload, content_type, headers) "
            f"VALUES ('{id_}', 'orders', 'x', 'application/json', '{{}}')"
        )


async def test_a_role_that_may_only_read_stops_the_relay_and_changes_nothing(
    restricted: Restricted,
) -> None:
    await restricted.grant()
    await _write(restricted.admin, "m-1")
    publisher = RecordingPublisher()
    async with open_store(restricted.url, restricted.names) as store:
        with pytest.raises(PermissionDenied, match="Privileges"):
            await Relay(store, publisher).drain(timeout=30)
    assert publisher.messages == []
    assert (await restricted.admin.stats()).pending == 1


async def test_a_refused_acknowledgement_stops_the_relay_after_one_publish(
    restricted: Restricted,
) -> None:
    await restricted.grant(all_but_outbox_delete=True)
    await _write(restricted.admin, "m-1", "m-2", "m-3")
    publisher = RecordingPublisher()
    # Unordered: an ordered claim may see only some of the three at first (PostgreSQL's
    # commit-order gate, held back by a parallel test's open transaction), and the refused
    # acknowledgement of those stops the relay before the others are published.
    quick = RelaySettings(poll_interval=0.05, lease_seconds=1, ordered=False)
    async with open_store(restricted.url, restricted.names) as store:
        with pytest.raises(PermissionDenied):
            await Relay(store, publisher, quick).drain(timeout=30)
    assert sorted(m.id for m in publisher.messages) == ["m-1", "m-2", "m-3"]  # once each
    stats = await restricted.admin.stats()
    assert stats.pending + stats.in_flight == 3  # nothing lost


async def test_the_cli_relay_without_privileges_exits_with_one_line(
    restricted: Restricted, cli: Cli
) -> None:
    await restricted.grant()
    await _write(restricted.admin, "m-1")
    schema = restricted.names.schema or ""
    result = cli(
        "--log-level", "error", "relay", "--database-url", restricted.url, "--schema", schema,
        "--broker", INPROCESS, "--drain",
    )  # fmt: skip
    assert_one_line_error(result, 2, "outboxer: error:", "denied", "Privileges")


async def test_the_admin_api_answers_a_refused_statement_with_500_and_the_reason(
    restricted: Restricted,
) -> None:
    await restricted.grant()
    await _write(restricted.admin, "m-1")
    admin = restricted.admin
    claim = await admin.claim_batch(ClaimRequest(1, 30, ordered=False, relay_id="r"))
    await admin.settle(claim, Settlement(dead=[("m-1", "rejected")]))
    async with open_store(restricted.url, restricted.names) as store:
        app = create_app(store, token=TOKEN)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            client.headers["Authorization"] = f"Bearer {TOKEN}"
            assert (await client.get("/api/stats")).status_code == 200  # reading is allowed
            refused = await client.post("/api/deadletters/purge", json={"all": True})
    assert refused.status_code == 500
    assert "denied" in refused.json()["detail"]
    assert (await admin.stats()).dead_letters == 1  # and nothing changed
