"""The aiosqlite writer: sqlite3's statement, on aiosqlite's thread."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import aiosqlite

from outboxer.config import TableNames
from outboxer.message import Row
from outboxer.writers.sqlite3 import insert_sql, params

__all__ = ["ASYNC", "AiosqliteWriter"]


class AiosqliteWriter:
    """``aiosqlite.Connection`` or ``Cursor``, in the connection's transaction (opened
    implicitly before an INSERT, as sqlite3 does)."""

    is_async: Literal[True] = True

    async def insert(self, conn: Any, names: TableNames, row: Row) -> None:
        await conn.execute(insert_sql(names), params(row))

    async def insert_many(self, conn: Any, names: TableNames, rows: Sequence[Row]) -> None:
        # One hop to aiosqlite's thread for the whole batch.
        await conn.executemany(insert_sql(names), [params(row) for row in rows])

    def joins_transaction(self, conn: Any) -> bool:
        connection = conn.connection if isinstance(conn, aiosqlite.Cursor) else conn
        return bool(connection.in_transaction)


ASYNC = AiosqliteWriter()
