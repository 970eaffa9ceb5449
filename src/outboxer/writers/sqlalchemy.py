"""The SQLAlchemy writer: sync ``Session``/``Connection`` and async twins, on PostgreSQL, SQLite,
MySQL or MariaDB.

One row goes through SQLAlchemy (``execute`` of a ``text()`` INSERT), so it joins the session's
transaction like any statement of the application, visible to its event listeners and logging;
except on MySQL/MariaDB, where every row goes to the driver's writer, in the transaction or in
autocommit mode alike (see :func:`_on_mysql`: hex literals rather than asyncmy's escaping, and
a statement over ``max_allowed_packet`` refused before it is sent).

Many rows go to the writer of the driver underneath (psycopg or asyncpg: COPY; the MySQL
drivers: multi-row INSERTs) when that driver's connection is already inside SQLAlchemy's
transaction: SQLAlchemy's own ``executemany`` is 3-4× slower. SQLAlchemy's asyncpg adapter
opens its transaction only at its first statement: before that, a large batch sends a
``SELECT 1`` through SQLAlchemy first, a small one (and the rows for drivers outboxer has no
writer for) goes through SQLAlchemy's ``executemany``.

Whichever way rows go, a statement the database refuses raises SQLAlchemy's exception
(``sqlalchemy.exc.IntegrityError`` ...) with the driver's as its ``orig``, as SQLAlchemy's own
``execute`` does, and a connection found dead is invalidated as SQLAlchemy invalidates it (the
session's ``rollback()`` then works): see :func:`_sqlalchemy_errors`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from functools import cache
from typing import Any, Literal

from sqlalchemy import Connection, TextClause, text
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from outboxer.config import TableNames
from outboxer.errors import ConfigurationError
from outboxer.message import Row
from outboxer.writers import (
    AsyncStreamingWriter,
    SyncWriter,
    Writer,
    find_writer,
    insert_into,
    stream_to_driver,
)
from outboxer.writers.mysql import AsyncMysqlWriter, MysqlWriter
from outboxer.writers.mysql import params as mysql_params
from outboxer.writers.sqlite3 import params as sqlite_params

__all__ = ["ASYNC", "SYNC", "AsyncSqlalchemyWriter", "SqlalchemyWriter"]

_VALUES = {
    # CAST rather than ::, which text() would take for a bind parameter
    "postgresql": "VALUES (:id, :topic, :key, :type, :payload, :content_type, "
    "CAST(:headers AS jsonb), COALESCE(CAST(:available_at AS timestamptz), now()))",
    "sqlite": "VALUES (:id, :topic, :key, :type, :payload, :content_type, :headers, "
    "COALESCE(:available_at, (julianday('now') - 2440587.5) * 86400.0))",
    "mysql": "VALUES (:id, :topic, :key, :type, :payload, :content_type, :headers, "
    "COALESCE(:available_at, UTC_TIMESTAMP(6)))",
    # aiomysql cannot send bytes (see outboxer.writers.mysql): the payload goes as hex
    "mysql+aiomysql": "VALUES (:id, :topic, :key, :type, UNHEX(:payload), :content_type, "
    ":headers, COALESCE(:available_at, UTC_TIMESTAMP(6)))",
}
#: From this many rows, a transaction not yet begun on the database (SQLAlchemy's asyncpg
#: adapter) is begun with one round trip so that the rows go by COPY: measured under load,
#: 4-64 rows were faster through SQLAlchemy's executemany, 256 rows 1.4x faster by COPY.
_BEGIN_FOR_COPY = 100
#: How each dialect quotes the table and column names.
_QUOTE = {"mysql": "`", "mysql+aiomysql": "`"}


@cache
def _insert(names: TableNames, dialect: str) -> TextClause:
    # Building a TextClause parses its bind parameters: once per outbox and dialect.
    try:
        values = _VALUES[dialect]
    except KeyError:
        raise ConfigurationError(
            f"outboxer cannot write to {dialect!r} through SQLAlchemy"
        ) from None
    return text(insert_into(names, values, _QUOTE.get(dialect, '"')))


def _params(row: Row, dialect: str) -> dict[str, Any]:
    if dialect == "sqlite":
        values = sqlite_params(row)
    elif dialect in _QUOTE:
        values = mysql_params(row, hex_payload=dialect == "mysql+aiomysql")
    else:
        values = row
    return dict(zip(Row._fields, values, strict=True))


def _dialect(conn: Session | Connection | AsyncSession | AsyncConnection) -> str:
    """The SQL dialect to write in: SQLAlchemy's dialect name (MariaDB's is MySQL's), with the
    driver where it matters."""
    bind = conn.get_bind() if isinstance(conn, Session | AsyncSession) else conn
    name = "mysql" if bind.dialect.name == "mariadb" else bind.dialect.name
    return f"{name}+aiomysql" if name == "mysql" and bind.dialect.driver == "aiomysql" else name


def _begun(conn: Session | Connection) -> Connection:
    """The SQLAlchemy ``Connection`` of ``conn``, its transaction begun as a statement of the
    application would begin it (SQLAlchemy 2's autobegin). Rows handed to the driver's
    connection bypass SQLAlchemy: on a ``Connection`` that had not begun yet, its ``commit()``
    was a no-op and the pool rolled the rows back when the connection was returned."""
    if isinstance(conn, Session):
        return conn.connection()  # (begins the session's transaction)
    if not conn.in_transaction():
        conn.begin()
    return conn


def _on_mysql(writer: Any) -> bool:
    """Whether ``writer`` is the MySQL drivers' (see :mod:`outboxer.writers.mysql`). Under
    SQLAlchemy their connection runs a statement in SQLAlchemy's transaction, or commits it at
    once in autocommit mode, as SQLAlchemy's own statement would: the rows always go to that
    writer, whose values are hex literals (asyncmy's escaping of parameters ignores
    ``NO_BACKSLASH_ESCAPES``, which let a crafted value write SQL of its own) and which refuses
    a statement over ``max_allowed_packet`` before sending anything (the server would drop the
    connection, in autocommit mode after the rows before it had committed)."""
    return isinstance(writer, MysqlWriter | AsyncMysqlWriter)


def _dbapi_error(dialect: Dialect, exc: Exception) -> Any:
    """``exc`` as an exception of the dialect's DB-API module, or ``None`` when it is none (ours,
    the application's). SQLAlchemy's asyncpg adapter has exception classes of its own wrapping
    asyncpg's, which its cursor translates: translated here the same way."""
    dbapi = dialect.loaded_dbapi
    if isinstance(exc, dbapi.Error):
        return exc
    translate: dict[type, Any] = getattr(dbapi, "_asyncpg_error_translate", None) or {}
    for cls in type(exc).__mro__:
        if cls in translate:  # (the adapter's own table)
            translated: Exception = translate[cls](exc.args[0] if exc.args else str(exc), exc)
            translated.__cause__ = exc
            return translated
    return None


@contextmanager
def _sqlalchemy_errors(connection: Connection, invalidate: bool = True) -> Iterator[None]:
    """Rows handed to the driver's writer fail with the driver's exceptions: raise them as
    SQLAlchemy's ``execute`` would (``sqlalchemy.exc.IntegrityError`` for an id stored before,
    the driver's as ``orig``), so that the application's ``except sqlalchemy.exc....`` catches
    them whichever way the rows went; a lost connection is invalidated as SQLAlchemy does
    (``invalidate=False``: the async caller does it, awaited)."""
    try:
        yield
    except Exception as exc:
        dialect = connection.dialect
        orig = _dbapi_error(dialect, exc)
        if orig is None:
            raise
        driver = None if connection.invalidated else connection.connection.dbapi_connection
        lost = dialect.is_disconnect(orig, driver, None)
        if lost and invalidate and not connection.closed:
            connection.invalidate(orig)
        raise DBAPIError.instance(
            None,
            None,
            orig,
            dialect.loaded_dbapi.Error,
            connection_invalidated=lost,
            dialect=dialect,
        ) from exc


@asynccontextmanager
async def _async_sqlalchemy_errors(connection: AsyncConnection) -> AsyncIterator[None]:
    """:func:`_sqlalchemy_errors` for an ``AsyncConnection`` (its invalidation awaited)."""
    try:
        with _sqlalchemy_errors(connection.sync_connection, invalidate=False):  # type: ignore[arg-type]
            yield
    except DBAPIError as exc:
        if exc.connection_invalidated and not connection.closed and not connection.invalidated:
            await connection.invalidate(exc.orig)
        raise


class SqlalchemyWriter:
    """A sync ``Session`` or ``Connection``, in its transaction (begun if not yet)."""

    is_async: Literal[False] = False

    def insert(self, conn: Session | Connection, names: TableNames, row: Row) -> None:
        dialect = _dialect(conn)
        if dialect in _QUOTE:  # MySQL: the driver's writer, see _driver_writer
            found = self._driver_writer(conn)
            if found is not None:
                with _sqlalchemy_errors(_begun(conn)):
                    found[0].insert(found[1], names, row)
                return
        conn.execute(_insert(names, dialect), _params(row, dialect))

    def insert_many(
        self, conn: Session | Connection, names: TableNames, rows: Sequence[Row]
    ) -> None:
        found = self._driver_writer(conn)
        connection = _begun(conn)
        if found is not None:
            with _sqlalchemy_errors(connection):
                found[0].insert_many(found[1], names, rows)
            return
        dialect = _dialect(connection)
        connection.execute(_insert(names, dialect), [_params(row, dialect) for row in rows])

    def insert_chunks(
        self, conn: Session | Connection, names: TableNames, chunks: Iterator[Sequence[Row]]
    ) -> bool:
        connection = _begun(conn)
        with _sqlalchemy_errors(connection):
            return stream_to_driver(connection.connection.driver_connection, names, chunks)

    def _driver_writer(self, conn: Session | Connection) -> tuple[SyncWriter, Any] | None:
        """The writer of the driver underneath and its connection, if it has one and that
        connection is inside SQLAlchemy's transaction."""
        connection = _begun(conn)
        found = find_writer(connection.connection.driver_connection)
        if found is None:
            return None
        writer, driver = found
        if writer.is_async is False and (writer.joins_transaction(driver) or _on_mysql(writer)):
            return writer, driver
        return None

    def joins_transaction(self, conn: Any) -> bool:
        return True  # never wrapped itself


class AsyncSqlalchemyWriter:
    """An ``AsyncSession`` or ``AsyncConnection``, in its transaction (begun if not yet)."""

    is_async: Literal[True] = True

    async def insert(
        self, conn: AsyncSession | AsyncConnection, names: TableNames, row: Row
    ) -> None:
        dialect = _dialect(conn)
        if dialect in _QUOTE:  # as SqlalchemyWriter's
            connection, found = await self._driver(conn)
            if found is not None:
                writer, driver = found
                if writer.is_async is True:
                    async with _async_sqlalchemy_errors(connection):
                        await writer.insert(driver, names, row)
                    return
        await conn.execute(_insert(names, dialect), _params(row, dialect))

    async def insert_many(
        self, conn: AsyncSession | AsyncConnection, names: TableNames, rows: Sequence[Row]
    ) -> None:
        connection, found = await self._driver(conn)
        if found is not None:
            writer, driver = found
            if len(rows) >= _BEGIN_FOR_COPY and not writer.joins_transaction(driver):
                # SQLAlchemy's asyncpg adapter begins on the database at its first statement:
                # send one through SQLAlchemy, and the COPY runs inside its transaction.
                await connection.exec_driver_sql("SELECT 1")
            if writer.is_async is True and (writer.joins_transaction(driver) or _on_mysql(writer)):
                async with _async_sqlalchemy_errors(connection):
                    await writer.insert_many(driver, names, rows)
                return
        dialect = _dialect(connection)
        await connection.execute(_insert(names, dialect), [_params(row, dialect) for row in rows])

    async def insert_chunks(
        self,
        conn: AsyncSession | AsyncConnection,
        names: TableNames,
        chunks: Iterator[Sequence[Row]],
    ) -> bool:
        connection, found = await self._driver(conn)
        if found is None:
            return False
        writer, driver = found
        if not isinstance(writer, AsyncStreamingWriter) or writer.is_async is not True:
            return False
        if not writer.joins_transaction(driver):
            await connection.exec_driver_sql("SELECT 1")  # begun on the database (see above)
        if not writer.joins_transaction(driver):
            return False
        async with _async_sqlalchemy_errors(connection):
            return await writer.insert_chunks(driver, names, chunks)

    async def _driver(
        self, conn: AsyncSession | AsyncConnection
    ) -> tuple[AsyncConnection, tuple[Writer, Any] | None]:
        """The connection (the session's, begun if not yet) and the writer of the driver
        underneath with its connection, if outboxer has one."""
        if isinstance(conn, AsyncSession):
            connection = await conn.connection()  # (begins the session's transaction)
        else:
            connection = conn
            if not connection.in_transaction():
                await connection.begin()  # as _begun: a statement would have begun it
        return connection, find_writer((await connection.get_raw_connection()).driver_connection)

    def joins_transaction(self, conn: Any) -> bool:
        return True  # never wrapped itself


SYNC = SqlalchemyWriter()
ASYNC = AsyncSqlalchemyWriter()
