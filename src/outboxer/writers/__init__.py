"""Writers: one per driver family, each owning the INSERT of outbox rows in its own dialect.

The write core (:mod:`outboxer.outbox`) validates and encodes; a writer only sends rows, on the
caller's connection and in the caller's transaction, one row (``insert``) or many in one round
trip or a few (``insert_many``). This package finds the writer of a connection:

- by ``isinstance`` against the classes in :data:`CONNECTIONS`, so subclasses of a driver's
  connection (and asyncpg's pool proxies, which pass ``isinstance(conn, asyncpg.Connection)``)
  are recognised. Only drivers already imported are looked at (``sys.modules``): a connection
  of a driver that was never imported cannot exist, and nothing here imports a driver;
- after unwrapping the wrappers of :data:`WRAPPERS` (SQLAlchemy's ``scoped_session``);
- once per connection type: the answer is cached, an ``enqueue`` costs one dict lookup.

A writer module is imported only when a connection of its driver is first seen.

Adding a driver family (as ``writers/mysql.py`` did for PyMySQL, mysqlclient, asyncmy and
aiomysql): write ``writers/<family>.py`` with a :class:`SyncWriter` and/or :class:`AsyncWriter`
object (see ``writers/sqlite3.py`` for the smallest one), add its connection classes to
:data:`CONNECTIONS`, and a case to ``tests/integration/test_write_api.py``.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

from outboxer.errors import ConfigurationError
from outboxer.message import Row

if TYPE_CHECKING:
    from outboxer.config import TableNames

__all__ = [
    "CONNECTIONS",
    "WRAPPERS",
    "AsyncStreamingWriter",
    "AsyncWriter",
    "Known",
    "RELEASE_SAVEPOINT",
    "SET_SAVEPOINT",
    "STREAM_SAVEPOINT",
    "UNDO_SAVEPOINT",
    "SyncStreamingWriter",
    "SyncWriter",
    "Writer",
    "async_writer",
    "columns",
    "find_writer",
    "finish",
    "insert_into",
    "stream_to_driver",
    "sync_writer",
    "writer_for",
]


#: The savepoint a batch (``insert_chunks``, or an ``insert_many`` of several statements) rolls
#: back to when a part of it is refused, so that none of it stays in the caller's transaction;
#: with the statements that set it, release it and undo it (one statement each: MySQL and
#: SQLite take one at a time).
STREAM_SAVEPOINT = "outboxer_enqueue_many"
SET_SAVEPOINT = f"SAVEPOINT {STREAM_SAVEPOINT}"
RELEASE_SAVEPOINT = f"RELEASE SAVEPOINT {STREAM_SAVEPOINT}"
UNDO_SAVEPOINT = (f"ROLLBACK TO SAVEPOINT {STREAM_SAVEPOINT}", RELEASE_SAVEPOINT)


class SyncWriter(Protocol):
    """Writes rows through a synchronous connection, in its open transaction."""

    is_async: Literal[False]

    def insert(self, conn: Any, names: TableNames, row: Row) -> None:
        """Insert one row."""

    def insert_many(self, conn: Any, names: TableNames, rows: Sequence[Row]) -> None:
        """Insert ``rows`` (not empty) in one round trip or a few, in their order."""

    def joins_transaction(self, conn: Any) -> bool:
        """Whether a statement sent on ``conn`` now runs in the transaction a wrapper (such as
        SQLAlchemy) has open on it, so that the wrapper may hand ``conn`` to this writer."""


@runtime_checkable
class SyncStreamingWriter(Protocol):
    """A :class:`SyncWriter` that can store a long batch while it is still being validated."""

    def insert_chunks(self, conn: Any, names: TableNames, chunks: Iterator[Sequence[Row]]) -> bool:
        """Insert the rows of ``chunks`` in their order as one statement, taking each chunk
        (which validates it) while the database stores the one before; if taking one raises,
        nothing of the batch stays written and the caller's transaction stays usable. ``False``,
        before taking any chunk, when it cannot undo a partial batch (no transaction block to
        hold a savepoint): the caller then validates the whole batch first."""


@runtime_checkable
class AsyncStreamingWriter(Protocol):
    """:class:`SyncStreamingWriter` for an :class:`AsyncWriter`."""

    async def insert_chunks(
        self, conn: Any, names: TableNames, chunks: Iterator[Sequence[Row]]
    ) -> bool:
        """As :meth:`SyncStreamingWriter.insert_chunks`."""


class AsyncWriter(Protocol):
    """Writes rows through an asynchronous connection, in its open transaction."""

    is_async: Literal[True]

    async def insert(self, conn: Any, names: TableNames, row: Row) -> None:
        """Insert one row."""

    async def insert_many(self, conn: Any, names: TableNames, rows: Sequence[Row]) -> None:
        """Insert ``rows`` (not empty) in one round trip or a few, in their order."""

    def joins_transaction(self, conn: Any) -> bool:
        """As :meth:`SyncWriter.joins_transaction`."""


@dataclass(frozen=True, slots=True)
class Known:
    """A connection class the dispatch knows, and what to do with its instances.

    Attributes:
        module: The module defining the class; looked at only once it is in ``sys.modules``.
        name: The class's name in that module.
        writer: ``"<writer module>:<attribute>"`` of the writer object, e.g.
            ``"outboxer.writers.psycopg:SYNC"``; empty for a wrapper.
        unwrap: For a wrapper: returns the object to dispatch on instead.
    """

    module: str
    name: str
    writer: str = ""
    unwrap: Callable[[Any], Any] | None = None


def _call(wrapper: Any) -> Any:
    return wrapper()


def _django_connection(proxy: Any) -> Any:
    # django.db.connection forwards attribute access to connections[alias], but isinstance()
    # sees the proxy: dispatch on the connection it stands for (the current thread's).
    return proxy._connections[proxy._alias]  # noqa: SLF001 - Django keeps no public accessor


# Order matters only where classes are related: a subclass before its base.
CONNECTIONS: tuple[Known, ...] = (
    Known("sqlite3", "Connection", "outboxer.writers.sqlite3:SYNC"),
    Known("sqlite3", "Cursor", "outboxer.writers.sqlite3:SYNC"),
    Known("aiosqlite", "Connection", "outboxer.writers.aiosqlite:ASYNC"),
    Known("aiosqlite", "Cursor", "outboxer.writers.aiosqlite:ASYNC"),
    Known("psycopg", "Connection", "outboxer.writers.psycopg:SYNC"),
    Known("psycopg", "Cursor", "outboxer.writers.psycopg:SYNC"),
    Known("psycopg", "AsyncConnection", "outboxer.writers.psycopg:ASYNC"),
    Known("psycopg", "AsyncCursor", "outboxer.writers.psycopg:ASYNC"),
    # also asyncpg.pool.PoolConnectionProxy: asyncpg makes it pass isinstance(Connection)
    Known("asyncpg", "Connection", "outboxer.writers.asyncpg:ASYNC"),
    Known("pymysql.connections", "Connection", "outboxer.writers.mysql:SYNC"),
    Known("pymysql.cursors", "Cursor", "outboxer.writers.mysql:SYNC"),
    Known("MySQLdb.connections", "Connection", "outboxer.writers.mysql:SYNC"),
    Known("MySQLdb.cursors", "BaseCursor", "outboxer.writers.mysql:SYNC"),
    Known("asyncmy.connection", "Connection", "outboxer.writers.mysql:ASYNC"),
    Known("asyncmy.cursors", "Cursor", "outboxer.writers.mysql:ASYNC"),
    Known("aiomysql.connection", "Connection", "outboxer.writers.mysql:ASYNC"),
    Known("aiomysql.cursors", "Cursor", "outboxer.writers.mysql:ASYNC"),
    Known("sqlalchemy.orm", "Session", "outboxer.writers.sqlalchemy:SYNC"),
    Known("sqlalchemy.engine", "Connection", "outboxer.writers.sqlalchemy:SYNC"),
    Known("sqlalchemy.ext.asyncio", "AsyncSession", "outboxer.writers.sqlalchemy:ASYNC"),
    Known("sqlalchemy.ext.asyncio", "AsyncConnection", "outboxer.writers.sqlalchemy:ASYNC"),
    # Django's connections[alias] (django.db.connection is a proxy of the default one)
    Known("django.db.backends.base.base", "BaseDatabaseWrapper", "outboxer.writers.django:SYNC"),
)

# Objects that stand for a connection: dispatch continues with ``unwrap(obj)``.
WRAPPERS: tuple[Known, ...] = (
    # Flask-SQLAlchemy's db.session and many apps' Session registry: the current Session
    Known("sqlalchemy.orm", "scoped_session", unwrap=_call),
    Known("sqlalchemy.ext.asyncio", "async_scoped_session", unwrap=_call),
    Known("django.utils.connection", "ConnectionProxy", unwrap=_django_connection),
)

Writer = SyncWriter | AsyncWriter
# per connection type: its writer, or for a wrapper how to unwrap it
_cache: dict[type, Writer | Callable[[Any], Any]] = {}


def _lookup(conn: Any) -> Writer | Callable[[Any], Any] | None:
    for known in (*WRAPPERS, *CONNECTIONS):
        module = sys.modules.get(known.module)
        cls = getattr(module, known.name, None) if module is not None else None
        if cls is None or not isinstance(conn, cls):
            continue
        if known.unwrap is not None:
            return known.unwrap
        module_name, attribute = known.writer.split(":")
        writer: Writer = getattr(importlib.import_module(module_name), attribute)
        return writer
    return None


def find_writer(conn: Any) -> tuple[Writer, Any] | None:
    """The writer of ``conn``'s driver family and the connection to hand it, if any."""
    for _ in range(4):  # wrappers of wrappers, but never a loop
        found = _cache.get(type(conn))
        if found is None:
            found = _lookup(conn)
            if found is None:
                return None
            _cache[type(conn)] = found
        if not callable(found):
            return found, conn
        conn = found(conn)
    return None


def writer_for(conn: Any) -> tuple[Writer, Any]:
    """:func:`find_writer`, or ConfigurationError for a connection of no known driver."""
    found = find_writer(conn)
    if found is None:
        raise ConfigurationError(
            f"enqueue() does not know connections of type {type(conn).__module__}."
            f"{type(conn).__qualname__}: pass a SQLAlchemy Session/Connection (sync or async), "
            "a Django connection, a psycopg 3, asyncpg, sqlite3, aiosqlite, PyMySQL, mysqlclient, "
            "asyncmy or aiomysql connection"
        )
    return found


T = TypeVar("T")


async def finish(step: Awaitable[T]) -> T:
    """Await ``step`` to its end even if the caller is cancelled meanwhile, then let the
    cancellation through: the undo of a batch stopped half-way must not stop half-way itself
    (the caller, catching the cancellation, could commit the part stored)."""
    task = asyncio.ensure_future(step)
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            if task.cancelled():
                raise
            cancelled = exc  # the caller's: the step goes on
            continue
        if cancelled is not None:
            raise cancelled
        return result


def stream_to_driver(driver: Any, names: TableNames, chunks: Iterator[Sequence[Row]]) -> bool:
    """``insert_chunks`` on the writer of a wrapper's (SQLAlchemy's, Django's) synchronous
    driver connection, if that writer streams and the connection is in the wrapper's
    transaction; else ``False``, nothing taken."""
    found = find_writer(driver)
    if found is None:
        return False
    writer, target = found
    return (
        isinstance(writer, SyncStreamingWriter)
        and writer.is_async is False
        and writer.joins_transaction(target)
        and writer.insert_chunks(target, names, chunks)
    )


def insert_into(names: TableNames, values: str, quote: str = '"') -> str:
    """``INSERT INTO <outbox> (<Row's columns>) <values>``: the head of every writer's INSERT;
    ``values`` (in the writer's parameter style) is the writer's own."""
    return f"INSERT INTO {names.qualified(quote=quote)} ({columns(quote)}) {values}"


def columns(quote: str = '"', fields: Sequence[str] = Row._fields) -> str:
    """The quoted column list of ``fields`` (default: every column of :class:`Row`)."""
    return ", ".join(f"{quote}{field}{quote}" for field in fields)


def _wrong_twin(conn: Any, is_async: bool, twin: str) -> ConfigurationError:
    name = type(conn).__qualname__
    if is_async:
        return ConfigurationError(f"{name} is asynchronous: use 'await {twin}(...)'")
    return ConfigurationError(f"{name} is synchronous: use '{twin}(...)' (no await)")


def sync_writer(conn: Any, twin: str = "enqueue_async") -> tuple[SyncWriter, Any]:
    """:func:`writer_for` for ``enqueue``: refuses an asynchronous connection, naming ``twin``
    (the function to call instead)."""
    writer, target = writer_for(conn)
    if writer.is_async is True:
        raise _wrong_twin(conn, writer.is_async, twin)
    return writer, target


def async_writer(conn: Any, twin: str = "enqueue") -> tuple[AsyncWriter, Any]:
    """:func:`writer_for` for ``enqueue_async``: refuses a synchronous connection, naming
    ``twin``."""
    writer, target = writer_for(conn)
    if writer.is_async is False:
        raise _wrong_twin(conn, writer.is_async, twin)
    return writer, target
