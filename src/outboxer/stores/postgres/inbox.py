"""The inbox's SQL on PostgreSQL: the primitives :mod:`outboxer.inbox.consume` runs.

Handlers get the asyncpg connection of the inbox transaction, so their writes commit with the
inbox row. Two kinds of transaction:

- one per message (:class:`_MessageTransaction`): the handler runs in a savepoint;
- one per chunk (:class:`_BatchTransaction`): a savepoint is open before each message's inbox
  row and, after a successful handler, released and the next one opened in one
  simple-protocol round trip (RELEASE also fails if the handler left the transaction aborted):
  two round trips per handled message. A failing handler is rolled back to the savepoint,
  which undoes its inbox row too, so the failure path inserts the row again.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from outboxer.message import Message, encode_headers
from outboxer.ports import (
    ConsumeFailure,
    InboxHandler,
    InboxReceipt,
    PendingFailure,
    failure_reason,
)
from outboxer.stores._common import message_from_row
from outboxer.stores.postgres.connection import Conn, PostgresPart

__all__ = ["PostgresInbox"]

#: Releases the savepoint of one message and opens the next one's, in one round trip.
_RENEW_SAVEPOINT = "RELEASE SAVEPOINT outboxer_message; SAVEPOINT outboxer_message"


class PostgresInbox(PostgresPart):
    """The inbox port (:class:`~outboxer.ports.InboxStore`) on PostgreSQL."""

    @contextlib.asynccontextmanager
    async def inbox_session(self) -> AsyncIterator[_Session]:
        async with self.db.connection() as conn:
            yield _Session(conn, self.q)


class _Session:
    """One pooled connection for a chunk of deliveries or a round of re-drives."""

    def __init__(self, conn: Conn, q: Mapping[str, str]) -> None:
        self._conn = conn
        self._q = q

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[_MessageTransaction]:
        async with self._conn.transaction():
            yield _MessageTransaction(self._conn, self._q)

    @contextlib.asynccontextmanager
    async def batch_transaction(self) -> AsyncIterator[_BatchTransaction]:
        async with self._conn.transaction():
            await self._conn.execute("SAVEPOINT outboxer_message")
            yield _BatchTransaction(self._conn, self._q)

    async def due_failures(self, consumer: str, limit: int) -> list[str]:
        rows = await self._conn.fetch(self._q["inbox_due"], consumer, limit)
        return [r["message_id"] for r in rows]

    async def count_retries(self, count: int) -> None:
        await self._conn.execute(self._q["inbox_count_retries"], count)


class _MessageTransaction:
    """The primitives in a transaction of one message."""

    def __init__(self, conn: Conn, q: Mapping[str, str]) -> None:
        self._conn = conn
        self._q = q

    async def receive(
        self, consumer: str, messages: Sequence[Message], retention: float
    ) -> list[InboxReceipt]:
        receipts = []
        for message in messages:
            row = await self._conn.fetchrow(
                self._q["inbox_receive"], consumer, message.id, message.key, retention
            )
            assert row is not None  # a SELECT of two expressions always returns a row
            receipts.append(InboxReceipt(fresh=row["fresh"], blocked=row["blocked"]))
        return receipts

    async def run_handler(
        self, handler: InboxHandler, message: Message, attempt: int
    ) -> Exception | None:
        """Run the handler inside a savepoint; return its exception after undoing its writes.

        The savepoint is released explicitly: if the handler swallowed a database error, the
        transaction is aborted and RELEASE fails, which turns into a handler failure here.
        Without it the final COMMIT would silently roll back (PostgreSQL answers COMMIT in an
        aborted transaction with ROLLBACK, no error) and the message would be acknowledged
        with no effect and no inbox row.
        """
        await self._conn.execute("SAVEPOINT outboxer_handler")
        try:
            await handler(message, self._conn, attempt)
            await self._conn.execute("RELEASE SAVEPOINT outboxer_handler")
        except Exception as exc:  # noqa: BLE001 - the handler's failure is the message's
            await self._conn.execute("ROLLBACK TO SAVEPOINT outboxer_handler")
            return exc
        return None

    async def keep_inbox_row(
        self, consumer: str, message_id: str, expires_in: float | None
    ) -> bool:
        # The row written by receive survived the handler's savepoint; a pending retry keeps
        # it until the failure is resolved (a dead letter keeps its retention expiry).
        if expires_in is None:
            await self._conn.execute(self._q["inbox_set_retrying"], consumer, message_id)
        return True

    async def end_message(self) -> None:
        return None

    async def record_failure(
        self, consumer: str, message: Message, attempts: int, failure: ConsumeFailure
    ) -> None:
        await self._conn.execute(
            self._q["inbox_failure_insert"],
            consumer,
            *_message_args(message),
            attempts,
            float(failure.retry_in or 0.0),
            failure.reason,
            "dead" if failure.retry_in is None else "retrying",
        )

    async def dead_letter(self, message: Message, attempts: int, reason: str) -> None:
        await self._conn.execute(
            self._q["inbox_dead_letter"], *_message_args(message), failure_reason(reason), attempts
        )

    async def lock_failure(self, consumer: str, message_id: str) -> PendingFailure | None:
        row = await self._conn.fetchrow(self._q["inbox_failure_lock"], consumer, message_id)
        if row is None:
            return None
        return PendingFailure(
            seq=row["seq"],
            message=message_from_row(row),
            attempts=row["consume_attempts"],
            handled=row["handled"],
        )

    async def delete_failure(self, seq: int) -> None:
        await self._conn.execute(self._q["inbox_failure_delete"], seq)

    async def update_failure(self, seq: int, attempts: int, failure: ConsumeFailure) -> None:
        if failure.retry_in is None:
            await self._conn.execute(self._q["inbox_failure_dead"], seq, attempts, failure.reason)
            return
        await self._conn.execute(
            self._q["inbox_failure_retry"], seq, attempts, float(failure.retry_in), failure.reason
        )

    async def set_done(self, consumer: str, message_id: str, retention: float) -> None:
        await self._conn.execute(self._q["inbox_set_done"], consumer, message_id, retention)


class _BatchTransaction(_MessageTransaction):
    """The primitives in one transaction for many messages, a savepoint per message."""

    def __init__(self, conn: Conn, q: Mapping[str, str]) -> None:
        super().__init__(conn, q)
        self._renewed = False  # the handler's success already opened the next savepoint

    async def run_handler(
        self, handler: InboxHandler, message: Message, attempt: int
    ) -> Exception | None:
        try:
            await handler(message, self._conn, attempt)
            await self._conn.execute(_RENEW_SAVEPOINT)
        except Exception as exc:  # noqa: BLE001 - the handler's failure is the message's
            await self._conn.execute("ROLLBACK TO SAVEPOINT outboxer_message")
            return exc
        self._renewed = True
        return None

    async def keep_inbox_row(
        self, consumer: str, message_id: str, expires_in: float | None
    ) -> bool:
        # The rollback undid the inbox row: insert it again. If it exists now, another
        # instance handled the message meanwhile: nothing to record.
        inserted = await self._conn.fetchval(
            self._q["inbox_insert_again"], consumer, message_id, expires_in
        )
        return bool(inserted)

    async def end_message(self) -> None:
        if not self._renewed:
            await self._conn.execute(_RENEW_SAVEPOINT)
        self._renewed = False


def _message_args(message: Message) -> tuple[Any, ...]:
    """The message's columns, in the order the inbox queries take them."""
    return (
        message.id,
        message.topic,
        message.key,
        message.type,
        message.payload,
        message.content_type,
        encode_headers(message.headers),
        message.created_at,
    )
