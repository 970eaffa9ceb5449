"""The consume state machine, written once for every store.

What becomes of a delivery (duplicate, handled, waiting behind its key, retrying, dead) and of
a re-drive is decided here, against the SQL primitives of
:class:`~outboxer.ports.InboxTransaction`; PostgreSQL, SQLite, MySQL and the in-memory fake
supply only those primitives. This module imports no driver.

A batch of first deliveries, in one transaction::

    receive(batch) ── one round trip records every (consumer, id) or finds it there
    for each message, in batch order:
       ├ repeated in the batch, or not fresh ─────────────────────────────▶ duplicate
       ├ blocked (key failing, before or earlier in the batch) ─ record_failure(0) ▶ waiting
       └ run_handler (in a savepoint when it may write) ─ ok ─────────────▶ handled
                                                        └ error ─ record_failure ─ retry ▶ retrying
                                                                               └ dead_letter ▶ dead
    commit; only then are the outcomes returned (and the broker acknowledged by the caller)

A failing handler is rolled back to its own savepoint: the other messages of the batch keep
their effects and their outcomes, and nothing is redelivered. A crash before the commit loses
the whole transaction, so the broker delivers the batch again and it is consumed afresh; a
crash after the commit but before the acknowledgement makes the redelivery duplicates.

A re-drive takes one due failure (``lock_failure``), runs the handler again with the next
attempt number, and forgets the failure, updates it, or gives up on it; one transaction each.

A handler that commits, rolls back or closes ``ctx.connection`` (the inbox's transaction) is a
bug that retrying cannot cure: :class:`~outboxer.errors.HandlerEndedTransaction` is raised and
stops the consumer, after the inbox rows of the batch's later messages, never handled, are
forgotten (a commit had committed them), so that the broker's redelivery handles them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from outboxer.errors import HandlerEndedTransaction, StoreError
from outboxer.message import Message, received
from outboxer.ports import (
    ConsumeFailure,
    ConsumeOutcome,
    FailurePolicy,
    InboxHandler,
    InboxReceipt,
    InboxStore,
    InboxTransaction,
)

__all__ = ["consume", "redrive_consume_failures"]

log = logging.getLogger("outboxer.inbox")


def _handled_here(message: Message) -> Exception | None:
    return None


def _always(message: Message) -> bool:
    return True


async def consume(
    store: InboxStore,
    consumer: str,
    messages: Sequence[Message],
    handler: InboxHandler,
    *,
    on_failure: FailurePolicy,
    retention_seconds: float,
    single_transaction: bool = True,
    may_write: Callable[[Message], bool] = _always,
) -> list[ConsumeOutcome]:
    """Run ``handler`` for messages delivered by the broker, at most once per consumer.

    All messages in one transaction (``single_transaction``, the default: one round trip
    records the whole batch in the inbox, one commits it), or one transaction each; either
    way in the given order (the caller passes the messages of one key in delivery order), on
    one connection that the handler gets. Returns one outcome per message once all are
    committed, so the caller may then acknowledge them to the broker. A handler exception is
    not raised: it is recorded (``retrying``/``dead``). Text no database keeps (NUL, a lone
    surrogate: any client can publish them) is stored and handled as U+FFFD, see
    :func:`~outboxer.message.received`.

    Args:
        may_write: Whether the handler of a message may write through the connection (it
            takes the context); only those run in a savepoint, the others cost no round trip.

    Raises:
        StoreError: the database failed; the outcomes of some messages may be committed, the
            others not: acknowledge none of them (redelivered messages that were committed
            are duplicates then).
        HandlerEndedTransaction: a handler committed, rolled back or closed the connection;
            acknowledge nothing. After a commit, what came before it in its transaction (and
            its own inbox row) stays committed; the messages after it are not recorded.
    """
    retention = float(retention_seconds)
    messages = [received(message) for message in messages]
    batches = [messages] if single_transaction else [[message] for message in messages]
    outcomes: list[ConsumeOutcome] = []
    async with store.inbox_session() as session:
        for batch in batches:
            async with session.transaction() as tx:
                outcomes += await _deliver(
                    tx, consumer, batch, handler, on_failure, retention, may_write
                )
    return outcomes


async def _deliver(
    tx: InboxTransaction,
    consumer: str,
    messages: Sequence[Message],
    handler: InboxHandler,
    on_failure: FailurePolicy,
    retention: float,
    may_write: Callable[[Message], bool],
) -> list[ConsumeOutcome]:
    """First deliveries, in the caller's transaction."""
    first: dict[str, Message] = {}
    for message in messages:
        first.setdefault(message.id, message)  # a repeat within the batch is a duplicate
    received: Sequence[InboxReceipt | None] = await tx.receive(
        consumer, list(first.values()), retention
    )
    if len(first) < len(messages):  # only the first of a repeated id has a receipt
        receipts = dict(zip(first, received, strict=True))
        received = [receipts.pop(message.id, None) for message in messages]
    failing_keys: set[str] = set()  # keys that got a failure in this batch
    outcomes: list[ConsumeOutcome] = []
    run_handler = tx.run_handler
    for message, receipt in zip(messages, received, strict=True):
        if receipt is None or not receipt.fresh:
            outcomes.append("duplicate")
            continue
        if receipt.blocked or message.key in failing_keys:
            # A failure blocks its own key: this message is stored and re-driven after it.
            reason = f"waiting behind an earlier failed message of key {message.key!r}"
            waiting = ConsumeFailure(reason, 0.0)
            stored = await tx.record_failure(consumer, message, 0, waiting)
            outcome: ConsumeOutcome = "waiting"
            if stored.retry_in is None:  # the store could not keep it (see record_failure)
                await tx.dead_letter(message, 0, stored.reason)
                outcome = "dead"
        else:
            # The first attempt, written inline: this loop runs once per delivered message.
            try:
                error = await run_handler(handler, message, 1, isolated=may_write(message))
            except HandlerEndedTransaction as exc:
                await _forget_later(tx, consumer, messages, received, message, exc)
                raise
            if error is None:
                outcomes.append("handled")
                continue
            outcome = await _first_failure(tx, consumer, message, error, on_failure)
        if outcome in ("waiting", "retrying") and message.key is not None:
            failing_keys.add(message.key)
        outcomes.append(outcome)
    return outcomes


async def _forget_later(
    tx: InboxTransaction,
    consumer: str,
    messages: Sequence[Message],
    received: Sequence[InboxReceipt | None],
    offender: Message,
    ended: HandlerEndedTransaction,
) -> None:
    """The handler of ``offender`` ended the transaction: the messages after it that got a
    fresh inbox row were recorded but never handled. If it committed, their rows are committed
    and their redelivery would be duplicates: forget them (after a rollback this deletes
    nothing). The messages before it and its own keep what the commit gave them."""
    position = next(i for i, m in enumerate(messages) if m is offender)
    later = [
        m.id
        for m, receipt in zip(messages[position + 1 :], received[position + 1 :], strict=True)
        if receipt is not None and receipt.fresh
    ]
    if not later:
        return
    if ended.closed:
        log.error(
            "the handler of message %s closed the inbox's connection: the inbox rows of the %d "
            "message(s) after it in its batch, recorded but never handled, could not be "
            "forgotten if they were committed (a redelivery then takes them for duplicates): %s",
            offender.id,
            len(later),
            ", ".join(later),
            extra={"message_ids": later},
        )
        return
    try:
        await tx.forget_received(consumer, later)
    except StoreError as exc:
        log.error(
            "the handler of message %s ended the inbox's transaction; forgetting the inbox rows "
            "of the %d message(s) after it, never handled, failed (%s): if they were committed, "
            "a redelivery takes them for duplicates: %s",
            offender.id,
            len(later),
            exc,
            ", ".join(later),
            extra={"message_ids": later},
        )


async def _first_failure(
    tx: InboxTransaction,
    consumer: str,
    message: Message,
    error: Exception,
    on_failure: FailurePolicy,
) -> ConsumeOutcome:
    failure = await tx.record_failure(consumer, message, 1, on_failure(message, 1, error))
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
    may_write: Callable[[Message], bool] = _always,
    not_here: Callable[[Message], Exception | None] = _handled_here,
) -> list[ConsumeOutcome]:
    """Run ``handler`` again for up to ``limit`` failed consumptions that are due, oldest
    first, each message of a key once nothing earlier of it is left; one transaction each.

    ``not_here(message)`` is the error of an attempt this instance cannot make, having no
    handler for the message (a rolling deploy, an instance started with other handlers): a
    failed attempt like any other (retried, at last a dead letter that says so, so that its
    key is not blocked for good), never taken for handled."""
    retention = float(retention_seconds)
    outcomes: list[ConsumeOutcome] = []
    async with store.inbox_session() as session:
        for message_id in await session.due_failures(consumer, limit):
            async with session.transaction() as tx:
                outcome = await _redrive(
                    tx, consumer, message_id, handler, on_failure, retention, may_write, not_here
                )
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
    may_write: Callable[[Message], bool],
    not_here: Callable[[Message], Exception | None],
) -> ConsumeOutcome | None:
    # The lock is the re-drive's ownership: held until this transaction ends.
    pending = await tx.lock_failure(consumer, message_id)
    if pending is None:  # taken by another instance, or no longer due
        return None
    if pending.handled:
        await tx.delete_failure(pending.seq)
        return "duplicate"
    message, attempt = pending.message, pending.attempts + 1
    # A handler that ends the transaction raises HandlerEndedTransaction here: the failure row
    # stays (what the handler committed may repeat once when it is re-driven after a restart).
    error = not_here(message) or await tx.run_handler(
        handler, message, attempt, isolated=may_write(message)
    )
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
