"""The sqlite3 writer (standard library), and the SQLite dialect its async twin reuses.

SQLite stores times as Unix seconds (REAL), so ``available_at`` is sent as a float and, when
``None``, the database's own clock fills it in, as for the other columns with defaults.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from functools import cache
from typing import Any, Literal

from outboxer.config import TableNames
from outboxer.message import Row
from outboxer.writers import insert_into

__all__ = ["SYNC", "Sqlite3Writer", "insert_sql", "params"]

_NOW = "(julianday('now') - 2440587.5) * 86400.0"


@cache
def insert_sql(names: TableNames) -> str:
    """The INSERT of one row, in qmark style (``executemany`` repeats it)."""
    return insert_into(names, f"VALUES (?, ?, ?, ?, ?, ?, ?, COALESCE(?, {_NOW}))")


def params(row: Row) -> tuple[Any, ...]:
    """``row`` as SQLite stores it: times as Unix seconds."""
    if row.available_at is None:
        return row
    return (*row[:7], row.available_at.timestamp())


class Sqlite3Writer:
    """``sqlite3.Connection`` or ``Cursor``: in its transaction (the module opens one
    implicitly before an INSERT unless the connection is in autocommit mode)."""

    is_async: Literal[False] = False

    def insert(
        self, conn: sqlite3.Connection | sqlite3.Cursor, names: TableNames, row: Row
    ) -> None:
        conn.execute(insert_sql(names), params(row))

    def insert_many(
        self, conn: sqlite3.Connection | sqlite3.Cursor, names: TableNames, rows: Sequence[Row]
    ) -> None:
        # In process, no round trips: executemany is as fast as SQLite gets.
        conn.executemany(insert_sql(names), map(params, rows))

    def joins_transaction(self, conn: sqlite3.Connection | sqlite3.Cursor) -> bool:
        connection = conn.connection if isinstance(conn, sqlite3.Cursor) else conn
        return connection.in_transaction


SYNC = Sqlite3Writer()
