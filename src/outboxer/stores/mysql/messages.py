"""Messages not yet published, read-only, on MySQL (CLI ``messages``, admin API)."""

from __future__ import annotations

from typing import Any

from outboxer.ports import MessageFilter
from outboxer.stores._common import MessageViews, message_query
from outboxer.stores.mysql.connection import MysqlPart, fetch_all
from outboxer.stores.mysql.relay import text_row

__all__ = ["MysqlMessages"]


class MysqlMessages(MysqlPart, MessageViews):
    """The message reader's port (:class:`~outboxer.ports.MessageReader`) on MySQL."""

    async def _message_rows(
        self,
        flt: MessageFilter,
        message_id: str | None,
        limit: int,
        after: int | None,
        budget: int,
    ) -> list[dict[str, Any]]:
        sql, params = message_query(
            self.q["list_messages"],
            flt,
            message_id,
            limit,
            after,
            "AND o.`{1}` = %({1})s".format,
            budget=budget,
        )
        async with self.db.connection() as conn:
            return [text_row(row) for row in await fetch_all(conn, sql, dict(params))]
