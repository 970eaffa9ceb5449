"""``outboxer db sql``: the printed DDL, applied by the database's own shell, builds the schema
``db upgrade`` builds, and ``db upgrade`` afterwards finds it current.

Fresh install and the upgrade from every older version, on PostgreSQL (``psql``), MariaDB
(``mysql``) and SQLite (``executescript``, what the ``sqlite3`` shell does).
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outboxer.config import TableNames
from outboxer.stores import ddl, open_store
from tests import catalog
from tests.acceptance.conftest import Cli
from tests.conftest import DIALECTS, MYSQL_URL, PG_URL, require_dialect, unique_name


class Database:
    """One dialect's test server: fresh outboxes on it, its shell, its catalog."""

    def __init__(self, dialect: str, tmp_path: Path) -> None:
        self.dialect = dialect
        self.tmp_path = tmp_path
        self.created: list[str] = []

    def new(self) -> tuple[str, list[str]]:
        """A fresh place for an outbox: its URL and the CLI options naming it."""
        name = unique_name("ddl")
        self.created.append(name)
        if self.dialect == "sqlite":
            return f"sqlite:///{self.tmp_path / name}.db", []
        return (PG_URL if self.dialect == "postgres" else MYSQL_URL), ["--schema", name]

    def apply(self, url: str, script: str) -> None:
        if self.dialect == "sqlite":
            conn = sqlite3.connect(url.removeprefix("sqlite:///"))
            try:
                conn.executescript(script)
            finally:
                conn.close()
            return
        shell = (
            ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", PG_URL]
            if self.dialect == "postgres"
            else ["mysql", "-h", "127.0.0.1", "-P", "3306", "-u", "root"]
        )
        subprocess.run(shell, input=script, text=True, check=True, capture_output=True, timeout=60)

    def catalog(self, url: str, options: list[str]) -> dict[str, Any]:
        if self.dialect == "sqlite":
            return catalog.sqlite(url.removeprefix("sqlite:///"))
        if self.dialect == "postgres":
            return catalog.postgres(PG_URL, options[1])
        return catalog.mysql(options[1])

    def drop(self) -> None:
        if self.dialect == "sqlite":
            return
        drop = (
            "DROP SCHEMA IF EXISTS {} CASCADE"
            if self.dialect == "postgres"
            else "DROP DATABASE IF EXISTS {}"
        )
        quote = ddl.quote_of(self.dialect)
        self.apply(
            "", ";\n".join(drop.format(f"{quote}{name}{quote}") for name in self.created) + ";"
        )


@pytest.fixture(params=DIALECTS)
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    require_dialect(request.param)
    db = Database(request.param, tmp_path)
    yield db
    db.drop()


def _migrate(url: str, options: list[str], target: int) -> None:
    names = TableNames(schema=options[1] if options else None)

    async def migrate() -> None:
        async with open_store(url, names) as store:
            await store.migrate(target=target)

    asyncio.run(migrate())


def test_db_sql_builds_the_schema_db_upgrade_builds(cli: Cli, database: Database) -> None:
    url, options = database.new()
    assert cli("db", "upgrade", "--database-url", url, *options).returncode == 0
    reference = database.catalog(url, options)
    assert reference["versions"] == list(range(1, ddl.latest_version(database.dialect) + 1))

    # fresh install, then the upgrade from each older version
    for start in range(ddl.latest_version(database.dialect)):
        url, options = database.new()
        if start:
            _migrate(url, options, start)
        printed = cli("db", "sql", "--database-url", url, "--from-version", str(start), *options)
        assert printed.returncode == 0, printed.stderr
        database.apply(url, printed.stdout)
        assert database.catalog(url, options) == reference, f"from version {start}"
        upgrade = cli("db", "upgrade", "--database-url", url, *options)
        assert upgrade.stdout.strip() == "outbox schema is up to date", upgrade.stderr


def test_db_sql_takes_a_dialect_and_refuses_what_it_cannot_print(cli: Cli) -> None:
    def by_dialect(name: str) -> str:
        return cli("db", "sql", "--dialect", name).stdout

    assert by_dialect("mariadb") == by_dialect("mysql")
    assert "ENGINE = InnoDB" in by_dialect("mysql") and "BEGIN;" not in by_dialect("mysql")
    assert by_dialect("postgresql").count("BEGIN;") == 1
    latest = ddl.latest_version("postgres")
    current = cli("db", "sql", "--dialect", "postgresql", "--from-version", str(latest))
    assert "nothing to apply" in current.stdout
    beyond = cli("db", "sql", "--dialect", "sqlite", "--from-version", str(latest + 1))
    assert (
        beyond.returncode != 0
        and f"latest sqlite schema of this outboxer is {latest}" in beyond.stderr
    )
    neither = cli("db", "sql")
    assert neither.returncode != 0 and "either --database-url or --dialect" in neither.stderr
    schema = cli("db", "sql", "--dialect", "sqlite", "--schema", "s")
    assert schema.returncode != 0 and "SQLite has no schemas" in schema.stderr
