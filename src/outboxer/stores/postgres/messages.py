"""Messages not yet published, read-only, on PostgreSQL (CLI ``messages``, admin API)."""

from __future__ import annotations

from typing import Any

import asyncpg

from outboxer.stores._common import MessageViews
from outboxer.stores.postgres.connection import PostgresPart

__all__ = ["PostgresMessages"]


class PostgresMessages(PostgresPart, MessageViews):
    """The message reader's port (:class:`~outboxer.ports.MessageReader`) on PostgreSQL."""

    _CONDITION = "AND o.{1} = ${0}"

    async def _fetch_messages(
        self, sql: str, params: list[tuple[str, Any]]
    ) -> list[asyncpg.Record]:
        async with self.db.connection() as conn:
            return list(await conn.fetch(sql, *(value for _, value in params)))
