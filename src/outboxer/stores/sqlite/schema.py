"""Schema management on SQLite: the versioned migrations of ``sql/``, applied in order."""

from __future__ import annotations

from outboxer.stores import _sql, ddl
from outboxer.stores._common import check_schema_version
from outboxer.stores.sqlite.connection import SqlitePart

__all__ = ["SqliteSchema"]


class SqliteSchema(SqlitePart):
    """The schema port (:class:`~outboxer.ports.SchemaStore`) on SQLite."""

    async def migrate(self, target: int | None = None) -> list[int]:
        """Create or upgrade the schema in one write transaction; returns the versions applied.

        ``target`` stops at that version (tests of the upgrade path).
        """
        table = _sql.render("{schema_version}", self.names)
        applied = []
        await self.db.open(create=True)  # the one operation that creates the database file
        async with self.db.transaction() as conn:
            columns = {}
            for suffix in _sql.TABLES.values():
                name = f"{self.names.table}{suffix}"
                async with conn.execute(f'PRAGMA table_info("{name}")') as cur:
                    found = [row[1] for row in await cur.fetchall()]
                if found:
                    columns[name] = found
            _sql.refuse_foreign_tables(self.names, columns.get)
            await conn.execute(ddl.version_table("sqlite", self.names))
            async with conn.execute(f"SELECT max(version) FROM {table}") as cur:
                row = await cur.fetchone()
            current = (row[0] if row else 0) or 0
            for step in ddl.pending("sqlite", self.names, current, target):
                for statement in step.statements:
                    await conn.execute(statement)
                applied.append(step.version)
        return applied

    async def schema_version(self) -> int:
        """The installed schema version, 0 when outboxer's tables do not exist."""
        table = f"{self.names.table}_schema_version"
        async with self.db.connection() as conn:
            async with conn.execute(
                # SQLite's names ignore (ASCII) case: "Outbox" is the table "outbox".
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE",
                (table,),
            ) as cur:
                if await cur.fetchone() is None:
                    return 0
            async with conn.execute(f'SELECT max(version) FROM "{table}"') as cur:
                row = await cur.fetchone()
        return int(row[0] or 0) if row else 0

    async def check_schema(self) -> None:
        """Raise ``SchemaError`` unless the schema is exactly at this version of outboxer."""
        latest = ddl.latest_version("sqlite")
        where = f"{self.names.table} in {self.db.path}"
        check_schema_version(await self.schema_version(), latest, where)
