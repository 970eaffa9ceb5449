"""The outbox schema as plain DDL: what ``outboxer db upgrade`` runs, for whoever applies it.

Teams that review every schema change, or own their schema through Alembic or Django
migrations, apply the outbox tables themselves; ``outboxer db sql`` prints these statements,
:mod:`outboxer.integrations.alembic` and the Django app's migrations execute them. They are the
statements the stores' ``migrate`` runs, taken from the same files (``stores/<dialect>/sql/``):
the create-if-missing of the schema and of the version table, then each migration after the
installed version followed by the row recording it. So a schema applied from here is the one
``db upgrade`` builds, and ``db upgrade`` afterwards finds it current.

No driver is imported; values are never interpolated (the only literals are version numbers).
"""

from __future__ import annotations

from dataclasses import dataclass

from outboxer import urls
from outboxer.config import TableNames
from outboxer.errors import ConfigurationError
from outboxer.stores import _sql

__all__ = [
    "DIALECTS",
    "dialect_of",
    "Step",
    "latest_version",
    "pending",
    "prelude",
    "quote_of",
    "record_version",
    "steps",
    "upgrade_script",
    "upgrade_statements",
    "version_table",
    "version_table_name",
]

#: The dialects (store packages) that have a schema, by the names users give them.
DIALECTS = {"postgresql": "postgres", "sqlite": "sqlite", "mysql": "mysql", "mariadb": "mysql"}


def dialect_of(name_or_url: str) -> str:
    """The store dialect (``postgres``, ``sqlite``, ``mysql``) of a dialect name (also
    SQLAlchemy's and Django's vendor names) or of a database URL."""
    if name_or_url in DIALECTS:
        return DIALECTS[name_or_url]
    if name_or_url in DIALECTS.values():
        return name_or_url
    if ":" not in name_or_url:
        raise ConfigurationError(
            f"outboxer has no schema for {name_or_url!r}: use one of {', '.join(DIALECTS)}"
        )
    return urls.lookup(name_or_url, "database").name


def quote_of(dialect: str) -> str:
    """How ``dialect`` quotes identifiers."""
    return "`" if dialect == "mysql" else '"'


def latest_version(dialect: str) -> int:
    """The schema version this outboxer installs on ``dialect``."""
    return _sql.migrations(dialect)[-1].version


def version_table(dialect: str, names: TableNames) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of the table that records the applied versions."""
    return _statements(_sql.read(dialect, "schema_version.sql"), dialect, names)[0]


def _statements(sql: str, dialect: str, names: TableNames) -> list[str]:
    """The statements of a SQL file, rendered for ``names``, without their final semicolons."""
    return [
        _sql.render(statement, names, quote_of(dialect)).rstrip().removesuffix(";").rstrip()
        for statement in _sql.split_statements(sql)
    ]


def version_table_name(dialect: str, names: TableNames) -> str:
    """The quoted, qualified name of the version table."""
    return _sql.render("{schema_version}", names, quote_of(dialect))


def record_version(dialect: str, names: TableNames, version: int) -> str:
    """The INSERT recording that ``version`` is applied."""
    table = version_table_name(dialect, names)
    return f"INSERT INTO {table} (version) VALUES ({int(version)})"


def prelude(dialect: str, names: TableNames) -> list[str]:
    """What exists before the first migration: the schema (PostgreSQL; a database on MySQL)
    and the version table, each created if missing."""
    statements = [version_table(dialect, names)]
    if names.schema is None or dialect == "sqlite":
        return statements
    if dialect == "mysql":
        return [f"CREATE DATABASE IF NOT EXISTS `{names.schema}`", *statements]
    return [f'CREATE SCHEMA IF NOT EXISTS "{names.schema}"', *statements]


@dataclass(frozen=True, slots=True)
class Step:
    """One migration: its version and its statements, the last of which records it."""

    version: int
    statements: list[str]


def steps(
    dialect: str, names: TableNames, from_version: int = 0, to_version: int | None = None
) -> list[Step]:
    """The migrations after ``from_version`` up to ``to_version`` (default: the latest).

    Raises:
        ConfigurationError: versions out of order or beyond this outboxer's latest.
    """
    latest = latest_version(dialect)
    target = latest if to_version is None else to_version
    if not 0 <= from_version <= target <= latest:
        raise ConfigurationError(
            f"cannot go from schema version {from_version} to {target}: the latest {dialect} "
            f"schema of this outboxer is {latest}"
        )
    if dialect == "sqlite" and names.schema is not None:
        raise ConfigurationError("SQLite has no schemas: leave the schema name unset")
    return pending(dialect, names, from_version, to_version)


def pending(dialect: str, names: TableNames, current: int, target: int | None = None) -> list[Step]:
    """The migrations a database at version ``current`` still needs to reach ``target``
    (default: the latest); none when it is there or past it (the stores' ``migrate``)."""
    return [
        Step(
            migration.version,
            [
                *_statements(migration.sql, dialect, names),
                record_version(dialect, names, migration.version),
            ],
        )
        for migration in _sql.pending_migrations(dialect, current, target)
    ]


def upgrade_statements(
    dialect: str, names: TableNames, from_version: int = 0, to_version: int | None = None
) -> list[str]:
    """The statements taking ``names``' schema from ``from_version`` (0: nothing installed) to
    ``to_version`` (default: the latest), each without its final semicolon: the
    :func:`prelude` on a fresh install, then every :func:`steps`' statements.

    ``dialect`` is a store dialect or any name :func:`dialect_of` knows.

    Raises:
        ConfigurationError: versions out of order or beyond this outboxer's latest.
    """
    dialect = dialect_of(dialect)
    migrations = steps(dialect, names, from_version, to_version)
    statements = prelude(dialect, names) if from_version == 0 else []
    for step in migrations:
        statements += step.statements
    return statements


def upgrade_script(
    dialect: str, names: TableNames, from_version: int = 0, to_version: int | None = None
) -> str:
    """:func:`upgrade_statements` as one script for the database's shell (``psql``,
    ``sqlite3``, ``mysql``): a transaction where DDL is transactional (PostgreSQL and SQLite:
    all or nothing), statement by statement on MySQL, which commits each DDL statement."""
    dialect = dialect_of(dialect)
    statements = upgrade_statements(dialect, names, from_version, to_version)
    latest = latest_version(dialect) if to_version is None else to_version
    head = (
        f"-- outboxer schema {from_version} -> {latest} ({dialect}, table "
        f"{names.qualified(quote=quote_of(dialect))}), as 'outboxer db upgrade' applies it."
    )
    if not statements:
        return f"{head}\n-- nothing to apply\n"
    body = "\n\n".join(f"{statement};" for statement in statements)
    if dialect == "mysql":
        return f"{head}\n\n{body}\n"
    return f"{head}\n\nBEGIN;\n\n{body}\n\nCOMMIT;\n"
