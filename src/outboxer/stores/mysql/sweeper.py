"""The periodic sweep on MySQL: one instance at a time, its report persisted.

The lock is a server-wide named lock (``GET_LOCK``, docs/adr/0002): it belongs to the sweeping
connection, so a relay that dies mid-sweep releases it with its connection. The sweep runs in
one transaction on that connection and releases the lock after committing; the instance that
won then purges expired inbox rows in short batches.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

from outboxer.errors import StoreError
from outboxer.ports import SweepReport
from outboxer.stores._common import sweep_report
from outboxer.stores.mysql.connection import (
    MysqlPart,
    execute,
    fetch_one,
    fetch_value,
    release_lock,
)
from outboxer.stores.mysql.relay import micros

__all__ = ["MysqlSweeper"]

log = logging.getLogger("outboxer.store.mysql")

#: The sweep purges expired inbox rows this many at a time, for at most this many seconds.
_INBOX_PURGE_BATCH = 5000
_INBOX_PURGE_SECONDS = 10.0


class MysqlSweeper(MysqlPart):
    """The sweeper's port (:class:`~outboxer.ports.SweeperStore`) on MySQL."""

    async def sweep(
        self, *, sweeper: str, interval: float, retention_seconds: float, batch_size: int
    ) -> SweepReport | None:
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
                record = {"started_at": started, "sweeper": sweeper, "purged": purged}
                await execute(conn, self.q["sweep_record"], record)
                row = await fetch_one(conn, self.q["last_sweep"])
                await execute(conn, "COMMIT")
            finally:
                await release_lock(conn, lock)  # (a pending transaction dies with the pool's
                # discarding of a connection given back inside one)
        if row is None:
            return None
        await self._sweep_inbox()  # this instance won the sweep: the inbox part follows
        return sweep_report(row)

    async def last_sweep(self) -> SweepReport | None:
        async with self.db.connection() as conn:
            row = await fetch_one(conn, self.q["last_sweep"])
        return sweep_report(row) if row is not None else None

    async def _sweep_inbox(self) -> None:
        """Purge expired inbox rows in batches (bounded in time) and forget the failure rows of
        purged consume dead letters; run by whichever instance won the sweep."""
        purged = forgotten = 0
        deadline = asyncio.get_running_loop().time() + _INBOX_PURGE_SECONDS
        batch = {"batch": _INBOX_PURGE_BATCH}
        try:
            while True:
                async with self.db.connection() as conn:
                    count = await execute(conn, self.q["inbox_purge"], batch)
                purged += count
                if count < _INBOX_PURGE_BATCH or asyncio.get_running_loop().time() > deadline:
                    break
            async with self.db.connection() as conn:
                forgotten = await execute(conn, self.q["inbox_forget_dead"], batch)
        except StoreError as exc:
            log.warning("inbox purge failed (the next sweep continues): %s", exc)
        if purged or forgotten:
            log.info(
                "sweep purged %d expired inbox rows and %d failure rows of purged dead letters",
                purged,
                forgotten,
            )
