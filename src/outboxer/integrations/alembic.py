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

from typing import Any

from alembic import op as alembic_op
from sqlalchemy import text

from outboxer.config import TableNames
from outboxer.stores import ddl

__all__ = ["op_upgrade"]


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

    Raises:
        ConfigurationError: versions out of order, beyond this outboxer's latest, or a dialect
            outboxer has no schema for.
    """
    op = op if op is not None else alembic_op
    dialect = op.get_context().dialect.name
    names = TableNames(table=table, schema=schema)
    for statement in ddl.upgrade_statements(dialect, names, from_version, to_version):
        # text() would take ":word" for a bind parameter (and "::jsonb" is next to one): every
        # colon escaped is sent as written
        op.execute(text(statement.replace(":", "\\:")))
