"""The SQLite store's connection seam: its URL, its one connection, and error translation.

SQLite admits one writer at a time, so the store keeps one aiosqlite connection and runs one
transaction at a time on it (an ``asyncio.Lock``); a write transaction is ``BEGIN IMMEDIATE``,
which takes the database's write lock at once, so relays in several processes serialize
instead of failing at their first write. Driver errors become outboxer's here:

=======================================  ================================================
sqlite3 error                            outboxer error
=======================================  ================================================
``OperationalError`` "no such table"     ``SchemaError`` (run ``outboxer db upgrade``)
any other ``OperationalError``           ``StoreUnavailable`` (locked, disk, I/O: retry)
=======================================  ================================================

Ownership: the store opens and closes its own connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path

import aiosqlite

from outboxer import urls
from outboxer.config import TableNames
from outboxer.errors import ConfigurationError, SchemaError, StoreUnavailable

__all__ = [
    "URL_SPEC",
    "SqliteDatabase",
    "SqlitePart",
    "immediate",
    "is_closed",
    "path_from_url",
]

#: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or ``sqlite:///:memory:``.
URL_SPEC = urls.UrlSpec(
    what="SQLite URL",
    schemes=("sqlite",),
    hosts="none",
    path="required",
    credentials=False,
    example="sqlite:///outbox.db",
)

#: SQLite's clock in UTC epoch seconds, as the schema stores times.
NOW = "(julianday('now') - 2440587.5) * 86400.0"
#: The store's own clock instead (a store given ``clock=``): a function of the connection.
CLOCK = "outboxer_now()"


def path_from_url(url: str) -> str:
    """The database file of a ``sqlite:///`` URL (checked against :data:`URL_SPEC`)."""
    return urls.parse(url, URL_SPEC).path


class SqliteDatabase:
    """The one connection of a store, and the one place its driver errors are translated.

    Args:
        path: The database file, or ``:memory:``.
        names: The outbox's table names (named in the ``SchemaError`` of a missing table).
        connect: Opens the connection, in autocommit mode (transactions are explicit).
        clock: Defines ``outboxer_now()`` (UTC epoch seconds) on the connection, if given.
    """

    def __init__(
        self,
        path: str,
        names: TableNames,
        *,
        connect: Callable[[], Awaitable[aiosqlite.Connection]],
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.path = path
        self.names = names
        self._clock = clock
        self._connect = connect
        self._conn: aiosqlite.Connection | None = None
        self._opened = False  # open() was called (the file may not exist yet)
        self._lock = asyncio.Lock()  # one transaction at a time on the shared connection

    async def open(self, *, create: bool = False) -> None:
        """Connect, unless the database file does not exist and ``create`` is false.

        Only a schema upgrade creates the file: a command that reads a mistyped path (``stats``,
        ``dlq list``, a relay) must say the outbox is missing instead of leaving an empty file
        behind. Until then every operation raises ``SchemaError``.
        """
        self._opened = True
        if self._conn is not None:
            return
        if self.path != ":memory:" and not Path(self.path).parent.exists():
            raise ConfigurationError(f"SQLite: directory of {self.path} does not exist")
        if self._is_directory():
            raise ConfigurationError(f"SQLite: {self.path} is a directory, not a database file")
        if not create and self.path != ":memory:" and not self._exists():
            return
        try:
            conn = await self._connect()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open SQLite database {self.path}: {exc}") from exc
        try:
            conn.row_factory = sqlite3.Row
            await conn.execute("PRAGMA busy_timeout = 30000")
            await conn.execute("PRAGMA journal_mode = WAL")
            await conn.execute("PRAGMA synchronous = NORMAL")
            if self._clock is not None:
                await conn.create_function("outboxer_now", 0, self._clock)
        except BaseException as exc:
            # aiosqlite runs the connection in a thread of its own that only close() ends; left
            # open (a file that is not a database fails the first PRAGMA), it keeps the process
            # alive after the command has reported the error.
            with contextlib.suppress(Exception):
                await conn.close()
            if isinstance(exc, sqlite3.Error):
                raise StoreUnavailable(f"cannot open SQLite database {self.path}: {exc}") from exc
            raise
        self._conn = conn

    def _exists(self) -> bool:
        # One stat of a local file, outside the event loop's hot path: no thread needed.
        return os.path.exists(self.path)

    def _is_directory(self) -> bool:
        return os.path.isdir(self.path)

    async def close(self) -> None:
        self._opened = False
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[aiosqlite.Connection]:
        """The connection, for this block alone, in autocommit."""
        async with self._lock:
            if self._conn is None and self._opened and self._exists():
                await self.open()  # created since (by 'db upgrade')
            if self._conn is None and self._opened:
                raise SchemaError(
                    f"SQLite database {self.path} does not exist: run 'outboxer db upgrade'"
                )
            if self._conn is None:
                raise RuntimeError("SqliteStore is not open (use 'async with store:')")
            conn = self._conn
            try:
                yield conn
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    raise SchemaError(
                        f"outbox table {self.names.table} is missing: run 'outboxer db upgrade'"
                    ) from exc
                raise StoreUnavailable(f"SQLite: {exc}") from exc
            except BaseException:
                if is_closed(conn):
                    # An inbox handler closed it (HandlerEndedTransaction): the next user opens
                    # a new one instead of failing on the closed one, forever.
                    self._conn = None
                raise

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """The connection inside a write transaction, committed when the block ends."""
        async with self.connection() as conn, immediate(conn):
            yield conn


def is_closed(conn: aiosqlite.Connection) -> bool:
    """Whether ``conn`` was closed (only ever by its client: a handler, the store)."""
    try:
        conn.in_transaction  # noqa: B018 - aiosqlite raises once it is closed
    except (ValueError, sqlite3.ProgrammingError):
        return True
    return False


@contextlib.asynccontextmanager
async def immediate(conn: aiosqlite.Connection) -> AsyncIterator[None]:
    """A ``BEGIN IMMEDIATE`` transaction on a connection the caller holds.

    Cancelled while ``BEGIN`` is on its way, it still ends with a ``ROLLBACK``: aiosqlite runs
    a statement in its thread whether or not the caller still waits for it, and runs them in
    order. Before, the transaction stayed open, and the connection's next statements ran in it
    and were never committed (found by a test now and then: a relay stopped while its sweep
    began, and its unregister was lost when the connection closed).
    """
    try:
        await conn.execute("BEGIN IMMEDIATE")
    except asyncio.CancelledError:
        with contextlib.suppress(sqlite3.OperationalError):  # (the BEGIN itself failed)
            await conn.execute("ROLLBACK")
        raise
    try:
        yield
    except BaseException:
        await conn.execute("ROLLBACK")
        raise
    await conn.execute("COMMIT")


class SqlitePart:
    """What each part of the store (relay, sweeper, dead letters, schema, inbox) works on.

    Attributes:
        db: The connection seam.
        names: Table names.
        q: The named queries of ``sql/queries.sql``, rendered for ``names``.
        now: The SQL expression of the current time.
    """

    db: SqliteDatabase
    names: TableNames
    q: Mapping[str, str]
    #: The SQL expression of the current time (SQLite's clock, or the store's ``clock``).
    now: str = NOW
