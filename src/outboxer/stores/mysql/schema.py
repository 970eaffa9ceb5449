"""Schema management of the MySQL store: ``db upgrade``, the installed version, the check.

MySQL commits every DDL statement on its own, so an upgrade cannot be one transaction as on
PostgreSQL. Instead upgrades are serialized by a named lock, every migration is safe to run again
after a failure half-way (see 0001_initial.sql; a DDL statement that meets what it would create,
or misses what it would drop, was applied by the interrupted run and is skipped), and a version
is recorded only after all of its statements succeeded.
"""

from __future__ import annotations

import logging

from asyncmy import errors as mysql_errors

from outboxer.errors import SchemaError
from outboxer.stores import _sql, ddl
from outboxer.stores._common import check_schema_version
from outboxer.stores.mysql.connection import (
    Conn,
    MysqlPart,
    error_code,
    execute,
    fetch_value,
    release_lock,
)

__all__ = ["MysqlSchema"]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


#: How long ``migrate`` waits for a concurrent upgrade to finish.
_UPGRADE_LOCK_SECONDS = 300

#: Errors of a DDL statement that an earlier, interrupted upgrade already applied: the table,
#: column or key is there (1050, 1060, 1061), or the key to drop is gone (1091). MySQL commits
#: each DDL statement on its own, and one statement is all or nothing, so an upgrade killed
#: after a statement and before its version was recorded meets exactly these when run again.
_ALREADY_APPLIED = {1050, 1060, 1061, 1091}

log = logging.getLogger("outboxer.schema")


class MysqlSchema(MysqlPart):
    """Schema management (:class:`~outboxer.ports.SchemaStore`) on MySQL."""

    def _render(self, sql: str) -> str:
        return _sql.render(sql, self.names, quote="`")

    async def migrate(self, target: int | None = None) -> list[int]:
        """Create or upgrade the schema; returns the versions applied (empty when current).

        ``target`` stops at that version (tests of the upgrade path).
        """
        # One lock per database, not per table: two outboxes upgraded at once into the same new
        # database would otherwise race on CREATE DATABASE.
        lock = self.db.lock_name("upgrade", per_table=False)
        # No command timeout: an index built on a live table may legitimately take long.
        async with self.db.unbounded_connection() as conn:
            if not await fetch_value(
                conn,
                "SELECT GET_LOCK(%(lock)s, %(wait)s)",
                {"lock": lock, "wait": _UPGRADE_LOCK_SECONDS},
            ):
                raise SchemaError("another 'outboxer db upgrade' is still running")
            try:
                return await self._upgrade(conn, target)
            finally:
                await release_lock(conn, lock)

    async def _upgrade(self, conn: Conn, target: int | None) -> list[int]:
        schema = self.names.schema
        version_table = self._render("{schema_version}")
        # Only what is missing is created: an "IF NOT EXISTS" that finds the object leaves a
        # server warning, which the driver fetches and logs.
        if schema and not await fetch_value(
            conn,
            "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %(s)s",
            {"s": schema},
        ):
            await execute(conn, f"CREATE DATABASE `{schema}`")
        await self._refuse_foreign_tables(conn)  # before any DDL (a later version adds tables)
        if not await self._version_table_exists(conn):
            await execute(conn, ddl.version_table("mysql", self.names))
        current = await fetch_value(conn, f"SELECT MAX(version) FROM {version_table}") or 0
        applied: list[int] = []
        for step in ddl.pending("mysql", self.names, current, target):
            for statement in step.statements:
                try:
                    await execute(conn, statement)
                except mysql_errors.MySQLError as exc:
                    if error_code(exc) not in _ALREADY_APPLIED:
                        raise
                    log.info("schema version %d: already applied (%s)", step.version, exc)
            applied.append(step.version)
        return applied

    async def _refuse_foreign_tables(self, conn: Conn) -> None:
        """Before any DDL: a table of outboxer's names that outboxer did not create for this
        outbox (an application's own ``outbox``, or another outbox's table: the outbox
        ``outbox_inbox`` is where ``outbox``'s inbox would be) is refused. Its ``CREATE TABLE
        IF NOT EXISTS`` would let it pass: versions would be recorded around it, and the
        outbox would read and write the other's table, or a later version fail on its missing
        columns, for good. A table an interrupted install created has the column checked here
        (one each table has had since it was created) and is completed."""
        found: dict[str, list[str]] = {}
        for table in _sql.TABLES.values():
            name = f"{self.names.table}{table}"
            columns = await fetch_value(
                conn,
                "SELECT GROUP_CONCAT(COLUMN_NAME) FROM information_schema.COLUMNS "
                "WHERE TABLE_SCHEMA = COALESCE(%(schema)s, DATABASE()) AND TABLE_NAME = %(t)s",
                {"schema": self.names.schema, "t": name},
            )
            if columns is not None:
                found[name] = _text(columns).split(",")
        _sql.refuse_foreign_tables(self.names, found.get, quote="`")

    async def _version_table_exists(self, conn: Conn) -> bool:
        names = self.names
        return bool(
            await fetch_value(
                conn,
                "SELECT COUNT(*) FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = COALESCE(%(schema)s, DATABASE()) AND TABLE_NAME = %(t)s",
                {"schema": names.schema, "t": f"{names.table}_schema_version"},
            )
        )

    async def schema_version(self) -> int:
        """The installed schema version, 0 when outboxer's tables do not exist."""

        async with self.db.connection() as conn:
            if not await self._version_table_exists(conn):
                return 0
            query = self._render("SELECT MAX(version) FROM {schema_version}")
            return int(await fetch_value(conn, query) or 0)

    async def check_schema(self) -> None:
        """Raise ``SchemaError`` unless the schema is exactly at this version of outboxer."""
        latest = ddl.latest_version("mysql")
        check_schema_version(await self.schema_version(), latest, self.names.qualified(quote="`"))
