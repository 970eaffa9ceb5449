"""The migration operation that applies outboxer's schema on a Django database.

Each migration of this app pins the outboxer schema version it reaches (``0001`` reaches 4); a
release of outboxer with schema 5 adds a migration ``UpgradeOutbox(5)``. The operation reads the
version installed (a database that ``outboxer db upgrade`` already set up is left as it is) and
runs the statements of :mod:`outboxer.stores.ddl` for the database's vendor, the ones ``db
upgrade`` runs, in the migration's transaction where the database has transactional DDL.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, migrations, transaction

from outboxer.integrations.django.conf import outbox_on
from outboxer.stores import _sql, ddl

__all__ = ["UpgradeOutbox", "installed_version"]

#: The schema version the app's first migration (0001) installs; each later one adds one.
_FIRST = 4


def installed_version(connection: Any, dialect: str, names: Any) -> int:
    """The outboxer schema version on ``connection``, 0 when there is none."""
    table = ddl.version_table_name(dialect, names)
    try:
        # a savepoint: on PostgreSQL a failed statement would abort the migration's transaction
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute(f"SELECT max(version) FROM {table}")
            row = cursor.fetchone()
    except DatabaseError:
        return 0
    return int(row[0] or 0) if row else 0


def _columns(connection: Any, schema: str | None, table: str, quote: str) -> list[str] | None:
    """The column names of ``table``, ``None`` when there is no such table."""
    name = f"{quote}{table}{quote}"
    qualified = f"{quote}{schema}{quote}.{name}" if schema else name
    try:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute(f"SELECT * FROM {qualified} WHERE 1 = 0")
            return [str(column[0]) for column in cursor.description]
    except DatabaseError:
        return None


class UpgradeOutbox(migrations.RunPython):
    """Bring the outbox schema to ``version`` (nothing when it is there already).

    Unapplying leaves the tables (and the messages in them): drop them by hand if wanted.
    """

    def __init__(self, version: int) -> None:
        self.version = version
        # atomic=False: where DDL is transactional (PostgreSQL, SQLite) the whole migration is
        # one transaction anyway; on MySQL, which commits each DDL statement, Django refuses
        # DDL inside atomic(), and every migration of outboxer is safe to run again instead.
        super().__init__(self._forwards, migrations.RunPython.noop, atomic=False)

    #: ``sqlmigrate`` prints the statements (those taking the schema from the version of the
    #: migration before, without looking at the database) instead of "CANNOT BE WRITTEN AS SQL"
    reduces_to_sql = True

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (f"{__name__}.{type(self).__qualname__}", [self.version], {})

    def describe(self) -> str:
        return f"Upgrade the outbox schema to outboxer's version {self.version}"

    def _forwards(self, apps: Any, schema_editor: Any) -> None:
        connection = schema_editor.connection
        dialect = ddl.dialect_of(connection.vendor)
        names = outbox_on(connection.alias).names
        if schema_editor.collect_sql:  # sqlmigrate: what this migration runs after the one before
            current = 0 if self.version == _FIRST else self.version - 1
        else:
            current = installed_version(connection, dialect, names)
        if current >= self.version:
            return
        if not schema_editor.collect_sql:
            quote = ddl.quote_of(dialect)
            _sql.refuse_foreign_tables(
                names, lambda table: _columns(connection, names.schema, table, quote), quote
            )
        for statement in ddl.upgrade_statements(dialect, names, current, self.version):
            schema_editor.execute(statement, params=None)
