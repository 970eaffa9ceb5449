"""SQLite store, the embedded default (aiosqlite, WAL mode).

One class, :class:`SqliteStore`, assembled from its parts, one module per concern over the
connection seam of :mod:`~outboxer.stores.sqlite.connection`:

- ``relay.py``: claims in ``BEGIN IMMEDIATE`` transactions, settlements fenced by the claim
  token, the relay registry (no NOTIFY: relays poll);
- ``sweeper.py``: the periodic sweep, one instance at a time;
- ``dead_letters.py``: figures and dead letters for operators;
- ``messages.py``: the messages not yet published, read-only, for operators;
- ``schema.py``: the versioned migrations;
- ``inbox.py``: the inbox's SQL primitives (the state machine is :mod:`outboxer.inbox.consume`);
- ``sql/``: the migrations and the named queries (``queries.sql``).

Ownership: the store opens and closes its own connection.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from outboxer.config import TableNames
from outboxer.errors import ConfigurationError
from outboxer.ports import DatabaseStore
from outboxer.stores import _sql
from outboxer.stores._common import StoreLifecycle
from outboxer.stores.sqlite.connection import (
    CLOCK,
    NOW,
    URL_SPEC,
    SqliteDatabase,
    path_from_url,
)
from outboxer.stores.sqlite.dead_letters import SqliteDeadLetters
from outboxer.stores.sqlite.inbox import SqliteInbox
from outboxer.stores.sqlite.messages import SqliteMessages
from outboxer.stores.sqlite.relay import SqliteRelay
from outboxer.stores.sqlite.schema import SqliteSchema
from outboxer.stores.sqlite.sweeper import SqliteSweeper

__all__ = ["URL_SPEC", "SqliteStore", "from_url", "path_from_url"]


class SqliteStore(
    StoreLifecycle,
    SqliteRelay,
    SqliteSweeper,
    SqliteDeadLetters,
    SqliteMessages,
    SqliteSchema,
    SqliteInbox,
):
    """The outbox in a SQLite database file: every port of
    :class:`~outboxer.ports.DatabaseStore`.

    Args:
        path_or_url: A file path or ``sqlite:///path.db``.
        names: Table names (SQLite has no schemas: ``names.schema`` must be ``None``).
        clock: The current time in UTC epoch seconds for the relay's queries (leases, retry
            delays, sweeps), instead of SQLite's own clock (``tests/simulation`` runs on virtual
            time). Default: SQLite's ``julianday('now')``.
    """

    dialect = "sqlite"

    def __init__(
        self,
        path_or_url: str | Path,
        names: TableNames | None = None,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.names = names or TableNames()
        if self.names.schema is not None:
            raise ConfigurationError("SQLite has no schemas: leave the schema name unset")
        raw = str(path_or_url)
        self.path = path_from_url(raw) if "://" in raw else raw
        q = _sql.queries("sqlite", self.names)
        where = q.pop("dead_letter_where")
        self.q = {name: sql.replace("{where}", where) for name, sql in q.items()}
        if clock is not None:
            self.q = {name: sql.replace(NOW, CLOCK) for name, sql in self.q.items()}
            self.now = CLOCK
        self.db = SqliteDatabase(self.path, self.names, clock=clock, connect=self._connect)

    async def _connect(self) -> aiosqlite.Connection:
        """Open the connection in autocommit mode (transactions are explicit); a subclass may
        connect differently (``tests/simulation`` runs SQLite without a thread)."""
        connection = aiosqlite.connect(self.path, isolation_level=None, timeout=30)
        try:
            return await connection
        except BaseException:
            # aiosqlite stops its thread after a failed connect without waiting for it: the
            # thread then reported to a closed event loop, a traceback after the one-line error
            # of `outboxer stats` on a bad path (a probe). Its end is waited for here.
            thread = getattr(connection, "_thread", None)
            if thread is not None and thread.is_alive():
                await asyncio.to_thread(thread.join, 5)
            raise

    async def execute(self, sql: str, *args: Any) -> Sequence[sqlite3.Row]:
        """Run SQL with the outbox placeholders rendered (tests and benchmarks)."""
        async with (
            self.db.connection() as conn,
            conn.execute(_sql.render(sql, self.names), args) as cur,
        ):
            return list(await cur.fetchall())


def from_url(
    url: str, names: TableNames | None = None, *, connections: int | None = None
) -> DatabaseStore:
    """The (not yet opened) store for a ``sqlite:///`` URL (one connection: SQLite has one
    writer, so ``connections`` is ignored)."""
    return SqliteStore(url, names)
