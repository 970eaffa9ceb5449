"""The inbox's SQL on SQLite: the primitives :mod:`outboxer.inbox.consume` runs.

Handlers get the aiosqlite connection of the inbox transaction, so their writes commit with the
inbox row. SQLite has one writer: a session holds the store's connection, and its transactions
are ``BEGIN IMMEDIATE`` (no other writer until the commit); the savepoints are
``stores._common.SqlInboxSession``'s. A batch of deliveries is recorded by one ``INSERT …
SELECT FROM json_each(…) ON CONFLICT DO NOTHING RETURNING`` (``inbox_receive``).

A handler that closes the connection fails its batch with ``HandlerEndedTransaction``; the
store opens a new connection for its next use (a ``:memory:`` database is lost with the old
one).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from outboxer.message import Message, encode_headers
from outboxer.ports import ConsumeFailure, InboxReceipt, PendingFailure, failure_reason
from outboxer.stores._common import (
    Row,
    SqlInbox,
    SqlInboxSession,
    envelope_of,
    pending_failure_from_row,
)
from outboxer.stores.sqlite.connection import SqlitePart, immediate, is_closed

__all__ = ["SqliteInbox"]


class _Session(SqlInboxSession):
    """The store's connection, held for a chunk of deliveries or a round of re-drives."""

    def _begin(self) -> contextlib.AbstractAsyncContextManager[object]:
        return immediate(self.connection)

    async def _run(self, sql: str, args: Any) -> None:
        # No round trips to save in-process; sqlite3 runs one statement per call.
        for statement in sql.split(";") if args is None else [sql]:
            await self.connection.execute(statement, args or ())

    async def _rows(self, sql: str, args: Any) -> Sequence[Row]:
        async with self.connection.execute(sql, args) as cursor:
            return list(await cursor.fetchall())

    def _in_transaction(self) -> bool | None:
        try:
            return bool(self.connection.in_transaction)
        except (ValueError, sqlite3.ProgrammingError):  # closed (only ever by the client)
            return False

    def _connection_closed(self) -> bool:
        return is_closed(self.connection)

    def _savepoint_missing(self, error: Exception) -> bool:
        return isinstance(error, sqlite3.OperationalError) and "no such savepoint" in str(error)

    def _forget_args(self, consumer: str, message_ids: Sequence[str]) -> Any:
        return {"consumer": consumer, "ids": json.dumps(list(message_ids))}

    async def due_failures(self, consumer: str, limit: int) -> list[str]:
        rows = await self.fetch(self.q["inbox_due"], {"consumer": consumer, "limit": limit})
        return [r["message_id"] for r in rows]

    async def count_retries(self, count: int) -> None:
        await self.execute(self.q["inbox_count_retries"], {"count": count})

    async def receive(
        self, consumer: str, messages: Sequence[Message], retention: float
    ) -> list[InboxReceipt]:
        batch = json.dumps([[m.id, m.key] for m in messages])
        params = {"consumer": consumer, "messages": batch, "retention": retention}
        rows = await self.fetch(self.q["inbox_receive"], params)
        inserted = {r["message_id"]: r["expires_at"] is None for r in rows}
        return [
            InboxReceipt(fresh=m.id in inserted, blocked=inserted.get(m.id, False))
            for m in messages
        ]

    async def record_failure(
        self, consumer: str, message: Message, attempts: int, failure: ConsumeFailure
    ) -> ConsumeFailure:
        params = {
            **_message_params(message),
            "consumer": consumer,
            "attempts": attempts,
            "delay": float(failure.retry_in or 0.0),
            "reason": failure.reason,
            "state": "dead" if failure.retry_in is None else "retrying",
        }
        await self.execute(self.q["inbox_failure_insert"], params)
        if failure.retry_in is not None:  # the inbox row outlives a pending failure
            await self.execute(self.q["inbox_hold"], {"consumer": consumer, "id": message.id})
        return failure

    async def dead_letter(self, message: Message, attempts: int, reason: str) -> None:
        params = {
            **_message_params(message),
            "reason": failure_reason(reason),
            "attempts": attempts,
        }
        await self.execute(self.q["inbox_dead_letter"], params)

    async def lock_failure(self, consumer: str, message_id: str) -> PendingFailure | None:
        # BEGIN IMMEDIATE (this transaction) already excludes every other writer.
        rows = await self.fetch(
            self.q["inbox_failure_lock"], {"consumer": consumer, "id": message_id}
        )
        if not rows:
            return None
        return pending_failure_from_row(rows[0])

    async def delete_failure(self, seq: int) -> None:
        await self.execute(self.q["inbox_failure_delete"], {"seq": seq})

    async def update_failure(self, seq: int, attempts: int, failure: ConsumeFailure) -> None:
        update = {"seq": seq, "attempts": attempts, "reason": failure.reason}
        if failure.retry_in is None:
            await self.execute(self.q["inbox_failure_dead"], update)
            return
        params = {**update, "delay": float(failure.retry_in)}
        await self.execute(self.q["inbox_failure_retry"], params)

    async def set_done(self, consumer: str, message_id: str, retention: float) -> None:
        params = {"consumer": consumer, "id": message_id, "retention": retention}
        await self.execute(self.q["inbox_set_done"], params)


class SqliteInbox(SqlitePart, SqlInbox):
    """The inbox port (:class:`~outboxer.ports.InboxStore`) on SQLite."""

    Session = _Session


def _message_params(message: Message) -> dict[str, Any]:
    return {
        **envelope_of(message),
        "headers": encode_headers(message.headers),
        "created_at": message.created_at.timestamp(),
    }
