"""The periodic sweep on MySQL: one instance at a time, its report persisted.

The lock is a server-wide named lock (``GET_LOCK``, docs/adr/0002): it belongs to the sweeping
connection, so a relay that dies mid-sweep releases it with its connection. The sweep runs in
one transaction on that connection and releases the lock after committing; the instance that
won then purges expired inbox rows in short batches.
"""

from __future__ import annotations

import datetime as dt
import logging

from outboxer.stores._common import Row, Sweeping
from outboxer.stores.mysql.connection import (
    MysqlPart,
    execute,
    fetch_one,
    fetch_value,
    release_lock,
)
from outboxer.stores.mysql.relay import micros

__all__ = ["MysqlSweeper"]


class MysqlSweeper(MysqlPart, Sweeping):
    """The sweeper's port (:class:`~outboxer.ports.SweeperStore`) on MySQL."""

    sweep_log = logging.getLogger("outboxer.store.mysql")

    async def _sweep_outbox(
        self, *, sweeper: str, interval: float, retention_seconds: float, batch_size: int
    ) -> Row | None:
        lock = self.db.lock_name("sweep")
        async with self.db.connection() as conn:
            args = {"lock": lock, "interval_us": micros(interval)}
            if not await fetch_value(conn, self.q["sweep_lock"], args):
                await release_lock(conn, lock)  # taken when only the interval said no
                return None
            try:
                started = dt.datetime.now(dt.UTC).replace(tzinfo=None)
                await execute(conn, "START TRANSACTION")
                purge = {"retention_us": micros(retention_seconds), "batch": batch_size}
                purged = await execute(conn, self.q["sweep_purge"], purge)
                await execute(conn, self.q["sweep_forget_relays"])
                record = {"started_at": started, "sweeper": sweeper, "purged": purged}
                await execute(conn, self.q["sweep_record"], record)
                row = await fetch_one(conn, self.q["last_sweep"])
                await execute(conn, "COMMIT")
            finally:
                await release_lock(conn, lock)  # (a pending transaction dies with the pool's
                # discarding of a connection given back inside one)
        return row

    async def _last_sweep_row(self) -> Row | None:
        async with self.db.connection() as conn:
            return await fetch_one(conn, self.q["last_sweep"])

    async def _purge_inbox_batch(self, batch: int) -> int:
        async with self.db.connection() as conn:
            return await execute(conn, self.q["inbox_purge"], {"batch": batch})

    async def _forget_dead_failures(self, batch: int) -> int:
        async with self.db.connection() as conn:
            return await execute(conn, self.q["inbox_forget_dead"], {"batch": batch})
