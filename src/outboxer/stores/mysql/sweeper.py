"""The sweeper's part of the MySQL store: one full sweep at a time across all relays.

The lock is a server-wide named lock (``GET_LOCK``, docs/adr/0002): it belongs to the sweeping
connection, so a relay that dies mid-sweep releases it with its connection. The sweep runs in
one transaction on that connection and releases the lock after committing.
"""

from __future__ import annotations

import datetime as dt

from outboxer.ports import SweepReport
from outboxer.stores._common import sweep_report
from outboxer.stores.mysql.connection import (
    Conn,
    MysqlDatabase,
    execute,
    fetch_one,
    fetch_value,
    release_lock,
    transaction,
)
from outboxer.stores.mysql.relay import micros

__all__ = ["MysqlSweeper"]


class MysqlSweeper:
    """``sweep`` and ``last_sweep`` over a :class:`MysqlDatabase`."""

    db: MysqlDatabase

    async def sweep(
        self, *, sweeper: str, interval: float, retention_seconds: float, batch_size: int
    ) -> SweepReport | None:
        q = self.db.queries
        lock = self.db.lock_name("sweep")

        async def sweep(conn: Conn) -> SweepReport | None:
            won = await fetch_value(
                conn, q["sweep_lock"], {"lock": lock, "interval_us": micros(interval)}
            )
            try:
                if not won:
                    return None
                started = dt.datetime.now(dt.UTC).replace(tzinfo=None)
                async with transaction(conn):
                    purged = await execute(
                        conn,
                        q["sweep_purge"],
                        {"retention_us": micros(retention_seconds), "batch": batch_size},
                    )
                    await execute(
                        conn,
                        q["sweep_record"],
                        {"started_at": started, "sweeper": sweeper, "purged": purged},
                    )
                    row = await fetch_one(conn, q["last_sweep"])
                return sweep_report(row) if row is not None else None
            finally:
                await release_lock(conn, lock)

        report = await self.db.run(sweep)
        if report is not None:  # this instance won the sweep: the inbox part follows
            await self._sweep_inbox()
        return report

    async def _sweep_inbox(self) -> None:
        """The inbox's part of a sweep (see :class:`~outboxer.stores.mysql.inbox.MysqlInbox`)."""

    async def last_sweep(self) -> SweepReport | None:
        query = self.db.queries["last_sweep"]

        async def read(conn: Conn) -> SweepReport | None:
            row = await fetch_one(conn, query)
            return sweep_report(row) if row is not None else None

        return await self.db.run(read)
