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
from outboxer.writers import RELEASE_SAVEPOINT, SET_SAVEPOINT, UNDO_SAVEPOINT, insert_into

__all__ = ["SYNC", "Sqlite3Writer", "begins_or_in_transaction", "insert_sql", "params"]

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


def begins_or_in_transaction(connection: Any) -> bool:
    """Whether an INSERT on a sqlite3 (or aiosqlite) connection runs in a transaction: one is
    open, or the module's legacy transaction control (SQLAlchemy's, by default) begins one
    before the INSERT, the transaction a wrapper such as SQLAlchemy counts as open."""
    legacy = getattr(connection, "autocommit", -1) == -1  # (Python 3.12's LEGACY_…_CONTROL)
    return bool(connection.in_transaction) or (legacy and connection.isolation_level is not None)


def _connection(conn: sqlite3.Connection | sqlite3.Cursor) -> sqlite3.Connection:
    """The connection of a cursor, or ``conn``."""
    return conn.connection if isinstance(conn, sqlite3.Cursor) else conn


class Sqlite3Writer:
    """``sqlite3.Connection`` or ``Cursor``: in its transaction (the module opens one
    implicitly before an INSERT unless the connection is in autocommit mode)."""

    is_async: Literal[False] = False

    def insert(
        self, conn: sqlite3.Connection | sqlite3.Cursor, names: TableNames, row: Row
    ) -> None:
        # On the cursor's connection (a cursor of its own): the caller's cursor keeps the rows
        # it was reading and its lastrowid, as with psycopg and the MySQL drivers.
        _connection(conn).execute(insert_sql(names), params(row))

    def insert_many(
        self, conn: sqlite3.Connection | sqlite3.Cursor, names: TableNames, rows: Sequence[Row]
    ) -> None:
        # In process, no round trips: executemany is as fast as SQLite gets. But it runs the
        # INSERT once per row, and a row the database refuses (an id stored before) leaves the
        # rows before it: a savepoint undoes them (or, when the module began the transaction
        # for this statement, a rollback).
        conn = connection = _connection(conn)  # (as insert's)
        began = not connection.in_transaction
        if not began:
            conn.execute(SET_SAVEPOINT)
        try:
            conn.executemany(insert_sql(names), map(params, rows))
        except BaseException:
            if not began:
                for sql in UNDO_SAVEPOINT:
                    conn.execute(sql)
            elif connection.in_transaction:
                connection.rollback()  # a transaction of these rows alone
            raise
        if not began:
            conn.execute(RELEASE_SAVEPOINT)

    def joins_transaction(self, conn: sqlite3.Connection | sqlite3.Cursor) -> bool:
        connection = conn.connection if isinstance(conn, sqlite3.Cursor) else conn
        return begins_or_in_transaction(connection)


SYNC = Sqlite3Writer()
