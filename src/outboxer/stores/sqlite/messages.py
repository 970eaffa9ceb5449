"""Messages not yet published, read-only, on SQLite (CLI ``messages``, admin API)."""

from __future__ import annotations

import sqlite3
from typing import Any

from outboxer.stores._common import MessageViews
from outboxer.stores.sqlite.connection import SqlitePart

__all__ = ["SqliteMessages"]


class SqliteMessages(SqlitePart, MessageViews):
    """The message reader's port (:class:`~outboxer.ports.MessageReader`) on SQLite."""

    _CONDITION = "AND o.{1} = :{1}"

    async def _fetch_messages(self, sql: str, params: list[tuple[str, Any]]) -> list[sqlite3.Row]:
        async with self.db.connection() as conn, conn.execute(sql, dict(params)) as cur:
            return list(await cur.fetchall())
