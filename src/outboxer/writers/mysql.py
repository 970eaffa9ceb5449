"""The MySQL/MariaDB writers: PyMySQL and mysqlclient (sync), asyncmy and aiomysql (async).

The four drivers speak the same DB-API dialect (``%s`` parameters interpolated by the client),
so one INSERT serves them all; this module imports none of them. ``insert_many`` sends one
multi-row ``INSERT`` per chunk (up to 1,000 rows or about 1 MB of values): the drivers' own
``executemany`` rewrites only an ``INSERT`` whose ``VALUES`` holds bare placeholders, and ours
has ``COALESCE(%s, UTC_TIMESTAMP(6))`` so that a message without ``available_at`` takes the
database's clock, as on every other database.

Times are sent as naive UTC datetimes (the columns are ``DATETIME(6)`` in UTC, see the store's
0001_initial.sql). aiomysql 0.3 with PyMySQL 1.2 cannot escape ``bytes`` parameters (a
``TypeError`` inside the driver), so through aiomysql the payload travels as hex and ``UNHEX``
restores it.

Each writes in the connection's transaction: the drivers open one implicitly at the first
statement unless the connection is in autocommit mode, where every statement commits on its own.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from functools import cache
from typing import Any, Literal

from outboxer.config import TableNames
from outboxer.message import Row
from outboxer.writers import insert_into

__all__ = ["AIOMYSQL", "ASYNC", "SYNC", "AsyncMysqlWriter", "MysqlWriter", "insert_sql", "params"]

#: A chunk of ``insert_many`` ends after this many rows or bytes of values, whichever is first
#: (the server refuses a statement larger than ``max_allowed_packet``, 16 MB by default).
_CHUNK_ROWS = 1000
_CHUNK_BYTES = 1 << 20


@cache
def insert_sql(names: TableNames, rows: int = 1, *, hex_payload: bool = False) -> str:
    """The INSERT of ``rows`` rows, in ``%s`` style."""
    payload = "UNHEX(%s)" if hex_payload else "%s"
    values = f"(%s, %s, %s, %s, {payload}, %s, %s, COALESCE(%s, UTC_TIMESTAMP(6)))"
    return insert_into(names, "VALUES " + ", ".join([values] * rows), quote="`")


def params(row: Row, *, hex_payload: bool = False) -> tuple[Any, ...]:
    """``row`` as the MySQL drivers send it: naive UTC times, the payload as hex if asked."""
    when = row.available_at
    if when is not None and when.tzinfo is not None:
        when = when.astimezone(dt.UTC).replace(tzinfo=None)
    payload: bytes | str = row.payload.hex() if hex_payload else row.payload
    return (row.id, row.topic, row.key, row.type, payload, row.content_type, row.headers, when)


def chunks(rows: Sequence[Row], *, hex_payload: bool = False) -> Iterator[tuple[int, list[Any]]]:
    """``(row count, flat parameters)`` of the multi-row INSERTs that write ``rows`` in order."""
    count, size, flat = 0, 0, list[Any]()
    for row in rows:
        flat.extend(params(row, hex_payload=hex_payload))
        count += 1
        size += len(row.payload) + len(row.headers) + 128
        if count == _CHUNK_ROWS or size >= _CHUNK_BYTES:
            yield count, flat
            count, size, flat = 0, 0, []
    if count:
        yield count, flat


def _connection(conn: Any) -> Any:
    """The connection of a cursor (the caller's cursor keeps its results), or ``conn``."""
    return conn.connection if hasattr(conn, "fetchone") else conn


class MysqlWriter:
    """A PyMySQL or mysqlclient (``MySQLdb``) connection or cursor, in its transaction."""

    is_async: Literal[False] = False

    def insert(self, conn: Any, names: TableNames, row: Row) -> None:
        with _connection(conn).cursor() as cursor:
            cursor.execute(insert_sql(names), params(row))

    def insert_many(self, conn: Any, names: TableNames, rows: Sequence[Row]) -> None:
        with _connection(conn).cursor() as cursor:
            for count, flat in chunks(rows):
                cursor.execute(insert_sql(names, count), flat)

    def joins_transaction(self, conn: Any) -> bool:
        # Outside autocommit mode the driver's connection is always in a transaction (MySQL
        # opens one at the first statement), which is SQLAlchemy's.
        return not _connection(conn).get_autocommit()


class AsyncMysqlWriter:
    """An asyncmy (or, with ``hex_payload``, aiomysql) connection or cursor, in its
    transaction."""

    is_async: Literal[True] = True

    def __init__(self, *, hex_payload: bool = False) -> None:
        self.hex_payload = hex_payload

    async def insert(self, conn: Any, names: TableNames, row: Row) -> None:
        async with _connection(conn).cursor() as cursor:
            await cursor.execute(
                insert_sql(names, hex_payload=self.hex_payload),
                params(row, hex_payload=self.hex_payload),
            )

    async def insert_many(self, conn: Any, names: TableNames, rows: Sequence[Row]) -> None:
        async with _connection(conn).cursor() as cursor:
            for count, flat in chunks(rows, hex_payload=self.hex_payload):
                await cursor.execute(insert_sql(names, count, hex_payload=self.hex_payload), flat)

    def joins_transaction(self, conn: Any) -> bool:
        return not _connection(conn).get_autocommit()


SYNC = MysqlWriter()
ASYNC = AsyncMysqlWriter()
AIOMYSQL = AsyncMysqlWriter(hex_payload=True)
