"""Schema management on PostgreSQL: the versioned migrations of ``sql/``, applied in order."""

from __future__ import annotations

from outboxer.stores import _sql, ddl
from outboxer.stores._common import check_schema_version
from outboxer.stores.postgres.connection import PostgresPart

__all__ = ["PostgresSchema"]


class PostgresSchema(PostgresPart):
    """The schema port (:class:`~outboxer.ports.SchemaStore`) on PostgreSQL."""

    async def migrate(self, target: int | None = None) -> list[int]:
        """Create or upgrade the schema; returns the versions applied (empty when current).

        ``target`` stops at that version (tests of the upgrade path). Runs in one transaction
        under an advisory lock, so concurrent upgrades are safe and a failed upgrade leaves
        nothing behind.
        """
        version_table = _sql.render("{schema_version}", self.names)
        applied: list[int] = []
        # No command timeout: an index built on a live table may legitimately take long.
        async with self.db.unbounded_transaction() as conn:
            # One lock per schema, not per table: two outboxes upgraded at once into the same new
            # schema would otherwise race on CREATE SCHEMA (a unique violation in pg_namespace).
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext($1))",
                f"outboxer.upgrade.{self.names.schema or 'public'}",
            )
            columns = {}
            for suffix in _sql.TABLES.values():
                found = await conn.fetchval(
                    "SELECT array_agg(attname::text) FROM pg_attribute "
                    "WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped",
                    self.names.qualified(suffix),
                )
                if found is not None:
                    columns[f"{self.names.table}{suffix}"] = found
            _sql.refuse_foreign_tables(self.names, columns.get)
            for statement in ddl.prelude("postgres", self.names):
                await conn.execute(statement)
            current = await conn.fetchval(f"SELECT max(version) FROM {version_table}") or 0
            for step in ddl.pending("postgres", self.names, current, target):
                for statement in step.statements:
                    await conn.execute(statement)
                applied.append(step.version)
        return applied

    async def schema_version(self) -> int:
        """The installed schema version, 0 when outboxer's tables do not exist."""
        version_table = _sql.render("{schema_version}", self.names)
        async with self.db.connection() as conn:
            if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", version_table):
                return 0
            value = await conn.fetchval(f"SELECT max(version) FROM {version_table}")
        return int(value or 0)

    async def check_schema(self) -> None:
        """Raise ``SchemaError`` unless the schema is exactly at this version of outboxer."""
        latest = ddl.latest_version("postgres")
        check_schema_version(await self.schema_version(), latest, self.names.qualified())
