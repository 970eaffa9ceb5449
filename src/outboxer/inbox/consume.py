"""The consume state machine, written once for every store.

What becomes of a delivery (duplicate, handled, waiting behind its key, retrying, dead) and of
a re-drive is decided here, against the SQL primitives of
:class:`~outboxer.ports.InboxTransaction`; PostgreSQL, SQLite and the in-memory fake supply
only those primitives. This module imports no driver.

A first delivery, in its transaction::

    receive ─ duplicate ────────────────────────────────────────────────▶ duplicate
       │ fresh, blocked ─ record_failure(attempts 0) ───────────────────▶ waiting
       │ fresh ─ run_handler ─ ok ──────────────────────────────────────▶ handled
       │                     └ error ─ keep_inbox_row ─ no ─────────────▶ duplicate
       │                                   └ record_failure ─ retry ────▶ retrying
       │                                                    └ dead_letter ▶ dead

A re-drive takes one due failure (``lock_failure``), runs the handler again with the next
attempt number, and forgets the failure, updates it, or gives up on it.
"""

from __future__ import annotations

from collections.abc import Sequence

from outboxer.message import Message
from outboxer.ports import (
    ConsumeFailure,
    ConsumeOutcome,
    FailurePolicy,
    InboxHandler,
    InboxStore,
    InboxTransaction,
)

__all__ = ["consume", "redrive_consume_failures"]


async def consume(
    store: InboxStore,
    consumer: str,
    messages: Sequence[Message],
    handler: InboxHandler,
    *,
    on_failure: FailurePolicy,
    retention_seconds: float,
    single_transaction: bool = False,
) -> list[ConsumeOutcome]:
    """Run ``handler`` for messages delivered by the broker, at most once per consumer.

    One transaction per message, in the given order (the caller passes messages of one key in
    delivery order), or with ``single_transaction`` one for all of them (fewer round trips;
    each message still has a savepoint, so a failing handler undoes only its own writes), all
    on one connection that the handler gets. Returns one outcome per message once all are
    committed, so the caller may then acknowledge them to the broker. A handler exception is
    not raised: it is recorded (``retrying``/``dead``).

    Raises:
        StoreError: the database failed; the outcomes of some messages may be committed, the
            others not: acknowledge none of them (redelivered messages that were committed
            are duplicates then).
    """
    retention = float(retention_seconds)
    async with store.inbox_session() as session:
        if single_transaction:
            async with session.batch_transaction() as tx:
                return [
                    await _deliver(tx, consumer, message, handler, on_failure, retention)
                    for message in messages
                ]
        outcomes: list[ConsumeOutcome] = []
        for message in messages:
            async with session.transaction() as tx:
                outcomes.append(
                    await _deliver(tx, consumer, message, handler, on_failure, retention)
                )
        return outcomes


async def _deliver(
    tx: InboxTransaction,
    consumer: str,
    message: Message,
    handler: InboxHandler,
    on_failure: FailurePolicy,
    retention: float,
) -> ConsumeOutcome:
    """One first delivery, in the caller's transaction."""
    [receipt] = await tx.receive(consumer, [message], retention)
    if not receipt.fresh:
        return "duplicate"
    if receipt.blocked:
        # A failure blocks its own key: this message is stored and re-driven after it.
        reason = f"waiting behind an earlier failed message of key {message.key!r}"
        await tx.record_failure(consumer, message, 0, ConsumeFailure(reason, 0.0))
        outcome: ConsumeOutcome = "waiting"
    else:
        outcome = await _first_attempt(tx, consumer, message, handler, on_failure, retention)
    await tx.end_message()
    return outcome


async def _first_attempt(
    tx: InboxTransaction,
    consumer: str,
    message: Message,
    handler: InboxHandler,
    on_failure: FailurePolicy,
    retention: float,
) -> ConsumeOutcome:
    error = await tx.run_handler(handler, message, 1)
    if error is None:
        return "handled"
    failure = on_failure(message, 1, error)
    # While a retry is pending the inbox row never expires: the pair must outlive the failure.
    expires_in = None if failure.retry_in is not None else retention
    if not await tx.keep_inbox_row(consumer, message.id, expires_in):
        return "duplicate"
    await tx.record_failure(consumer, message, 1, failure)
    if failure.retry_in is None:
        await tx.dead_letter(message, 1, failure.reason)
        return "dead"
    return "retrying"


async def redrive_consume_failures(
    store: InboxStore,
    consumer: str,
    handler: InboxHandler,
    *,
    on_failure: FailurePolicy,
    retention_seconds: float,
    limit: int,
) -> list[ConsumeOutcome]:
    """Run ``handler`` again for up to ``limit`` failed consumptions that are due, oldest
    first, only the earliest waiting message of each key; one transaction each."""
    retention = float(retention_seconds)
    outcomes: list[ConsumeOutcome] = []
    async with store.inbox_session() as session:
        for message_id in await session.due_failures(consumer, limit):
            async with session.transaction() as tx:
                outcome = await _redrive(tx, consumer, message_id, handler, on_failure, retention)
            if outcome is not None:
                outcomes.append(outcome)
        attempts = sum(outcome != "duplicate" for outcome in outcomes)
        if attempts:
            await session.count_retries(attempts)
    return outcomes


async def _redrive(
    tx: InboxTransaction,
    consumer: str,
    message_id: str,
    handler: InboxHandler,
    on_failure: FailurePolicy,
    retention: float,
) -> ConsumeOutcome | None:
    # The lock is the re-drive's ownership: held until this transaction ends.
    pending = await tx.lock_failure(consumer, message_id)
    if pending is None:  # taken by another instance, or no longer due
        return None
    if pending.handled:
        await tx.delete_failure(pending.seq)
        return "duplicate"
    message, attempt = pending.message, pending.attempts + 1
    error = await tx.run_handler(handler, message, attempt)
    if error is None:
        await tx.delete_failure(pending.seq)
        await tx.set_done(consumer, message_id, retention)
        return "handled"
    failure = on_failure(message, attempt, error)
    await tx.update_failure(pending.seq, attempt, failure)
    if failure.retry_in is not None:
        return "retrying"
    await tx.set_done(consumer, message_id, retention)
    await tx.dead_letter(message, attempt, failure.reason)
    return "dead"
