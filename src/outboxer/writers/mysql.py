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
(16 MiB by default on MariaDB, 64 MiB on MySQL 8): a payload over :data:`LITERAL_BYTES` travels
as a ``%s`` parameter instead on PyMySQL and mysqlclient, and as ``UNHEX(%s)`` of its hex
digits on the async drivers: aiomysql cannot send ``bytes``, and asyncmy escapes them with
backslashes even in a session with ``NO_BACKSLASH_ESCAPES``, where a ``'`` in the payload would
end the string and the rest be read as SQL (a crafted payload wrote a forged row). Either way
it may cost the statement twice its size (PyMySQL 1.2 sends ``bytes`` as ``_binary X'…'``;
mysqlclient escapes ``\0 \n \r \\ ' " \x1a`` as two bytes, the way the session reads them).

A statement over ``max_allowed_packet`` makes the server drop the connection, and with it the
caller's transaction. A chunk therefore ends before it would pass :data:`_CHUNK_BYTES`, so
only a statement of one large row can be larger; for such a statement (and only then: one round
trip) the writer asks the server its ``max_allowed_packet`` and refuses the message with
ConfigurationError, before sending anything of the batch (``insert_many``) or inside the
streamed batch's savepoint, which is rolled back (``insert_chunks``): the caller's transaction
stays usable.

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
from typing import Any, Literal, NamedTuple

from outboxer.config import TableNames
from outboxer.errors import ConfigurationError
from outboxer.message import Row
from outboxer.writers import (
    RELEASE_SAVEPOINT,
    SET_SAVEPOINT,
    UNDO_SAVEPOINT,
    finish,
    insert_into,
)

__all__ = [
    "ASYNC",
    "LITERAL_BYTES",
    "PACKET_MARGIN",
    "SYNC",
    "AsyncMysqlWriter",
    "MysqlWriter",
    "Statement",
    "is_large",
    "params",
    "statements",
]

#: A chunk of ``insert_many`` ends before this many rows or bytes of SQL, whichever comes first
#: (the server refuses a statement larger than ``max_allowed_packet``, 4 MiB or more by default
#: since MySQL 5.6). 100 and 10,000 rows per statement cost the server the same per row as 1,000.
_CHUNK_ROWS = 1000
_CHUNK_BYTES = 1 << 20
#: A payload longer than this goes as a driver parameter rather than a hex literal twice its
#: size (see the module docstring).
LITERAL_BYTES = 1 << 16
#: What a driver adds to a parameter besides its (at most doubled) bytes: quotes and
#: ``_binary X``.
_PARAMETER_BYTES = 16
#: Room left under ``max_allowed_packet`` for what the protocol adds to the statement (the
#: command byte; the server refuses a statement one byte short of the limit: measured on
#: MariaDB 10.11).
PACKET_MARGIN = 1024
_MAX_ALLOWED_PACKET = "SELECT @@max_allowed_packet"


def is_large(row: Row) -> bool:
    """Whether ``row`` may make a statement too large for the server: the writers that send a
    row through an ORM's statement hand such a row to this module's, which checks it."""
    return len(row.payload) + len(row.headers) > LITERAL_BYTES


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


class Statement(NamedTuple):
    """One multi-row INSERT of :func:`statements`.

    Attributes:
        sql: The statement, ``%s`` where a large payload goes.
        parameters: The large payloads, ``None`` if none.
        size: At most how many bytes the driver sends (the SQL with the parameters escaped).
        first: The position in the batch of its first row.
        row: Its first row: the only one when ``size`` is over :data:`_CHUNK_BYTES`.
    """

    sql: str
    parameters: list[bytes | str] | None
    size: int
    first: int
    row: Row


def statements(
    names: TableNames, rows: Sequence[Row], *, escapes_bytes: bool = True, first: int = 0
) -> Iterator[Statement]:
    """The multi-row INSERTs that write ``rows`` in order (``escapes_bytes``: the driver can be
    trusted to escape a ``bytes`` parameter, which the async drivers cannot; ``first``: the
    position of ``rows[0]`` in the batch)."""
    # Topics, types, content types, headers and keys repeat within a batch: each written once.
    text = _Literals()
    head = _head(names)
    values: list[str] = []
    large: list[bytes | str] = []
    size = len(head)
    start = first  # the position of the chunk's first row
    for n, row in enumerate(rows, first):
        if row.available_at is None:
            available_at = "DEFAULT"
        else:
            available_at = f"'{_naive_utc(row.available_at).isoformat(' ')}'"
        parameter: bytes | str | None = None
        row_size = 2  # (", ")
        if len(row.payload) <= LITERAL_BYTES:
            payload = f"X'{row.payload.hex()}'"
        else:
            payload, parameter = (
                ("%s", row.payload) if escapes_bytes else ("UNHEX(%s)", row.payload.hex())
            )
            row_size += 2 * len(row.payload) + _PARAMETER_BYTES  # (escaped or hex: at most 2×)
        value = (
            f"(X'{row.id.encode().hex()}', {text[row.topic]}, {text[row.key]}, "
            f"{text[row.type]}, {payload}, {text[row.content_type]}, {text[row.headers]}, "
            f"{available_at})"
        )
        row_size += len(value)
        # End the chunk before this row would take it over the limit, so that a statement
        # over _CHUNK_BYTES holds one row: the one to name if the server cannot take it.
        if values and (len(values) == _CHUNK_ROWS or size + row_size > _CHUNK_BYTES):
            yield Statement(
                head + ", ".join(values), large or None, size, start, rows[start - first]
            )
            values, large, size, start = [], [], len(head), n
        values.append(value)
        if parameter is not None:
            large.append(parameter)
        size += row_size
    if values:
        yield Statement(head + ", ".join(values), large or None, size, start, rows[start - first])


def _chunked_statements(
    names: TableNames, chunks: Iterable[Sequence[Row]], *, escapes_bytes: bool = True
) -> Iterator[Statement]:
    """:func:`statements` of each chunk in turn, a chunk taken (validated) only when its first
    statement is asked for."""
    first = 0
    for chunk in chunks:
        yield from statements(names, chunk, escapes_bytes=escapes_bytes, first=first)
        first += len(chunk)


def _needs_limit(statement: Statement) -> bool:
    """Whether ``statement`` is large enough to be checked against the server's
    ``max_allowed_packet`` (which costs a round trip to read)."""
    return statement.size > _CHUNK_BYTES


def _check(statement: Statement, max_allowed_packet: int, *, numbered: bool) -> None:
    """Refuse ``statement`` if the server would drop the connection on it (and with it the
    caller's transaction). ``numbered``: part of a batch, whose messages are named by position.

    Raises:
        ConfigurationError: the statement (then of one row) is over ``max_allowed_packet``.
    """
    if statement.size + PACKET_MARGIN <= max_allowed_packet:
        return
    row = statement.row
    what = f"payload of {len(row.payload):,} bytes makes"
    if len(row.headers) > LITERAL_BYTES:
        what = f"payload of {len(row.payload):,} bytes and headers of {len(row.headers):,} make"
    raise ConfigurationError(
        f"{f'message {statement.first}: ' if numbered else ''}{what} a statement of up to "
        f"{statement.size:,} bytes, over the server's max_allowed_packet of "
        f"{max_allowed_packet:,}; raise max_allowed_packet or send large payloads by reference"
    )


def _connection(conn: Any) -> Any:
    """The connection of a cursor (the caller's cursor keeps its results), or ``conn``.

    Raises:
        ConfigurationError: an unbuffered cursor (``SSCursor``) on the connection has rows
            still to read: the next statement would throw them away without a word (PyMySQL,
            aiomysql and asyncmy drain them; mysqlclient refuses, "commands out of sync").
    """
    connection = conn.connection if hasattr(conn, "fetchone") else conn
    # (the drivers' own attribute, read where it is: an unknown driver passes; asyncmy's an int)
    if getattr(getattr(connection, "_result", None), "unbuffered_active", False):
        raise ConfigurationError(
            "the connection has an unbuffered query (SSCursor) whose rows are not all read: "
            "read them (or close that cursor) before writing to the outbox"
        )
    return connection


class MysqlWriter:
    """A PyMySQL or mysqlclient (``MySQLdb``) connection or cursor, in its transaction."""

    is_async: Literal[False] = False

    def insert(self, conn: Any, names: TableNames, row: Row) -> None:
        self._insert(conn, names, (row,), numbered=False)

    def insert_many(self, conn: Any, names: TableNames, rows: Sequence[Row]) -> None:
        self._insert(conn, names, rows, numbered=True)

    def _insert(self, conn: Any, names: TableNames, rows: Sequence[Row], *, numbered: bool) -> None:
        connection = _connection(conn)
        batch = list(statements(names, rows))
        if len(batch) > 1 and not connection.get_autocommit():
            self._stream(connection, iter(batch))  # all or none, as a streamed batch
            return
        large = [statement for statement in batch if _needs_limit(statement)]
        with connection.cursor() as cursor:
            if large:  # every statement checked before the first is sent: all or nothing
                cursor.execute(_MAX_ALLOWED_PACKET)
                (max_allowed_packet,) = cursor.fetchone()
                for statement in large:
                    _check(statement, max_allowed_packet, numbered=numbered)
            for statement in batch:
                cursor.execute(statement.sql, statement.parameters)

    def insert_chunks(self, conn: Any, names: TableNames, chunks: Iterator[Sequence[Row]]) -> bool:
        connection = _connection(conn)
        if connection.get_autocommit():
            return False  # each statement commits on its own: no savepoint to undo a chunk
        self._stream(connection, _chunked_statements(names, chunks))
        return True

    def _stream(self, connection: Any, batch: Iterator[Statement]) -> None:
        """Send ``batch`` inside a savepoint, each statement taken (its chunk validated and
        written) while the server runs the one before; a refused message or statement undoes
        the statements before it."""
        sent: Future[Any] | None = None
        max_allowed_packet: int | None = None  # asked once, at the first large statement
        with connection.cursor() as cursor, ThreadPoolExecutor(1, "outboxer-mysql") as thread:
            cursor.execute(SET_SAVEPOINT)
            try:
                for statement in batch:
                    # (this statement was written while the server ran the one before)
                    if sent is not None:
                        sent.result()
                    if _needs_limit(statement):
                        if max_allowed_packet is None:
                            cursor.execute(_MAX_ALLOWED_PACKET)
                            (max_allowed_packet,) = cursor.fetchone()
                        _check(statement, max_allowed_packet, numbered=True)
                    sent = thread.submit(cursor.execute, statement.sql, statement.parameters)
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

    def joins_transaction(self, conn: Any) -> bool:
        # Outside autocommit mode the driver's connection is always in a transaction (MySQL
        # opens one at the first statement), which is SQLAlchemy's.
        return not _connection(conn).get_autocommit()


class AsyncMysqlWriter:
    """An asyncmy or aiomysql connection or cursor, in its transaction (a large payload as
    hex digits: see the module docstring)."""

    is_async: Literal[True] = True

    async def insert(self, conn: Any, names: TableNames, row: Row) -> None:
        await self._insert(conn, names, (row,), numbered=False)

    async def insert_many(self, conn: Any, names: TableNames, rows: Sequence[Row]) -> None:
        await self._insert(conn, names, rows, numbered=True)

    async def _insert(
        self, conn: Any, names: TableNames, rows: Sequence[Row], *, numbered: bool
    ) -> None:
        connection = _connection(conn)
        batch = list(statements(names, rows, escapes_bytes=False))
        if len(batch) > 1 and not connection.get_autocommit():
            await self._stream(connection, iter(batch))  # as MysqlWriter's
            return
        large = [statement for statement in batch if _needs_limit(statement)]
        async with connection.cursor() as cursor:
            if large:  # as MysqlWriter's
                await cursor.execute(_MAX_ALLOWED_PACKET)
                (max_allowed_packet,) = await cursor.fetchone()
                for statement in large:
                    _check(statement, max_allowed_packet, numbered=numbered)
            for statement in batch:
                await cursor.execute(statement.sql, statement.parameters)

    async def insert_chunks(
        self, conn: Any, names: TableNames, chunks: Iterator[Sequence[Row]]
    ) -> bool:
        connection = _connection(conn)
        if connection.get_autocommit():
            return False  # as MysqlWriter's
        statements_ = _chunked_statements(names, chunks, escapes_bytes=False)
        await self._stream(connection, statements_)
        return True

    async def _stream(self, connection: Any, batch: Iterator[Statement]) -> None:
        """As :meth:`MysqlWriter._stream`: each statement sent as a task, the next one taken
        while the server runs it."""
        sent: asyncio.Task[Any] | None = None
        max_allowed_packet: int | None = None
        async with connection.cursor() as cursor:

            async def undo() -> None:
                if sent is not None:
                    await asyncio.wait((sent,))  # one statement at a time on the connection
                with contextlib.suppress(Exception):  # a lost connection: the first error tells
                    for sql in UNDO_SAVEPOINT:
                        await cursor.execute(sql)

            await cursor.execute(SET_SAVEPOINT)
            try:
                for statement in batch:
                    if sent is not None:
                        # shielded: a cancelled caller must not cut a statement in half (the
                        # drivers close the connection then); undo() waits for it
                        await asyncio.shield(sent)
                    if _needs_limit(statement):
                        if max_allowed_packet is None:
                            await cursor.execute(_MAX_ALLOWED_PACKET)
                            (max_allowed_packet,) = await cursor.fetchone()
                        _check(statement, max_allowed_packet, numbered=True)
                    sent = asyncio.create_task(cursor.execute(statement.sql, statement.parameters))
                    await asyncio.sleep(0)  # sent: the next is written while the server runs it
                if sent is not None:
                    await asyncio.shield(sent)
            except BaseException:
                await finish(undo())  # to its end, even if the caller is cancelled meanwhile
                raise
            await cursor.execute(RELEASE_SAVEPOINT)

    def joins_transaction(self, conn: Any) -> bool:
        return not _connection(conn).get_autocommit()


SYNC = MysqlWriter()
ASYNC = AsyncMysqlWriter()
