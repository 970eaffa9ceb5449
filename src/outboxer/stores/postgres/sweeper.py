"""The periodic sweep on PostgreSQL: one instance at a time, its report persisted.

An advisory transaction lock elects the sweeper (``sweep_lock`` also checks the interval since
the last sweep); the instance that wins then purges expired inbox rows in short batches.
"""

from __future__ import annotations

import logging

from outboxer.ports import SweepReport
from outboxer.stores._common import purge_inbox, sweep_report
from outboxer.stores.postgres.connection import PostgresPart

__all__ = ["PostgresSweeper"]

log = logging.getLogger("outboxer.store.postgres")


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
        await purge_inbox(self._purge_inbox_batch, self._forget_dead_failures, log)

    async def _purge_inbox_batch(self, batch: int) -> int:
        async with self.db.connection() as conn:
            return _row_count(await conn.execute(self.q["inbox_purge"], batch))

    async def _forget_dead_failures(self, batch: int) -> int:
        async with self.db.connection() as conn:
            return _row_count(await conn.execute(self.q["inbox_forget_dead"], batch))


def _row_count(status: str) -> int:
    """The row count of a command status such as ``DELETE 42``."""
    return int(status.split()[-1])
