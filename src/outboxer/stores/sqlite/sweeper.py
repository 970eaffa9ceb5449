"""The periodic sweep on SQLite: the write lock of ``BEGIN IMMEDIATE`` elects the sweeper."""

from __future__ import annotations

import logging

from outboxer.ports import SweepReport
from outboxer.stores._common import purge_inbox, sweep_report
from outboxer.stores.sqlite.connection import SqlitePart

__all__ = ["SqliteSweeper"]

log = logging.getLogger("outboxer.store.sqlite")


class SqliteSweeper(SqlitePart):
    """The sweeper's port (:class:`~outboxer.ports.SweeperStore`) on SQLite."""

    async def sweep(
        self, *, sweeper: str, interval: float, retention_seconds: float, batch_size: int
    ) -> SweepReport | None:
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
            params = {"purged": purged, "sweeper": sweeper, "started": started}
            async with conn.execute(self.q["sweep"], params) as cur:
                row = await cur.fetchone()
        if row is None:
            return None
        await self._sweep_inbox()  # this instance won the sweep: the inbox part follows
        return sweep_report(row)

    async def last_sweep(self) -> SweepReport | None:
        async with self.db.connection() as conn, conn.execute(self.q["last_sweep"]) as cur:
            row = await cur.fetchone()
        return sweep_report(row) if row is not None else None

    async def _sweep_inbox(self) -> None:
        # Each batch is its own short write transaction: writers wait only that long.
        await purge_inbox(self._purge_inbox_batch, self._forget_dead_failures, log)

    async def _purge_inbox_batch(self, batch: int) -> int:
        async with self.db.transaction() as conn:
            purged: int = (await conn.execute(self.q["inbox_purge"], {"batch": batch})).rowcount
        return purged

    async def _forget_dead_failures(self, batch: int) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(self.q["inbox_forget_dead"], {"batch": batch})
        return int(cursor.rowcount)
