"""The inbox's SQL on SQLite: the primitives :mod:`outboxer.inbox.consume` runs.

Handlers get the aiosqlite connection of the inbox transaction, so their writes commit with the
inbox row. SQLite has one writer: a session holds the store's connection, one ``BEGIN
IMMEDIATE`` transaction per message (or one for a chunk); either way each handler runs in its
own savepoint.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import aiosqlite

from outboxer.message import Message, encode_headers
from outboxer.ports import (
    ConsumeFailure,
    InboxHandler,
    InboxReceipt,
    PendingFailure,
    failure_reason,
)
from outboxer.stores._common import message_from_row
from outboxer.stores.sqlite.connection import SqlitePart, immediate

__all__ = ["SqliteInbox"]


class SqliteInbox(SqlitePart):
    """The inbox port (:class:`~outboxer.ports.InboxStore`) on SQLite."""

    @contextlib.asynccontextmanager
    async def inbox_session(self) -> AsyncIterator[_Session]:
        async with self.db.connection() as conn:
            yield _Session(conn, self.q)


class _Session:
    """The store's connection, held for a chunk of deliveries or a round of re-drives."""

    def __init__(self, conn: aiosqlite.Connection, q: Mapping[str, str]) -> None:
        self._conn = conn
        self._q = q

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[_Transaction]:
        async with immediate(self._conn):
            yield _Transaction(self._conn, self._q)

    # A chunk in one transaction differs only in where it commits: savepoints are per handler.
    batch_transaction = transaction

    async def due_failures(self, consumer: str, limit: int) -> list[str]:
        params = {"consumer": consumer, "limit": limit}
        async with self._conn.execute(self._q["inbox_due"], params) as cur:
            return [r["message_id"] for r in await cur.fetchall()]

    async def count_retries(self, count: int) -> None:
        await self._conn.execute(self._q["inbox_count_retries"], {"count": count})


class _Transaction:
    """The primitives inside one ``BEGIN IMMEDIATE`` transaction (no other writer)."""

    def __init__(self, conn: aiosqlite.Connection, q: Mapping[str, str]) -> None:
        self._conn = conn
        self._q = q

    async def receive(
        self, consumer: str, messages: Sequence[Message], retention: float
    ) -> list[InboxReceipt]:
        receipts = []
        for message in messages:
            base = {"consumer": consumer, "id": message.id}
            blocked = False
            if message.key is not None:
                keyed = {**base, "key": message.key}
                async with self._conn.execute(self._q["inbox_blocked"], keyed) as cur:
                    row = await cur.fetchone()
                blocked = bool(row is not None and row["blocked"])
            insert = {**base, "blocked": blocked, "retention": retention}
            cursor = await self._conn.execute(self._q["inbox_insert"], insert)
            receipts.append(InboxReceipt(fresh=cursor.rowcount != 0, blocked=blocked))
        return receipts

    async def run_handler(
        self, handler: InboxHandler, message: Message, attempt: int
    ) -> Exception | None:
        """Run the handler inside a savepoint; return its exception after undoing its writes."""
        await self._conn.execute("SAVEPOINT outboxer_handler")
        try:
            await handler(message, self._conn, attempt)
        except Exception as exc:  # noqa: BLE001 - the handler's failure is the message's
            await self._conn.execute("ROLLBACK TO outboxer_handler")
            await self._conn.execute("RELEASE outboxer_handler")
            return exc
        await self._conn.execute("RELEASE outboxer_handler")
        return None

    async def keep_inbox_row(
        self, consumer: str, message_id: str, expires_in: float | None
    ) -> bool:
        # The row written by receive survived the handler's savepoint; a pending retry keeps
        # it until the failure is resolved (a dead letter keeps its retention expiry).
        if expires_in is None:
            params = {"consumer": consumer, "id": message_id}
            await self._conn.execute(self._q["inbox_set_retrying"], params)
        return True

    async def end_message(self) -> None:
        return None

    async def record_failure(
        self, consumer: str, message: Message, attempts: int, failure: ConsumeFailure
    ) -> None:
        params = {
            **_message_params(message),
            "consumer": consumer,
            "attempts": attempts,
            "delay": float(failure.retry_in or 0.0),
            "reason": failure.reason,
            "state": "dead" if failure.retry_in is None else "retrying",
        }
        await self._conn.execute(self._q["inbox_failure_insert"], params)

    async def dead_letter(self, message: Message, attempts: int, reason: str) -> None:
        params = {
            **_message_params(message),
            "reason": failure_reason(reason),
            "attempts": attempts,
        }
        await self._conn.execute(self._q["inbox_dead_letter"], params)

    async def lock_failure(self, consumer: str, message_id: str) -> PendingFailure | None:
        # BEGIN IMMEDIATE (this transaction) already excludes every other writer.
        params = {"consumer": consumer, "id": message_id}
        async with self._conn.execute(self._q["inbox_failure_lock"], params) as cur:
            row = await cur.fetchone()
        if row is None:
            return None
        return PendingFailure(
            seq=row["seq"],
            message=message_from_row(row),
            attempts=row["consume_attempts"],
            handled=bool(row["handled"]),
        )

    async def delete_failure(self, seq: int) -> None:
        await self._conn.execute(self._q["inbox_failure_delete"], {"seq": seq})

    async def update_failure(self, seq: int, attempts: int, failure: ConsumeFailure) -> None:
        update = {"seq": seq, "attempts": attempts, "reason": failure.reason}
        if failure.retry_in is None:
            await self._conn.execute(self._q["inbox_failure_dead"], update)
            return
        params = {**update, "delay": float(failure.retry_in)}
        await self._conn.execute(self._q["inbox_failure_retry"], params)

    async def set_done(self, consumer: str, message_id: str, retention: float) -> None:
        params = {"consumer": consumer, "id": message_id, "retention": retention}
        await self._conn.execute(self._q["inbox_set_done"], params)


def _message_params(message: Message) -> dict[str, Any]:
    return {
        "id": message.id,
        "topic": message.topic,
        "key": message.key,
        "type": message.type,
        "payload": message.payload,
        "content_type": message.content_type,
        "headers": encode_headers(message.headers),
        "created_at": message.created_at.timestamp(),
    }
