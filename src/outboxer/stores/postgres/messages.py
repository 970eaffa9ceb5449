"""Messages not yet published, read-only, on PostgreSQL (CLI ``messages``, admin API)."""

from __future__ import annotations

import asyncpg

from outboxer.ports import MessageFilter
from outboxer.stores._common import MessageViews, message_query
from outboxer.stores.postgres.connection import PostgresPart

__all__ = ["PostgresMessages"]


class PostgresMessages(PostgresPart, MessageViews):
    """The message reader's port (:class:`~outboxer.ports.MessageReader`) on PostgreSQL."""

    async def _message_rows(
        self,
        flt: MessageFilter,
        message_id: str | None,
        limit: int,
        after: int | None,
        budget: int,
    ) -> list[asyncpg.Record]:
        sql, params = message_query(
            self.q["list_messages"],
            flt,
            message_id,
            limit,
            after,
            "AND o.{1} = ${0}".format,
            budget=budget,
        )
        async with self.db.connection() as conn:
            return list(await conn.fetch(sql, *(value for _, value in params)))
