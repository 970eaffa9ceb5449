"""The MySQL/MariaDB writers: PyMySQL and mysqlclient (sync), asyncmy and aiomysql (async).

The four drivers speak the same DB-API dialect (``%s`` parameters interpolated by the client),
and this module imports none of them. Rows are written by multi-row ``INSERT``s (one per chunk
of up to 1,000 rows or about 1 MB of SQL) whose values are SQL literals written here rather
than parameters for the driver to escape (``enqueue``'s one row is written the same way):

==================================  ===========================================================
column                              literal
==================================  ===========================================================
id, topic, key, type, content_type  ``X'…'``: the hexadecimal digits of the UTF-8 bytes
payload, headers                    ``X'…'`` of the bytes (the headers' JSON as UTF-8)
key, type when ``None``             ``NULL``
available_at                        ``'YYYY-MM-DD HH:MM:SS.ffffff'`` in UTC (naive), or
                                    ``DEFAULT``: the column's ``UTC_TIMESTAMP(6)``
                                    (0001_initial.sql), the database's clock as on
                                    every other database
==================================  ===========================================================

Why literals (10,000 messages of docs/benchmarks.md's "Bulk writes", CPU per row): the drivers'
escaping of eight parameters cost the client 3.7 µs in PyMySQL (pure Python), where
``bytes.hex()`` and f-strings take 1.1 µs; MariaDB parses a multi-row ``VALUES`` list row by
row, and took 8.8-9.3 µs per row with escaped strings and ``COALESCE(%s, UTC_TIMESTAMP(6))``
(the way to fall back to the database's clock in one statement shape), 6.9-7.2 µs with hex
literals and ``DEFAULT`` (about half of the gain each). A hexadecimal literal is a binary
string: its bytes reach the ``VARBINARY``/``LONGBLOB`` columns unchanged and the ``utf8mb4``
headers column as the UTF-8 they are, whatever the connection's character set or
``NO_BACKSLASH_ESCAPES``, and it holds no character that SQL or the drivers' ``%`` formatting
would read. It spares aiomysql, which cannot escape ``bytes`` parameters (aiomysql 0.3 with
PyMySQL 1.2 raises ``TypeError``), a path of its own. The price: a server's query log shows
hex digits, not text.

Hex doubles a payload's size, and a statement must fit the server's ``max_allowed_packet``
(16 MB by default on MariaDB, 64 MB on MySQL 8): a payload over :data:`_LITERAL_BYTES` travels
as a ``%s`` parameter instead (the driver escapes it to about its own size), except through
aiomysql, where ``UNHEX(%s)`` of its hex digits is the only way.

Each writes in the connection's transaction: the drivers open one implicitly at the first
statement unless the connection is in autocommit mode, where every statement commits on its own.

A batch longer than ``Outbox.STREAM_CHUNK`` is streamed (``insert_chunks``): the server runs
one chunk's ``INSERT`` while the client validates and writes the next (on the async drivers
the statement goes out before the event loop is left to the next chunk's work; on the sync
ones a worker thread waits for the server, the GIL released on the socket or in the C
client), inside a savepoint that a refused message or a failed statement rolls back.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import cache
from typing import Any, Literal

from outboxer.config import TableNames
from outboxer.message import Row
from outboxer.writers import RELEASE_SAVEPOINT, SET_SAVEPOINT, UNDO_SAVEPOINT, insert_into

__all__ = ["AIOMYSQL", "ASYNC", "SYNC", "AsyncMysqlWriter", "MysqlWriter", "params", "statements"]

#: A chunk of ``insert_many`` ends after this many rows or bytes of SQL, whichever is first (the
#: server refuses a statement larger than ``max_allowed_packet``). 100 and 10,000 rows per
#: statement cost the server the same per row as 1,000.
_CHUNK_ROWS = 1000
_CHUNK_BYTES = 1 << 20
#: A payload longer than this goes as a driver parameter rather than a hex literal twice its
#: size (see the module docstring).
_LITERAL_BYTES = 1 << 16


def params(row: Row, *, hex_payload: bool = False) -> tuple[Any, ...]:
    """``row`` as the MySQL drivers send it as parameters, for the writers that go through
    SQLAlchemy or Django: naive UTC times, the payload as hex if asked."""
    payload: bytes | str = row.payload.hex() if hex_payload else row.payload
    when = None if row.available_at is None else _naive_utc(row.available_at)
    return (row.id, row.topic, row.key, row.type, payload, row.content_type, row.headers, when)


def _naive_utc(when: dt.datetime) -> dt.datetime:
    """``when`` as a naive datetime in UTC (the columns' convention)."""
    return when.astimezone(dt.UTC).replace(tzinfo=None) if when.tzinfo is not None else when


class _Literals(dict[str | None, str]):
    """The SQL literal of a text value (``NULL`` for ``None``), each made once: a hit is one
    dict lookup, with no Python call."""

    def __missing__(self, value: str | None) -> str:
        literal = "NULL" if value is None else f"X'{value.encode().hex()}'"
        self[value] = literal
        return literal


@cache
def _head(names: TableNames) -> str:
    return insert_into(names, "VALUES ", quote="`")


def statements(
    names: TableNames, rows: Sequence[Row], *, escapes_bytes: bool = True
) -> Iterator[tuple[str, list[bytes | str] | None]]:
    """The multi-row INSERTs that write ``rows`` in order: ``(sql, parameters)``, the
    parameters ``None`` unless a large payload goes as one (``escapes_bytes``: the driver can
    escape a ``bytes`` parameter, which aiomysql cannot)."""
    # Topics, types, content types, headers and keys repeat within a batch: each written once.
    text = _Literals()
    values: list[str] = []
    large: list[bytes | str] = []
    size = 0
    for row in rows:
        if row.available_at is None:
            available_at = "DEFAULT"
        else:
            available_at = f"'{_naive_utc(row.available_at).isoformat(' ')}'"
        if len(row.payload) <= _LITERAL_BYTES:
            payload = f"X'{row.payload.hex()}'"
        elif escapes_bytes:
            payload = "%s"
            large.append(row.payload)
            size += 2 * len(row.payload)  # (escaped: at most twice its size)
        else:
            payload = "UNHEX(%s)"
            large.append(row.payload.hex())
            size += 2 * len(row.payload)
        value = (
            f"(X'{row.id.encode().hex()}', {text[row.topic]}, {text[row.key]}, "
            f"{text[row.type]}, {payload}, {text[row.content_type]}, {text[row.headers]}, "
            f"{available_at})"
        )
        values.append(value)
        size += len(value) + 2
        if len(values) == _CHUNK_ROWS or size >= _CHUNK_BYTES:
            yield _head(names) + ", ".join(values), large or None
            values, large, size = [], [], 0
    if values:
        yield _head(names) + ", ".join(values), large or None


def _chunked_statements(
    names: TableNames, chunks: Iterable[Sequence[Row]], *, escapes_bytes: bool = True
) -> Iterator[tuple[str, list[bytes | str] | None]]:
    """:func:`statements` of each chunk in turn, a chunk taken (validated) only when its first
    statement is asked for."""
    for chunk in chunks:
        yield from statements(names, chunk, escapes_bytes=escapes_bytes)


def _connection(conn: Any) -> Any:
    """The connection of a cursor (the caller's cursor keeps its results), or ``conn``."""
    return conn.connection if hasattr(conn, "fetchone") else conn


class MysqlWriter:
    """A PyMySQL or mysqlclient (``MySQLdb``) connection or cursor, in its transaction."""

    is_async: Literal[False] = False

    def insert(self, conn: Any, names: TableNames, row: Row) -> None:
        self.insert_many(conn, names, (row,))

    def insert_many(self, conn: Any, names: TableNames, rows: Sequence[Row]) -> None:
        with _connection(conn).cursor() as cursor:
            for sql, parameters in statements(names, rows):
                cursor.execute(sql, parameters)

    def insert_chunks(self, conn: Any, names: TableNames, chunks: Iterator[Sequence[Row]]) -> bool:
        connection = _connection(conn)
        if connection.get_autocommit():
            return False  # each statement commits on its own: no savepoint to undo a chunk
        sent: Future[Any] | None = None
        with connection.cursor() as cursor, ThreadPoolExecutor(1, "outboxer-mysql") as thread:
            cursor.execute(SET_SAVEPOINT)
            try:
                for sql, parameters in _chunked_statements(names, chunks):
                    # (this statement was written while the server ran the one before)
                    if sent is not None:
                        sent.result()
                    sent = thread.submit(cursor.execute, sql, parameters)
                if sent is not None:
                    sent.result()
            except BaseException:
                if sent is not None:
                    wait((sent,))  # one statement at a time on the connection
                with contextlib.suppress(Exception):  # a lost connection: the first error tells
                    for sql in UNDO_SAVEPOINT:
                        cursor.execute(sql)
                raise
            cursor.execute(RELEASE_SAVEPOINT)
        return True

    def joins_transaction(self, conn: Any) -> bool:
        # Outside autocommit mode the driver's connection is always in a transaction (MySQL
        # opens one at the first statement), which is SQLAlchemy's.
        return not _connection(conn).get_autocommit()


class AsyncMysqlWriter:
    """An asyncmy (or, without ``escapes_bytes``, aiomysql) connection or cursor, in its
    transaction."""

    is_async: Literal[True] = True

    def __init__(self, *, escapes_bytes: bool = True) -> None:
        self.escapes_bytes = escapes_bytes

    async def insert(self, conn: Any, names: TableNames, row: Row) -> None:
        await self.insert_many(conn, names, (row,))

    async def insert_many(self, conn: Any, names: TableNames, rows: Sequence[Row]) -> None:
        async with _connection(conn).cursor() as cursor:
            for sql, parameters in statements(names, rows, escapes_bytes=self.escapes_bytes):
                await cursor.execute(sql, parameters)

    async def insert_chunks(
        self, conn: Any, names: TableNames, chunks: Iterator[Sequence[Row]]
    ) -> bool:
        connection = _connection(conn)
        if connection.get_autocommit():
            return False  # as MysqlWriter's
        sent: asyncio.Task[Any] | None = None
        async with connection.cursor() as cursor:
            await cursor.execute(SET_SAVEPOINT)
            try:
                for sql, parameters in _chunked_statements(
                    names, chunks, escapes_bytes=self.escapes_bytes
                ):
                    if sent is not None:
                        await sent
                    sent = asyncio.create_task(cursor.execute(sql, parameters))
                    await asyncio.sleep(0)  # sent: the next is written while the server runs it
                if sent is not None:
                    await sent
            except BaseException:
                if sent is not None:
                    await asyncio.wait((sent,))
                with contextlib.suppress(Exception):
                    for sql in UNDO_SAVEPOINT:
                        await cursor.execute(sql)
                raise
            await cursor.execute(RELEASE_SAVEPOINT)
        return True

    def joins_transaction(self, conn: Any) -> bool:
        return not _connection(conn).get_autocommit()


SYNC = MysqlWriter()
ASYNC = AsyncMysqlWriter()
AIOMYSQL = AsyncMysqlWriter(escapes_bytes=False)
