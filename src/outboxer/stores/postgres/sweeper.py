"""The periodic sweep on PostgreSQL: one instance at a time, its report persisted.

An advisory transaction lock elects the sweeper (``sweep_lock`` also checks the interval since
the last sweep); the instance that wins then purges expired inbox rows in short batches.
"""

from __future__ import annotations

import asyncio
import logging

from outboxer.errors import StoreError
from outboxer.ports import SweepReport
from outboxer.stores._common import sweep_report
from outboxer.stores.postgres.connection import PostgresPart

__all__ = ["PostgresSweeper"]

log = logging.getLogger("outboxer.store.postgres")

#: The sweep purges expired inbox rows this many at a time, for at most this many seconds.
_INBOX_PURGE_BATCH = 5000
_INBOX_PURGE_SECONDS = 10.0


class PostgresSweeper(PostgresPart):
    """The sweeper's port (:class:`~outboxer.ports.SweeperStore`) on PostgreSQL."""

    async def sweep(
        self, *, sweeper: str, interval: float, retention_seconds: float, batch_size: int
    ) -> SweepReport | None:
        async with self.db.transaction() as conn:
            lock = f"{self.names.channel}:sweep"
            if not await conn.fetchval(self.q["sweep_lock"], lock, float(interval)):
                return None
            row = await conn.fetchrow(
                self.q["sweep"], sweeper, float(retention_seconds), batch_size
            )
        if row is None:
            return None
        await self._sweep_inbox()  # this instance won the sweep: the inbox part follows
        return sweep_report(row)

    async def last_sweep(self) -> SweepReport | None:
        async with self.db.connection() as conn:
            row = await conn.fetchrow(self.q["last_sweep"])
        return sweep_report(row) if row is not None else None

    async def _sweep_inbox(self) -> None:
        """Purge expired inbox rows in batches (bounded in time) and forget the failure rows of
        purged consume dead letters; run by whichever instance won the sweep."""
        purged = forgotten = 0
        deadline = asyncio.get_running_loop().time() + _INBOX_PURGE_SECONDS
        try:
            while True:
                async with self.db.connection() as conn:
                    status = await conn.execute(self.q["inbox_purge"], _INBOX_PURGE_BATCH)
                count = int(status.split()[-1])
                purged += count
                if count < _INBOX_PURGE_BATCH or asyncio.get_running_loop().time() > deadline:
                    break
            async with self.db.connection() as conn:
                status = await conn.execute(self.q["inbox_forget_dead"], _INBOX_PURGE_BATCH)
            forgotten = int(status.split()[-1])
        except StoreError as exc:
            log.warning("inbox purge failed (the next sweep continues): %s", exc)
        if purged or forgotten:
            log.info(
                "sweep purged %d expired inbox rows and %d failure rows of purged dead letters",
                purged,
                forgotten,
            )
