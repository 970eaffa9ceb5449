"""The periodic sweep on SQLite: the write lock of ``BEGIN IMMEDIATE`` elects the sweeper."""

from __future__ import annotations

import logging
import sqlite3

from outboxer.stores._common import Sweeping
from outboxer.stores.sqlite.connection import SqlitePart

__all__ = ["SqliteSweeper"]


class SqliteSweeper(SqlitePart, Sweeping):
    """The sweeper's port (:class:`~outboxer.ports.SweeperStore`) on SQLite."""

    sweep_log = logging.getLogger("outboxer.store.sqlite")

    async def _sweep_outbox(
        self, *, sweeper: str, interval: float, retention_seconds: float, batch_size: int
    ) -> sqlite3.Row | None:
        # BEGIN IMMEDIATE holds the database's write lock: one sweeper at a time.
        async with self.db.transaction() as conn:
            async with conn.execute(self.q["sweep_due"], {"interval": interval}) as cur:
                due = await cur.fetchone()
            if due is None or not due["due"]:
                return None
            async with conn.execute("SELECT " + self.now) as cur:
                started = (await cur.fetchone() or [0.0])[0]
            purge = {"retention": retention_seconds, "batch": batch_size}
            purged = (await conn.execute(self.q["sweep_purge"], purge)).rowcount
            await conn.execute(self.q["sweep_forget_relays"])
            params = {"purged": purged, "sweeper": sweeper, "started": started}
            async with conn.execute(self.q["sweep"], params) as cur:
                return await cur.fetchone()

    async def _last_sweep_row(self) -> sqlite3.Row | None:
        async with self.db.connection() as conn, conn.execute(self.q["last_sweep"]) as cur:
            return await cur.fetchone()

    # Each inbox batch is its own short write transaction: writers wait only that long.
    async def _purge_inbox_batch(self, batch: int) -> int:
        async with self.db.transaction() as conn:
            purged: int = (await conn.execute(self.q["inbox_purge"], {"batch": batch})).rowcount
        return purged

    async def _forget_dead_failures(self, batch: int) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(self.q["inbox_forget_dead"], {"batch": batch})
        return int(cursor.rowcount)
