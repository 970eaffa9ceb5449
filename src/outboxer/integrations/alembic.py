"""The outbox schema inside a project's Alembic migrations.

For teams whose schema changes all go through Alembic: one migration of the project creates the
outbox tables, each later outboxer schema version is one more migration, and the statements are
the ones ``outboxer db upgrade`` runs (:mod:`outboxer.stores.ddl`), so the relay finds the
schema current::

    # migrations/versions/3f2a_outbox.py
    from outboxer.integrations.alembic import op_upgrade

    def upgrade() -> None:
        op_upgrade(to_version=4)               # a fresh install of outboxer's schema 4

    # ... and when an outboxer release brings schema 5:
    def upgrade() -> None:
        op_upgrade(from_version=4, to_version=5)

Pin ``to_version`` (``outboxer db sql`` prints the latest): a migration must keep meaning the
same after outboxer is upgraded. The dialect is the migration context's, so offline mode
(``alembic upgrade head --sql``) prints the same DDL for review.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from alembic import op as alembic_op
from sqlalchemy import inspect, text

from outboxer.config import TableNames
from outboxer.errors import ConfigurationError
from outboxer.stores import _sql, ddl
from outboxer.stores._sql import TABLES

__all__ = ["include_name", "op_upgrade"]

log = logging.getLogger("outboxer.alembic")


def op_upgrade(
    op: Any = None,
    *,
    from_version: int = 0,
    to_version: int | None = None,
    table: str = "outbox",
    schema: str | None = None,
) -> None:
    """Emit the DDL taking the outbox schema from ``from_version`` to ``to_version``.

    Args:
        op: Alembic's ``op`` (default: ``alembic.op``, the running migration's).
        from_version: The outboxer schema version the previous migrations installed (0: none).
        to_version: The version to reach (default: the latest this outboxer knows; pin it).
        table: Outbox table name, as given to the relay (``--table``).
        schema: Schema of the outbox tables (PostgreSQL; a database on MySQL), as ``--schema``.

    Online, the database's own record decides where to start: a schema at ``to_version``
    already (``outboxer db upgrade`` ran before the migration was written) is left as it is,
    one between the two is taken the rest of the way.

    Raises:
        ConfigurationError: versions out of order, beyond this outboxer's latest, a dialect
            outboxer has no schema for, or (online) a schema below ``from_version``.
    """
    op = op if op is not None else alembic_op
    context = op.get_context()
    dialect = context.dialect.name
    names = TableNames(table=table, schema=schema)
    if not context.as_sql:  # online: the database says where its outbox schema stands
        _refuse_foreign_tables(op.get_bind(), names)
        installed = _installed(op.get_bind(), names)
        target = ddl.latest_version(ddl.dialect_of(dialect)) if to_version is None else to_version
        if installed < from_version:
            raise ConfigurationError(
                f"the outbox schema here is at version {installed}, not {from_version}: run "
                f"the migration that installs version {from_version} first"
            )
        if installed >= target:
            # 'outboxer db upgrade' (or an earlier migration) got there first: nothing to do.
            # Running the DDL again failed with each database's own "already exists" error.
            log.info("outbox schema already at version %d: nothing to do", installed)
            return
        from_version = installed  # (above it: 'outboxer db upgrade' ran some steps)
    for statement in ddl.upgrade_statements(dialect, names, from_version, to_version):
        # text() would take ":word" for a bind parameter (and "::jsonb" is next to one): every
        # colon escaped is sent as written
        op.execute(text(statement.replace(":", "\\:")))


def _refuse_foreign_tables(bind: Any, names: TableNames) -> None:
    """A table of the outbox's names that outboxer did not make for it (the application's, or
    another outbox's: the outbox ``outbox_inbox`` beside ``outbox``) is refused before any DDL:
    MySQL's ``CREATE TABLE IF NOT EXISTS`` would take it for the outbox's own."""
    inspector = inspect(bind)

    def columns(table: str) -> list[str] | None:
        if not inspector.has_table(table, schema=names.schema):
            return None
        return [column["name"] for column in inspector.get_columns(table, schema=names.schema)]

    _sql.refuse_foreign_tables(names, columns)


def _installed(bind: Any, names: TableNames) -> int:
    """The newest outboxer schema version recorded on ``bind``'s database (0: none)."""
    table = names.table + "_schema_version"
    if not inspect(bind).has_table(table, schema=names.schema):
        return 0
    quoted = bind.dialect.identifier_preparer.quote
    qualified = quoted(table) if names.schema is None else f"{quoted(names.schema)}.{quoted(table)}"
    version = bind.execute(text(f"SELECT max(version) FROM {qualified}")).scalar()
    return int(version or 0)


def include_name(
    table: str = "outbox",
    schema: str | None = None,
    *,
    then: Callable[[str | None, str, Mapping[str, Any]], bool] | None = None,
) -> Callable[[str | None, str, Mapping[str, Any]], bool]:
    """An ``include_name`` hook for ``context.configure`` in ``env.py``: autogenerate leaves
    the outbox's tables alone (they are in no project's ``MetaData``, so without it every
    ``alembic revision --autogenerate`` proposes to drop them, messages included)::

        context.configure(..., target_metadata=metadata, include_name=include_name())

    ``then``: the project's own ``include_name``, asked about every other name."""
    names = TableNames(table=table, schema=schema)  # validated as op_upgrade's
    ours = {f"{names.table}{suffix}" for suffix in TABLES.values()}

    def include(name: str | None, type_: str, parent_names: Mapping[str, Any]) -> bool:
        if type_ == "table" and name in ours and parent_names.get("schema_name") == schema:
            return False
        return then(name, type_, parent_names) if then is not None else True

    return include
