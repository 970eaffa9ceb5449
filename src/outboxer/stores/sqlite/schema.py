"""Schema management on SQLite: the versioned migrations of ``sql/``, applied in order."""

from __future__ import annotations

from outboxer.stores import _sql
from outboxer.stores._common import check_schema_version
from outboxer.stores.sqlite.connection import NOW, SqlitePart

__all__ = ["SqliteSchema"]


class SqliteSchema(SqlitePart):
    """The schema port (:class:`~outboxer.ports.SchemaStore`) on SQLite."""

    async def migrate(self, target: int | None = None) -> list[int]:
        """Create or upgrade the schema in one write transaction; returns the versions applied.

        ``target`` stops at that version (tests of the upgrade path).
        """
        table = _sql.render("{schema_version}", self.names)
        applied = []
        async with self.db.transaction() as conn:
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {table} (version INTEGER PRIMARY KEY, "
                f"applied_at REAL NOT NULL DEFAULT ({NOW}))"
            )
            async with conn.execute(f"SELECT max(version) FROM {table}") as cur:
                row = await cur.fetchone()
            current = (row[0] if row else 0) or 0
            for migration in _sql.pending_migrations("sqlite", current, target):
                for statement in _sql.split_statements(migration.sql):
                    await conn.execute(_sql.render(statement, self.names))
                await conn.execute(
                    f"INSERT INTO {table} (version) VALUES (?)", (migration.version,)
                )
                applied.append(migration.version)
        return applied

    async def schema_version(self) -> int:
        """The installed schema version, 0 when outboxer's tables do not exist."""
        table = f"{self.names.table}_schema_version"
        async with self.db.connection() as conn:
            async with conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
            ) as cur:
                if await cur.fetchone() is None:
                    return 0
            async with conn.execute(f'SELECT max(version) FROM "{table}"') as cur:
                row = await cur.fetchone()
        return int(row[0] or 0) if row else 0

    async def check_schema(self) -> None:
        """Raise ``SchemaError`` unless the schema is exactly at this version of outboxer."""
        latest = _sql.migrations("sqlite")[-1].version
        where = f"{self.names.table} in {self.db.path}"
        check_schema_version(await self.schema_version(), latest, where)
