"""Messages not yet published, read-only, on SQLite (CLI ``messages``, admin API)."""

from __future__ import annotations

import sqlite3

from outboxer.ports import MessageFilter
from outboxer.stores._common import MessageViews, message_query
from outboxer.stores.sqlite.connection import SqlitePart

__all__ = ["SqliteMessages"]


class SqliteMessages(SqlitePart, MessageViews):
    """The message reader's port (:class:`~outboxer.ports.MessageReader`) on SQLite."""

    async def _message_rows(
        self,
        flt: MessageFilter,
        message_id: str | None,
        limit: int,
        after: int | None,
        budget: int,
    ) -> list[sqlite3.Row]:
        sql, params = message_query(
            self.q["list_messages"],
            flt,
            message_id,
            limit,
            after,
            "AND o.{1} = :{1}".format,
            budget=budget,
        )
        async with self.db.connection() as conn, conn.execute(sql, dict(params)) as cur:
            return list(await cur.fetchall())
