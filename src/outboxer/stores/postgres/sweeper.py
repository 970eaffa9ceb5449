"""The periodic sweep on PostgreSQL: one instance at a time, its report persisted.

An advisory transaction lock elects the sweeper (``sweep_lock`` also checks the interval since
the last sweep); the instance that wins then purges expired inbox rows in short batches.
"""

from __future__ import annotations

import logging

import asyncpg

from outboxer.stores._common import Sweeping
from outboxer.stores.postgres.connection import PostgresPart

__all__ = ["PostgresSweeper"]


class PostgresSweeper(PostgresPart, Sweeping):
    """The sweeper's port (:class:`~outboxer.ports.SweeperStore`) on PostgreSQL."""

    sweep_log = logging.getLogger("outboxer.store.postgres")

    async def _sweep_outbox(
        self, *, sweeper: str, interval: float, retention_seconds: float, batch_size: int
    ) -> asyncpg.Record | None:
        async with self.db.transaction() as conn:
            lock = f"{self.names.channel}:sweep"
            if not await conn.fetchval(self.q["sweep_lock"], lock, float(interval)):
                return None
            return await conn.fetchrow(
                self.q["sweep"], sweeper, float(retention_seconds), batch_size
            )

    async def _last_sweep_row(self) -> asyncpg.Record | None:
        async with self.db.connection() as conn:
            return await conn.fetchrow(self.q["last_sweep"])

    async def _purge_inbox_batch(self, batch: int) -> int:
        async with self.db.connection() as conn:
            await self.inbox_plans.check(conn)  # every batch: a stale purge ran for minutes
            return _row_count(await conn.execute(self.q["inbox_purge"], batch))

    async def _forget_dead_failures(self, batch: int) -> int:
        async with self.db.connection() as conn:
            return _row_count(await conn.execute(self.q["inbox_forget_dead"], batch))


def _row_count(status: str) -> int:
    """The row count of a command status such as ``DELETE 42``."""
    return int(status.split()[-1])
