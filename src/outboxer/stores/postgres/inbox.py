"""The inbox's SQL on PostgreSQL: the primitives :mod:`outboxer.inbox.consume` runs.

Handlers get the asyncpg connection of the inbox transaction, so their writes commit with the
inbox row. The transaction and the handler savepoints are ``stores._common.SqlInboxSession``'s;
a batch of deliveries is recorded by one ``INSERT … SELECT`` over its ids and keys (two JSON
arrays) that answers in one row: a plain ``INSERT`` first (``inbox_receive_fresh``), since a
batch is new but for rare redeliveries, and ``ON CONFLICT DO NOTHING`` (``inbox_receive``) when
that finds one of the messages there already, and for a minute after
(:data:`REDELIVERY_WINDOW`). The speculative insertion of ``ON CONFLICT`` (a pre-check of the
index, a speculative lock and a confirmation record in the WAL per row) cost ≈ 30 % of the
server's CPU for a row (≈ 4.5 of 15.5 µs on the development VM, batches of 100).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, ClassVar

import asyncpg

from outboxer.message import Message, encode_headers
from outboxer.ports import (
    BLOCKED_RECEIPT,
    DUPLICATE_RECEIPT,
    FRESH_RECEIPT,
    ConsumeFailure,
    InboxReceipt,
    PendingFailure,
    failure_reason,
)
from outboxer.stores._common import Row, SqlInbox, SqlInboxSession, pending_failure_from_row
from outboxer.stores.postgres.connection import PostgresPart, skip_reset, statement_counter

__all__ = ["PostgresInbox"]


#: After a batch met a message recorded already, batches are recorded with ``ON CONFLICT`` for
#: this long: redeliveries come in runs (a consumer's restart, a rebalance), and each plain
#: INSERT that fails costs two round trips and an error line in the server's log.
REDELIVERY_WINDOW = 60.0


class _Session(SqlInboxSession):
    """A pooled asyncpg connection, held for a chunk of deliveries or a round of re-drives."""

    #: The connection's statement count when the open transaction began (``None``: unknown).
    _began_at: int | None = None
    #: Until when (``time.monotonic()``) this process records batches with ``ON CONFLICT``.
    plain_insert_from: ClassVar[float] = 0.0

    def __init__(self, connection: Any, queries: Mapping[str, str]) -> None:
        super().__init__(connection, queries)
        self._count = statement_counter(connection)

    @contextlib.asynccontextmanager
    async def _begin(self) -> AsyncIterator[object]:
        async with self.connection.transaction() as transaction:
            self._began_at = self._statements()
            yield transaction

    async def _run(self, sql: str, args: Any) -> None:
        # Without arguments asyncpg sends the simple protocol: several statements, one trip.
        await self.connection.execute(sql, *(args or ()))

    async def _rows(self, sql: str, args: Any) -> Sequence[Row]:
        return await self.connection.fetch(sql, *args)  # type: ignore[no-any-return]

    def _statements(self) -> int | None:
        return None if self._count is None else self._count()

    def _returning(self, *, untouched: bool) -> None:
        if untouched:
            skip_reset(self.connection)

    async def due_failures(self, consumer: str, limit: int) -> list[str]:
        rows = await self.fetch(self.q["inbox_due"], (consumer, limit))
        return [r["message_id"] for r in rows]

    async def count_retries(self, count: int) -> None:
        await self.execute(self.q["inbox_count_retries"], (count,))

    async def receive(
        self, consumer: str, messages: Sequence[Message], retention: float
    ) -> list[InboxReceipt]:
        ids = [m.id for m in messages]
        # JSON arrays rather than text[]: ten times cheaper to encode (see inbox_receive)
        args = (consumer, _json_list(ids), _json_list([m.key for m in messages]), retention)
        began_at = self._began_at
        if (
            began_at is not None
            and self._statements() == began_at
            and time.monotonic() >= _Session.plain_insert_from
        ):
            # The transaction's first statement: if one of the messages is there already, the
            # plain INSERT fails, and rolling back loses nothing but its own work. A new
            # transaction in the same round trip (asyncpg's transaction object commits or rolls
            # back whichever is open when the block ends), then the statement that takes
            # duplicates in its stride.
            try:
                [row] = await self.fetch(self.q["inbox_receive_fresh"], args)
            except asyncpg.UniqueViolationError:
                _Session.plain_insert_from = time.monotonic() + REDELIVERY_WINDOW
                await self.execute("ROLLBACK; BEGIN", None)
                [row] = await self.fetch(self.q["inbox_receive"], args)
        else:
            [row] = await self.fetch(self.q["inbox_receive"], args)
        fresh, blocked = row["fresh"], row["blocked"]
        if fresh == len(ids) and not blocked:
            return [FRESH_RECEIPT] * fresh  # the common case: all new, none behind a failing key
        inserted = set(ids) if fresh == len(ids) else set(row["inserted"] or ())
        held = set(blocked or ())
        return [
            DUPLICATE_RECEIPT
            if i not in inserted
            else BLOCKED_RECEIPT
            if i in held
            else FRESH_RECEIPT
            for i in ids
        ]

    async def record_failure(
        self, consumer: str, message: Message, attempts: int, failure: ConsumeFailure
    ) -> None:
        await self.execute(
            self.q["inbox_failure_insert"],
            (
                consumer,
                *_message_args(message),
                attempts,
                float(failure.retry_in or 0.0),
                failure.reason,
                "dead" if failure.retry_in is None else "retrying",
            ),
        )

    async def dead_letter(self, message: Message, attempts: int, reason: str) -> None:
        args = (*_message_args(message), failure_reason(reason), attempts)
        await self.execute(self.q["inbox_dead_letter"], args)

    async def lock_failure(self, consumer: str, message_id: str) -> PendingFailure | None:
        rows = await self.fetch(self.q["inbox_failure_lock"], (consumer, message_id))
        if not rows:
            return None
        return pending_failure_from_row(rows[0])

    async def delete_failure(self, seq: int) -> None:
        await self.execute(self.q["inbox_failure_delete"], (seq,))

    async def update_failure(self, seq: int, attempts: int, failure: ConsumeFailure) -> None:
        if failure.retry_in is None:
            await self.execute(self.q["inbox_failure_dead"], (seq, attempts, failure.reason))
            return
        args = (seq, attempts, float(failure.retry_in), failure.reason)
        await self.execute(self.q["inbox_failure_retry"], args)

    async def set_done(self, consumer: str, message_id: str, retention: float) -> None:
        await self.execute(self.q["inbox_set_done"], (consumer, message_id, retention))


class PostgresInbox(PostgresPart, SqlInbox):
    """The inbox port (:class:`~outboxer.ports.InboxStore`) on PostgreSQL."""

    Session = _Session


#: A list of strings (or ``None``) as a JSON array; keeps non-ASCII characters as they are, so
#: a string the database cannot take fails as it would as a text parameter.
_json_list = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


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
