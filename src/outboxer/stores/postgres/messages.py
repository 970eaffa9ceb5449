"""Messages not yet published, read-only, on PostgreSQL (CLI ``messages``, admin API)."""

from __future__ import annotations

import asyncpg

from outboxer.ports import MessageFilter, MessagePage, OutboxMessage
from outboxer.stores._common import (
    check_limit,
    message_conditions,
    message_not_found,
    message_page,
    parse_cursor,
)
from outboxer.stores.postgres.connection import PostgresPart

__all__ = ["PostgresMessages"]


class PostgresMessages(PostgresPart):
    """The message reader's port (:class:`~outboxer.ports.MessageReader`) on PostgreSQL."""

    async def list_messages(
        self, flt: MessageFilter, *, limit: int, cursor: str | None
    ) -> MessagePage:
        limit = check_limit(limit)
        rows = await self._message_rows(flt, None, limit + 1, parse_cursor(cursor))
        return message_page(rows, limit)

    async def get_message(self, message_id: str) -> OutboxMessage:
        page = message_page(await self._message_rows(MessageFilter(), message_id, 1, None), 1)
        if not page.items:
            raise message_not_found(message_id)
        return page.items[0]

    async def _message_rows(
        self, flt: MessageFilter, message_id: str | None, limit: int, after: int | None
    ) -> list[asyncpg.Record]:
        equal = message_conditions(flt, message_id)
        filters = " ".join(f"AND o.{column} = ${n}" for n, (column, _) in enumerate(equal, 4))
        sql = self.q["list_messages"].replace("{filters}", filters)
        args = (after or 0, limit, flt.state, *(value for _, value in equal))
        async with self.db.connection() as conn:
            return list(await conn.fetch(sql, *args))
