"""The periodic sweep on SQLite: the write lock of ``BEGIN IMMEDIATE`` elects the sweeper."""

from __future__ import annotations

import asyncio
import logging

from outboxer.errors import StoreError
from outboxer.ports import SweepReport
from outboxer.stores._common import sweep_report
from outboxer.stores.sqlite.connection import SqlitePart

__all__ = ["SqliteSweeper"]

log = logging.getLogger("outboxer.store.sqlite")

#: The sweep purges expired inbox rows this many at a time, for at most this many seconds.
_INBOX_PURGE_BATCH = 5000
_INBOX_PURGE_SECONDS = 10.0


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
        """Purge expired inbox rows in batches and forget the failure rows of purged consume
        dead letters; each batch is its own short write transaction."""
        purged = forgotten = 0
        batch = {"batch": _INBOX_PURGE_BATCH}
        deadline = asyncio.get_running_loop().time() + _INBOX_PURGE_SECONDS
        try:
            while True:
                async with self.db.transaction() as conn:
                    count: int = (await conn.execute(self.q["inbox_purge"], batch)).rowcount
                purged += count
                if count < _INBOX_PURGE_BATCH or asyncio.get_running_loop().time() > deadline:
                    break
            async with self.db.connection() as conn:
                forgotten = (await conn.execute(self.q["inbox_forget_dead"], batch)).rowcount
        except StoreError as exc:
            log.warning("inbox purge failed (the next sweep continues): %s", exc)
        if purged or forgotten:
            log.info(
                "sweep purged %d expired inbox rows and %d failure rows of purged dead letters",
                purged,
                forgotten,
            )
