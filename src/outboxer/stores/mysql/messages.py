"""Messages not yet published, read-only, on MySQL (CLI ``messages``, admin API)."""

from __future__ import annotations

from typing import Any

from outboxer.stores._common import MessageViews
from outboxer.stores.mysql.connection import MysqlPart, fetch_all
from outboxer.stores.mysql.relay import text_row

__all__ = ["MysqlMessages"]


class MysqlMessages(MysqlPart, MessageViews):
    """The message reader's port (:class:`~outboxer.ports.MessageReader`) on MySQL."""

    _CONDITION = "AND o.`{1}` = %({1})s"

    async def _fetch_messages(
        self, sql: str, params: list[tuple[str, Any]]
    ) -> list[dict[str, Any]]:
        async with self.db.connection() as conn:
            return [text_row(row) for row in await fetch_all(conn, sql, dict(params))]
