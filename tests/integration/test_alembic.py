"""The Alembic recipe of docs/configuration.md, in a throwaway Alembic environment: ``alembic
upgrade head`` builds the schema ``db upgrade`` builds, and ``db upgrade`` finds it current.

The environment is the one ``alembic init`` writes, cut to what matters: an ``env.py`` running
migrations online or offline, and a project migration with the project's own table beside the
outbox (``op_upgrade``).
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

from outboxer.config import TableNames
from outboxer.stores import ddl
from tests import catalog
from tests.acceptance.conftest import PYTHONPATH
from tests.conftest import DIALECTS, MYSQL_URL, PG_URL, require_dialect, unique_name

ENV = """
from alembic import context
from sqlalchemy import create_engine

URL = context.config.get_main_option("sqlalchemy.url")
SCHEMA = context.config.get_main_option("outbox_schema") or None

if context.is_offline_mode():
    context.configure(url=URL, version_table_schema=SCHEMA, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    with create_engine(URL).connect() as connection:
        context.configure(connection=connection, version_table_schema=SCHEMA)
        with context.begin_transaction():
            context.run_migrations()
"""

MIGRATION = '''
"""orders, and the outbox of their events"""
import sqlalchemy as sa
from alembic import context, op

from outboxer.integrations.alembic import op_upgrade

revision = "0001"
down_revision = None

SCHEMA = context.config.get_main_option("outbox_schema") or None


def upgrade() -> None:
    op.create_table("orders", sa.Column("id", sa.Integer, primary_key=True), schema=SCHEMA)
    op_upgrade(to_version={to_version}, schema=SCHEMA)
'''


def alembic_env(tmp_path: Path, url: str, schema: str | None) -> Callable[..., str]:
    """Write the environment; returns a function running ``alembic <args>`` in it."""
    (tmp_path / "versions").mkdir(parents=True)
    (tmp_path / "env.py").write_text(ENV)
    (tmp_path / "script.py.mako").write_text("")
    latest = ddl.latest_version(ddl.dialect_of(url.split("+")[0].split(":")[0]))
    (tmp_path / "versions" / "0001_outbox.py").write_text(MIGRATION.format(to_version=latest))
    (tmp_path / "alembic.ini").write_text(
        f"[alembic]\nscript_location = {tmp_path}\nsqlalchemy.url = {url}\n"
        f"outbox_schema = {schema or ''}\n"
    )

    def alembic(*args: str) -> str:
        return run(sys.executable, "-m", "alembic", "-c", str(tmp_path / "alembic.ini"), *args)

    return alembic


def run(*command: str) -> str:
    """Run ``command`` with this checkout's outboxer; its stdout (it must succeed)."""
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def outboxer(*args: str) -> str:
    return run(str(Path(sys.executable).parent / "outboxer"), *args)


class Place:
    """Two fresh outboxes on one server: one for ``db upgrade``, one for Alembic."""

    def __init__(self, dialect: str, tmp_path: Path) -> None:
        self.dialect, self.tmp_path = dialect, tmp_path
        self.names = [unique_name("alembic"), unique_name("reference")]

    def urls(self, name: str) -> tuple[str, str, str | None]:
        """(outboxer's URL, SQLAlchemy's URL, schema) of one of them."""
        if self.dialect == "sqlite":
            path = self.tmp_path / f"{name}.db"
            return f"sqlite:///{path}", f"sqlite:///{path}", None
        if self.dialect == "postgres":
            return PG_URL, PG_URL.replace("postgresql:", "postgresql+psycopg:"), name
        url = f"{MYSQL_URL.rsplit('/', 1)[0]}/{name}"
        return url, url.replace("mysql:", "mysql+pymysql:"), None

    def catalog(self, name: str, table: str = "outbox") -> dict[str, Any]:
        if self.dialect == "sqlite":
            return catalog.sqlite(self.tmp_path / f"{name}.db", table)
        if self.dialect == "postgres":
            return catalog.postgres(PG_URL, name, table)
        return catalog.mysql(name, table)

    def create(self) -> None:
        for name in self.names:
            self._run(
                f'CREATE SCHEMA "{name}"'
                if self.dialect == "postgres"
                else f"CREATE DATABASE `{name}`"
            )

    def drop(self) -> None:
        for name in self.names:
            self._run(
                f'DROP SCHEMA IF EXISTS "{name}" CASCADE'
                if self.dialect == "postgres"
                else f"DROP DATABASE IF EXISTS `{name}`"
            )

    def _run(self, sql: str) -> None:
        if self.dialect == "postgres":
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(sql)  # type: ignore[arg-type]
        elif self.dialect == "mysql":
            conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
            try:
                conn.cursor().execute(sql)
            finally:
                conn.close()


@pytest.fixture(params=DIALECTS)
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    require_dialect(request.param)
    place = Place(request.param, tmp_path)
    place.create()
    yield place
    place.drop()


def test_alembic_upgrade_head_builds_the_schema_db_upgrade_builds(
    place: Place, tmp_path: Path
) -> None:
    alembic_name, reference_name = place.names
    url, sqlalchemy_url, schema = place.urls(alembic_name)
    alembic = alembic_env(tmp_path / "alembic", sqlalchemy_url, schema)

    alembic("upgrade", "head")

    reference_url, _, reference_schema = place.urls(reference_name)
    outboxer(
        "db",
        "upgrade",
        "--database-url",
        reference_url,
        *(["--schema", reference_schema] if reference_schema else []),
    )
    reference = place.catalog(reference_name)
    assert reference["versions"] == list(range(1, ddl.latest_version(place.dialect) + 1))
    assert place.catalog(alembic_name) == reference
    options = ["--schema", schema] if schema else []
    assert (
        outboxer("db", "upgrade", "--database-url", url, *options).strip()
        == "outbox schema is up to date"
    )


def test_offline_mode_prints_the_ddl_of_db_sql(tmp_path: Path) -> None:
    # alembic upgrade head --sql: the project's reviewers read the same statements
    alembic = alembic_env(tmp_path, "postgresql+psycopg://reviewer@nowhere/app", None)
    script = alembic("upgrade", "head", "--sql")
    for statement in ddl.upgrade_statements("postgres", TableNames()):
        assert statement in script


def test_a_schema_db_upgrade_built_first_is_left_as_it_is(place: Place, tmp_path: Path) -> None:
    """Found by a probe: ``op_upgrade`` on a database where ``outboxer db upgrade`` had run
    (a team adopting Alembic later) failed with each database's own "already exists". Online,
    the database's record decides: at the migration's version already, nothing is done."""
    alembic_name, _ = place.names
    url, sqlalchemy_url, schema = place.urls(alembic_name)
    options = ["--schema", schema] if schema else []
    outboxer("db", "upgrade", "--database-url", url, *options)
    before = place.catalog(alembic_name)
    alembic = alembic_env(tmp_path / "alembic", sqlalchemy_url, schema)
    alembic("upgrade", "head")  # the project's orders table, and nothing more of the outbox
    after = place.catalog(alembic_name)
    assert after["versions"] == before["versions"]
    assert (
        outboxer("db", "upgrade", "--database-url", url, *options).strip()
        == "outbox schema is up to date"
    )


def test_another_outbox_named_after_one_of_the_outboxes_tables_is_refused(
    place: Place, tmp_path: Path
) -> None:
    """Found by a probe: on MySQL, beside an outbox ``outbox_inbox``, ``op_upgrade()`` (the
    outbox ``outbox``) found the other's outbox table by its inbox's ``CREATE TABLE IF NOT
    EXISTS`` and recorded version 9 around it. Refused before any of the outbox's DDL now, on
    every database, naming the table."""
    alembic_name, _ = place.names
    url, sqlalchemy_url, schema = place.urls(alembic_name)
    options = ["--schema", schema] if schema else []
    outboxer("db", "upgrade", "--database-url", url, "--table", "outbox_inbox", *options)
    before = place.catalog(alembic_name, "outbox_inbox")
    alembic_env(tmp_path / "alembic", sqlalchemy_url, schema)
    config = str(tmp_path / "alembic" / "alembic.ini")
    done = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", config, "upgrade", "head"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert done.returncode != 0
    assert "outbox_inbox" in done.stderr and "was not created by outboxer for this outbox" in (
        done.stderr
    )
    assert place.catalog(alembic_name, "outbox_inbox") == before  # the other one untouched


def test_autogenerate_leaves_the_outbox_alone_with_include_name(
    place: Place, tmp_path: Path
) -> None:
    """Found by a probe: the outbox's tables are in no project's ``MetaData``, so every
    ``alembic revision --autogenerate`` proposed to drop them (pending messages included).
    ``include_name()`` in ``env.py`` leaves them out; the project's own changes still show."""
    import sqlalchemy as sa
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from outboxer.integrations.alembic import include_name

    alembic_name, _ = place.names
    _, sqlalchemy_url, schema = place.urls(alembic_name)
    alembic_env(tmp_path / "alembic", sqlalchemy_url, schema)("upgrade", "head")
    metadata = sa.MetaData()
    sa.Table("orders", metadata, sa.Column("id", sa.Integer, primary_key=True), schema=schema)

    def ours(name: str | None, type_: str, parent_names: Any) -> bool:
        return type_ != "schema" or name == schema  # this test's schema, not the others'

    def changes(hook: Callable[..., bool]) -> list[Any]:
        engine = sa.create_engine(sqlalchemy_url)
        try:
            with engine.connect() as conn:
                options = {
                    "include_name": hook,
                    "include_schemas": schema is not None,
                    "version_table_schema": schema,  # (as env.py's)
                }
                context = MigrationContext.configure(conn, opts=options)
                return compare_metadata(context, metadata)
        finally:
            engine.dispose()

    with warnings.catch_warnings():  # (reflecting the outbox: "did not recognize type xid8")
        warnings.simplefilter("ignore", sa.exc.SAWarning)
        dropped = {change[1].name for change in changes(ours) if change[0] == "remove_table"}
    assert {"outbox", "outbox_dead_letters", "outbox_inbox"} <= dropped
    assert changes(include_name(schema=schema, then=ours)) == []
    sa.Table("payments", metadata, sa.Column("id", sa.Integer, primary_key=True), schema=schema)
    [(change, table)] = changes(include_name(schema=schema, then=ours))
    assert change == "add_table" and table.name == "payments"
