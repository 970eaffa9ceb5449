"""The aiosqlite writer: sqlite3's statement, on aiosqlite's thread."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import aiosqlite

from outboxer.config import TableNames
from outboxer.message import Row
from outboxer.writers import RELEASE_SAVEPOINT, SET_SAVEPOINT, UNDO_SAVEPOINT
from outboxer.writers.sqlite3 import begins_or_in_transaction, insert_sql, params

__all__ = ["ASYNC", "AiosqliteWriter"]


def _connection(conn: Any) -> aiosqlite.Connection:
    """The aiosqlite connection of a cursor (which has no public accessor), or ``conn``: the
    statements run on a cursor of their own, so that the caller's cursor keeps the rows it was
    reading and its lastrowid (as sqlite3's writer)."""
    return conn._conn if isinstance(conn, aiosqlite.Cursor) else conn  # noqa: SLF001


class AiosqliteWriter:
    """``aiosqlite.Connection`` or ``Cursor``, in the connection's transaction (opened
    implicitly before an INSERT, as sqlite3 does)."""

    is_async: Literal[True] = True

    async def insert(self, conn: Any, names: TableNames, row: Row) -> None:
        await _connection(conn).execute(insert_sql(names), params(row))

    async def insert_many(self, conn: Any, names: TableNames, rows: Sequence[Row]) -> None:
        # One hop to aiosqlite's thread for the whole batch, in a savepoint as sqlite3's.
        connection = conn.connection if isinstance(conn, aiosqlite.Cursor) else conn
        conn = _connection(conn)
        began = not connection.in_transaction
        if not began:
            await conn.execute(SET_SAVEPOINT)
        try:
            await conn.executemany(insert_sql(names), [params(row) for row in rows])
        except BaseException:
            if not began:
                for sql in UNDO_SAVEPOINT:
                    await conn.execute(sql)
            elif connection.in_transaction:  # (a cursor's is the sqlite3 connection)
                await conn.execute("ROLLBACK")
            raise
        if not began:
            await conn.execute(RELEASE_SAVEPOINT)

    def joins_transaction(self, conn: Any) -> bool:
        connection = conn.connection if isinstance(conn, aiosqlite.Cursor) else conn
        return begins_or_in_transaction(connection)


ASYNC = AiosqliteWriter()
