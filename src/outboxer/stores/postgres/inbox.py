"""The inbox's SQL on PostgreSQL: the primitives :mod:`outboxer.inbox.consume` runs.

Handlers get the asyncpg connection of the inbox transaction, so their writes commit with the
inbox row. The transaction and the handler savepoints are ``stores._common.SqlInboxSession``'s;
a batch of deliveries is recorded by one ``INSERT … SELECT`` over its ids and keys (two JSON
arrays).

A batch is new but for rare redeliveries, so on the store's own connections it is first
recorded by a plain ``INSERT`` that goes with the transaction's ``BEGIN`` and the handlers'
first ``SAVEPOINT`` in one round trip (``inbox_receive_at_begin``, a server-side prepared
statement run by ``EXECUTE`` in the simple protocol): with ``COMMIT`` that makes two round
trips a batch instead of four. The simple protocol returns no rows, so the statement answers
by failing: a message recorded already breaks the primary key, a message whose key waits
behind a failure fails on purpose. Then the transaction is rolled back and begun again and the
batch recorded with ``ON CONFLICT DO NOTHING`` (``inbox_receive``), which answers in one row;
so are the batches of the next minute (:data:`REDELIVERY_WINDOW`). The speculative insertion
of ``ON CONFLICT`` (a pre-check of the index, a speculative lock and a confirmation record in
the WAL per row) cost ≈ 30 % of the server's CPU for a row (≈ 4.5 of 15.5 µs on the development
VM, batches of 100).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
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
from outboxer.stores._common import (
    HANDLER_SAVEPOINT,
    Row,
    SqlInbox,
    SqlInboxSession,
    pending_failure_from_row,
)
from outboxer.stores.postgres.connection import (
    CountingConnection,
    PlanWatch,
    PostgresPart,
    skip_reset,
    statement_counter,
)

__all__ = ["PostgresInbox"]


#: After a batch met a message recorded already, batches are recorded with ``ON CONFLICT`` for
#: this long: redeliveries come in runs (a consumer's restart, a rebalance), and each plain
#: INSERT that fails costs two round trips and an error line in the server's log.
REDELIVERY_WINDOW = 60.0

#: At most this often, a chunk of deliveries first checks the inbox's tables' sizes
#: (:class:`PlanWatch`: one round trip, on the connection the chunk holds anyway): failures
#: pile up fast in an outage, and a batch's check of its keys' failures planned on an empty
#: table read all of them for each message.
PLAN_CHECK_SECONDS = 1.0


class _Session(SqlInboxSession):
    """A pooled asyncpg connection, held for a chunk of deliveries or a round of re-drives."""

    #: Until when (``time.monotonic()``) this process records batches with ``ON CONFLICT``.
    plain_insert_from: ClassVar[float] = 0.0

    def __init__(self, connection: Any, queries: Mapping[str, str]) -> None:
        super().__init__(connection, queries)
        self._count = statement_counter(connection)
        raw = getattr(connection, "_con", connection)  # behind the pool's proxy
        #: The connection itself: the proxy is detached from it when it is closed.
        self._raw: asyncpg.Connection = raw
        #: The store's own connection class, which can hold a ``BEGIN`` back and knows whether
        #: it was closed on purpose; ``None`` for a borrowed pool's connections.
        self._own = raw if isinstance(raw, CountingConnection) else None
        # The transaction status of the server's last ReadyForQuery, which asyncpg keeps
        # (bound once: the check runs after every handler that takes the context).
        self._status = raw.is_in_transaction

    @contextlib.asynccontextmanager
    async def _begin(self) -> AsyncIterator[object]:
        own = self._own
        if own is not None:
            own.defer_begin()  # sent with the first statement (see _owed_begin)
        try:
            async with self.connection.transaction() as transaction:
                yield transaction
        finally:
            if own is not None:
                own.defer_begin(False)

    def _owed_begin(self) -> bool:
        """Whether the transaction's ``BEGIN`` is still to be sent (it is the caller's now)."""
        own = self._own
        if own is None or not own.begin_pending:
            return False
        own.begin_pending = False
        return True

    async def _run(self, sql: str, args: Any) -> None:
        if self._owed_begin():
            if args:
                await self.connection.execute("BEGIN")
            else:
                sql = f"BEGIN; {sql}"
        # Without arguments asyncpg sends the simple protocol: several statements, one trip.
        await self.connection.execute(sql, *(args or ()))

    async def _rows(self, sql: str, args: Any) -> Sequence[Row]:
        if self._owed_begin():
            await self.connection.execute("BEGIN")
        return await self.connection.fetch(sql, *args)  # type: ignore[no-any-return]

    def _statements(self) -> int | None:
        return None if self._count is None else self._count()

    def _in_transaction(self) -> bool | None:
        # Handlers run after ``receive`` or ``lock_failure``, which sent the ``BEGIN``. A
        # connection the server dropped keeps its last status (in a transaction): the next
        # statement fails as an outage, as it should.
        own = self._own
        if own is None:  # a borrowed pool's: a close by the handler reads as an outage
            return None if self._raw.is_closed() else bool(self._status())
        return not own.closed_by_client and bool(self._status())

    def _connection_closed(self) -> bool:
        return bool(self._raw.is_closed())

    def _savepoint_missing(self, error: Exception) -> bool:
        return isinstance(error, asyncpg.InvalidSavepointSpecificationError)

    def _forget_args(self, consumer: str, message_ids: Sequence[str]) -> Any:
        return (consumer, list(message_ids))

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
        own = self._own
        if (
            own is not None
            and own.begin_pending
            and time.monotonic() >= self.plain_insert_from
            and await self._receive_at_begin(own, args)
        ):
            return [FRESH_RECEIPT] * len(ids)
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

    async def _receive_at_begin(self, own: CountingConnection, args: tuple[Any, ...]) -> bool:
        """``BEGIN``, the plain ``INSERT`` of ``inbox_receive_at_begin`` and the handlers'
        ``SAVEPOINT`` in one round trip; ``True`` if that recorded every message, none of
        them behind a failing key. Else the transaction is begun again (``False``)."""
        sql = self.q["inbox_receive_at_begin"]
        name = _prepared_name(sql)
        execute = f"EXECUTE {name}({', '.join(map(_literal, args))})"
        trip = f"BEGIN; {execute}; SAVEPOINT {HANDLER_SAVEPOINT}"
        stale = ""
        if own.prepared_epoch != PlanWatch.drops:  # planned before a table grew: again
            stale = "".join(f"DEALLOCATE {each}; " for each in sorted(own.prepared))
            own.prepared.clear()
            own.prepared_epoch = PlanWatch.drops
        if name not in own.prepared:
            trip = f"{stale}PREPARE {name}(text, json, json, float8) AS {sql}; {trip}"
        own.begin_pending = False
        self._savepoint_clean = False
        try:
            await self.connection.execute(trip)
        except (asyncpg.PostgresError, UnicodeError) as exc:
            if isinstance(exc, asyncpg.InvalidSQLStatementNameError):
                own.prepared.discard(name)  # deallocated (DISCARD ALL, say): prepared again
            elif isinstance(exc, asyncpg.DuplicatePreparedStatementError):
                own.prepared.add(name)
            else:  # a message there already, a blocked key: redeliveries come in runs
                _Session.plain_insert_from = time.monotonic() + REDELIVERY_WINDOW
            # The failure answers for the whole batch: it was the transaction's first
            # statement, rolling back loses nothing. asyncpg's transaction object commits or
            # rolls back whichever transaction is open when the block ends.
            rollback = "ROLLBACK; " if own.is_in_transaction() else ""
            await self.connection.execute(f"{rollback}BEGIN")
            return False
        own.prepared.add(name)
        self._savepoint_clean = True
        return True

    async def record_failure(
        self, consumer: str, message: Message, attempts: int, failure: ConsumeFailure
    ) -> ConsumeFailure:
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
        return failure

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

    @contextlib.asynccontextmanager
    async def inbox_session(self) -> AsyncIterator[_Session]:
        async with self.Session.held(self.db.connection(), self.q) as session:
            await self.inbox_plans.check(session.connection, every=PLAN_CHECK_SECONDS)
            yield session


@functools.cache
def _prepared_name(sql: str) -> str:
    """The name of ``sql`` prepared on a connection: one per text, for a pool shared by stores
    of different schemas."""
    return f"outboxer_receive_{hashlib.sha1(sql.encode()).hexdigest()[:16]}"


def _literal(value: object) -> str:
    """``value``'s text as an SQL string literal (``E''`` syntax: backslashes are escaped
    whatever ``standard_conforming_strings`` says)."""
    text = str(value).replace("\\", "\\\\").replace("'", "''")
    return f"E'{text}'"


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
