"""The inbox's SQL on MySQL: the primitives :mod:`outboxer.inbox.consume` runs.

Handlers get the asyncmy connection of the inbox transaction, so their writes commit with the
inbox row. Two kinds of transaction, as on PostgreSQL (``stores/postgres/inbox.py``):

- one per message (:class:`_MessageTransaction`): the handler runs in a savepoint;
- one per chunk (:class:`_BatchTransaction`): a savepoint is open before each message's inbox
  row and, after a successful handler, released and the next one opened in one round trip. A
  failing handler is rolled back to the savepoint, which undoes its inbox row too, so the
  failure path inserts the row again.

Unlike PostgreSQL, MySQL does not abort a transaction in which a statement failed, so a handler
that swallowed a database error leaves a usable transaction; its savepoint is still released
explicitly, which fails if the handler ended the transaction (a COMMIT, or DDL).
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
from outboxer.stores.mysql.connection import Conn, MysqlPart, execute, fetch_one, fetch_value
from outboxer.stores.mysql.relay import micros, text_row, utc

__all__ = ["MysqlInbox"]

#: Releases the savepoint of one message and opens the next one's, in one round trip.
_RENEW_SAVEPOINT = "RELEASE SAVEPOINT outboxer_message; SAVEPOINT outboxer_message"


class MysqlInbox(MysqlPart):
    """The inbox port (:class:`~outboxer.ports.InboxStore`) on MySQL."""

    @contextlib.asynccontextmanager
    async def inbox_session(self) -> AsyncIterator[_Session]:
        async with self.db.connection() as conn:
            yield _Session(self, conn)


class _Session:
    """One pooled connection for a chunk of deliveries or a round of re-drives."""

    def __init__(self, part: MysqlPart, conn: Conn) -> None:
        self._part = part
        self._conn = conn
        self._q = part.q

    @contextlib.asynccontextmanager
    async def _transaction(self, begin: str) -> AsyncIterator[None]:
        with self._part.db.translated_errors():
            await execute(self._conn, begin)
            try:
                yield
            except BaseException:
                with contextlib.suppress(Exception):
                    await execute(self._conn, "ROLLBACK")
                raise
            await execute(self._conn, "COMMIT")

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[_MessageTransaction]:
        async with self._transaction("START TRANSACTION"):
            yield _MessageTransaction(self._conn, self._q)

    @contextlib.asynccontextmanager
    async def batch_transaction(self) -> AsyncIterator[_BatchTransaction]:
        async with self._transaction("START TRANSACTION; SAVEPOINT outboxer_message"):
            yield _BatchTransaction(self._conn, self._q)

    async def due_failures(self, consumer: str, limit: int) -> list[str]:
        with self._part.db.translated_errors():
            async with self._conn.cursor() as cur:
                await cur.execute(self._q["inbox_due"], {"consumer": consumer, "limit": limit})
                return [bytes(row[0]).decode() for row in await cur.fetchall()]

    async def count_retries(self, count: int) -> None:
        with self._part.db.translated_errors():
            await execute(self._conn, self._q["inbox_count_retries"], {"count": count})


def _message_args(message: Message) -> dict[str, Any]:
    return {
        "id": message.id,
        "topic": message.topic,
        "key": message.key,
        "type": message.type,
        "payload": message.payload,
        "content_type": message.content_type,
        "headers": encode_headers(message.headers),
        "created_at": utc(message.created_at),
    }


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
            args = {
                "consumer": consumer,
                "id": message.id,
                "key": message.key,
                "retention_us": micros(retention),
            }
            row = await fetch_one(self._conn, self._q["inbox_receive"], args)
            assert row is not None  # a SELECT of two expressions always returns a row
            receipts.append(InboxReceipt(fresh=bool(row["fresh"]), blocked=bool(row["blocked"])))
        return receipts

    async def run_handler(
        self, handler: InboxHandler, message: Message, attempt: int
    ) -> Exception | None:
        """Run the handler inside a savepoint; return its exception after undoing its writes."""
        await execute(self._conn, "SAVEPOINT outboxer_handler")
        try:
            await handler(message, self._conn, attempt)
            await execute(self._conn, "RELEASE SAVEPOINT outboxer_handler")
        except Exception as exc:  # noqa: BLE001 - the handler's failure is the message's
            await execute(self._conn, "ROLLBACK TO SAVEPOINT outboxer_handler")
            return exc
        return None

    async def keep_inbox_row(
        self, consumer: str, message_id: str, expires_in: float | None
    ) -> bool:
        # The row written by receive survived the handler's savepoint; a pending retry keeps
        # it until the failure is resolved (a dead letter keeps its retention expiry).
        if expires_in is None:
            args = {"consumer": consumer, "id": message_id}
            await execute(self._conn, self._q["inbox_set_retrying"], args)
        return True

    async def end_message(self) -> None:
        return None

    async def record_failure(
        self, consumer: str, message: Message, attempts: int, failure: ConsumeFailure
    ) -> None:
        args = {
            **_message_args(message),
            "consumer": consumer,
            "attempts": attempts,
            "retry_us": micros(failure.retry_in or 0.0),
            "reason": failure.reason,
            "state": "dead" if failure.retry_in is None else "retrying",
        }
        await execute(self._conn, self._q["inbox_failure_insert"], args)

    async def dead_letter(self, message: Message, attempts: int, reason: str) -> None:
        args = {**_message_args(message), "attempts": attempts, "reason": failure_reason(reason)}
        await execute(self._conn, self._q["inbox_dead_letter"], args)

    async def lock_failure(self, consumer: str, message_id: str) -> PendingFailure | None:
        args = {"consumer": consumer, "id": message_id}
        row = await fetch_one(self._conn, self._q["inbox_failure_lock"], args)
        if row is None:
            return None
        handled = await fetch_value(self._conn, self._q["inbox_handled"], args)
        return PendingFailure(
            seq=int(row["seq"]),
            message=message_from_row(text_row(row)),
            attempts=int(row["consume_attempts"]),
            handled=bool(handled),
        )

    async def delete_failure(self, seq: int) -> None:
        await execute(self._conn, self._q["inbox_failure_delete"], {"seq": seq})

    async def update_failure(self, seq: int, attempts: int, failure: ConsumeFailure) -> None:
        args: dict[str, Any] = {"seq": seq, "attempts": attempts, "reason": failure.reason}
        if failure.retry_in is None:
            await execute(self._conn, self._q["inbox_failure_dead"], args)
            return
        args["retry_us"] = micros(failure.retry_in)
        await execute(self._conn, self._q["inbox_failure_retry"], args)

    async def set_done(self, consumer: str, message_id: str, retention: float) -> None:
        args = {"consumer": consumer, "id": message_id, "retention_us": micros(retention)}
        await execute(self._conn, self._q["inbox_set_done"], args)


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
            await execute(self._conn, _RENEW_SAVEPOINT)
        except Exception as exc:  # noqa: BLE001 - the handler's failure is the message's
            await execute(self._conn, "ROLLBACK TO SAVEPOINT outboxer_message")
            return exc
        self._renewed = True
        return None

    async def keep_inbox_row(
        self, consumer: str, message_id: str, expires_in: float | None
    ) -> bool:
        # The rollback undid the inbox row: insert it again (no expiry while a retry is
        # pending). If it exists now, another instance handled the message meanwhile.
        args = {
            "consumer": consumer,
            "id": message_id,
            "retention_us": micros(expires_in) if expires_in is not None else None,
        }
        return await execute(self._conn, self._q["inbox_insert_again"], args) == 1

    async def end_message(self) -> None:
        if not self._renewed:
            await execute(self._conn, _RENEW_SAVEPOINT)
        self._renewed = False
