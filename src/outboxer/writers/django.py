"""The Django writer: ``django.db.connection`` and ``connections[alias]``, on PostgreSQL, SQLite,
MySQL or MariaDB.

One row goes through Django's cursor (``connection.cursor()``): it runs in the transaction
Django has open (``transaction.atomic()`` on that alias), through Django's execute wrappers and
query logging like any statement of the application, and opens the connection if needed; except
a large row on MySQL/MariaDB (:func:`outboxer.writers.mysql.is_large`), which goes to the
driver's writer as many rows do: it checks the statement against the server's
``max_allowed_packet``, over which the server would drop the connection and the transaction
with it.

Many rows go to the writer of the driver underneath (psycopg 3: COPY; mysqlclient: multi-row
INSERTs; sqlite3: ``executemany``), handed Django's own driver connection: Django manages the
transaction on that connection (autocommit off inside ``atomic()``, or its explicit ``BEGIN``
on SQLite), so the rows join it; a long batch inside ``atomic()`` is streamed as there
(``insert_chunks``). A driver outboxer has no writer for (psycopg2) gets Django's
``executemany``. Whichever way rows go, a statement the database refuses raises Django's
exception (``django.db.IntegrityError`` ...) with the driver's as its cause, as Django's cursor
does.

Django's connections are synchronous: in an async view, run the whole transaction (ORM writes
and ``enqueue``) in one function wrapped by ``asgiref.sync.sync_to_async``; see
docs/configuration.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cache
from typing import Any, Literal

from django.db.backends.base.base import BaseDatabaseWrapper

from outboxer.config import TableNames
from outboxer.errors import ConfigurationError
from outboxer.message import Row
from outboxer.writers import find_writer, insert_into, stream_to_driver
from outboxer.writers.mysql import is_large
from outboxer.writers.mysql import params as mysql_params
from outboxer.writers.sqlite3 import params as sqlite_params

__all__ = ["SYNC", "DjangoWriter"]

# Django's cursors take %s on every backend (SQLite's turns them into ?).
_VALUES = {
    "postgresql": "VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, COALESCE(%s::timestamptz, now()))",
    "sqlite": "VALUES (%s, %s, %s, %s, %s, %s, %s, "
    "COALESCE(%s, (julianday('now') - 2440587.5) * 86400.0))",
    "mysql": "VALUES (%s, %s, %s, %s, %s, %s, %s, COALESCE(%s, UTC_TIMESTAMP(6)))",
}


@cache
def _insert(names: TableNames, vendor: str) -> str:
    try:
        values = _VALUES[vendor]
    except KeyError:
        raise ConfigurationError(f"outboxer cannot write to Django's {vendor!r} backend") from None
    return insert_into(names, values, "`" if vendor == "mysql" else '"')


def _params(row: Row, vendor: str) -> tuple[Any, ...]:
    if vendor == "sqlite":
        return sqlite_params(row)
    if vendor == "mysql":
        return mysql_params(row)
    return row


class DjangoWriter:
    """A Django ``DatabaseWrapper`` (``connections[alias]``), in its current transaction."""

    is_async: Literal[False] = False

    def insert(self, conn: BaseDatabaseWrapper, names: TableNames, row: Row) -> None:
        if conn.vendor == "mysql" and is_large(row):
            conn.ensure_connection()
            found = find_writer(conn.connection)
            if found is not None and found[0].is_async is False:
                with conn.wrap_database_errors:  # (see insert_many)
                    found[0].insert(found[1], names, row)
                return
        with conn.cursor() as cursor:
            cursor.execute(_insert(names, conn.vendor), _params(row, conn.vendor))

    def insert_many(
        self, conn: BaseDatabaseWrapper, names: TableNames, rows: Sequence[Row]
    ) -> None:
        conn.ensure_connection()
        found = find_writer(conn.connection)
        if found is not None and found[0].is_async is False:
            # the driver's exceptions as Django's, as its cursor raises them: the application
            # catches django.db.IntegrityError, not psycopg's or MySQLdb's
            with conn.wrap_database_errors:
                found[0].insert_many(found[1], names, rows)
            return
        with conn.cursor() as cursor:
            cursor.executemany(
                _insert(names, conn.vendor), [_params(row, conn.vendor) for row in rows]
            )

    def insert_chunks(
        self, conn: BaseDatabaseWrapper, names: TableNames, chunks: Iterator[Sequence[Row]]
    ) -> bool:
        conn.ensure_connection()
        with conn.wrap_database_errors:  # (see insert_many)
            return stream_to_driver(conn.connection, names, chunks)

    def joins_transaction(self, conn: BaseDatabaseWrapper) -> bool:
        # Every statement on a Django connection runs in the transaction Django has open there.
        return True


SYNC = DjangoWriter()
