"""In-memory fakes for your own tests.

:class:`InMemoryStore` and :class:`RecordingPublisher` implement the same Protocols as the real
adapters (outboxer's own contract tests run against them too), so application code and a real
:class:`~outboxer.relay.Relay` can be exercised without a database or a broker::

    store = InMemoryStore()
    store.enqueue("orders", {"id": 1}, key="1", type="OrderCreated")
    publisher = RecordingPublisher()
    await Relay(store, publisher).drain(timeout=5)
    assert [m.type for m in publisher.messages] == ["OrderCreated"]
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from outboxer import ports
from outboxer.config import LIVE_SECONDS
from outboxer.errors import ConfigurationError, PublishError
from outboxer.message import Message
from outboxer.outbox import Outbox
from outboxer.ports import (
    Claim,
    ClaimRequest,
    ConsumeFailure,
    ConsumerFailures,
    DeadLetter,
    DeadLetterFilter,
    DeadLetterPage,
    InboxHandler,
    InboxReceipt,
    MessageFilter,
    MessagePage,
    MessageState,
    OutboxMessage,
    OutboxStats,
    PendingFailure,
    Publisher,
    RelayInfo,
    Settlement,
    Store,
    SweepReport,
    failure_reason,
)
from outboxer.stores._common import (
    check_limit,
    decode_headers,
    envelope_of,
    message_not_found,
    parse_cursor,
    unique,
    wait_for_doorbell,
)

__all__ = ["InMemoryStore", "RecordingPublisher"]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(slots=True)
class _Row:
    seq: int
    message: Message
    available_at: dt.datetime
    token: int | None = None
    locked_by: str | None = None
    locked_until: dt.datetime | None = None
    last_error: str | None = None
    #: Crash isolation: how often its lease expired, and how often while it was claimed alone.
    lease_expiries: int = 0
    solo_deaths: int = 0
    locked_alone: bool = False


def _suspect_head(
    rows: Sequence[_Row], now: dt.datetime, *, ordered: bool, held: set[str]
) -> _Row | None:
    """The first free suspect (a row whose lease expired) that heads its key (in ordered mode)
    and whose key is not held behind a dead letter."""
    heads: set[str] = set()
    for row in rows:
        key = row.message.key
        head = key is None or key not in heads
        if key is not None:
            heads.add(key)
        free = row.token is None and row.available_at <= now
        if row.lease_expiries and free and (head or not ordered) and key not in held:
            return row
    return None


_Listed = TypeVar("_Listed", DeadLetter, OutboxMessage)


def _within_budget(found: list[tuple[int, _Listed]], limit: int) -> list[tuple[int, _Listed]]:
    """The page of ``found`` (in page order) as the SQL stores cut it: up to ``limit`` rows,
    ending early once the payloads before a row reach :data:`outboxer.ports.PAGE_PAYLOAD_BYTES`
    (the first row always comes)."""
    page: list[tuple[int, _Listed]] = []
    before = 0
    for seq, item in found[:limit]:
        if page and before >= ports.PAGE_PAYLOAD_BYTES:
            break
        page.append((seq, item))
        before += len(item.payload)
    return page


def _claimable(
    rows: Sequence[_Row],
    now: dt.datetime,
    *,
    ordered: bool,
    held: set[str],
    limit: int,
    behind: frozenset[int] = frozenset(),
) -> list[_Row]:
    """Up to ``limit`` free rows in write order; in ordered mode none behind an older row of its
    key that is leased (except under a token of ``behind``), waiting or suspect, and none of a
    key held behind a dead letter."""
    claimed: list[_Row] = []
    blocked: set[str] = set()
    for row in rows:
        if len(claimed) >= limit:
            break
        key = row.message.key
        if row.token is not None or row.available_at > now or row.lease_expiries:
            if key is not None and row.token not in behind:
                blocked.add(key)
            continue
        if key is not None and (key in held or (ordered and key in blocked)):
            continue
        claimed.append(row)
    return claimed


class InMemoryStore:
    """A :class:`~outboxer.ports.Store` in a dict, with the PostgreSQL store's semantics.

    It offers every port a store has except schema management (there is no schema): the relay's,
    the sweeper's, the operators' and the inbox's primitives, which the same consume state
    machine (:mod:`outboxer.inbox.consume`) drives as on a database.

    Args:
        clock: The current time, for leases, retry delays and ages (default: the wall clock;
            ``tests/simulation`` passes the virtual time of its event loop).
    """

    def __init__(self, clock: Callable[[], dt.datetime] = _now) -> None:
        self._clock = clock
        self._rows: dict[str, _Row] = {}
        #: By (id, direction): an id may have a publish and a consume dead letter.
        self._dead: dict[tuple[str, str], tuple[int, DeadLetter]] = {}
        self._relays: dict[str, RelayInfo] = {}
        self._last_sweep: SweepReport | None = None
        self._publish_retries_since_sweep = 0
        self._seq = 0
        self._doorbell = asyncio.Event()
        self._outbox = Outbox()
        self._inbox = _Inbox()

    async def __aenter__(self) -> InMemoryStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    def enqueue(self, topic: str, payload: object, **options: Any) -> str:
        """Add a message as ``outboxer.enqueue`` would (committed at once); an ``available_at``
        given as a ``timedelta`` counts from the store's clock."""
        delay = options.get("available_at")
        if isinstance(delay, dt.timedelta):
            try:
                options["available_at"] = self._clock() + delay
            except OverflowError:
                raise ConfigurationError(
                    f"available_at: now + {delay} is outside years 1-9999"
                ) from None
        row = self._outbox.row(topic, payload, **options)
        if row.id in self._rows:
            raise ConfigurationError(f"duplicate message id {row.id!r}")
        now = self._clock()
        self._add(
            Message(
                id=row.id,
                topic=row.topic,
                payload=row.payload,
                key=row.key,
                type=row.type,
                headers=decode_headers(row.headers),
                content_type=row.content_type,
                created_at=now,
                available_at=row.available_at or now,
            )
        )
        return row.id

    def _add(self, message: Message) -> None:
        self._seq += 1
        available = message.available_at or message.created_at
        self._rows[message.id] = _Row(self._seq, message, available)
        self._doorbell.set()

    @property
    def pending_messages(self) -> list[Message]:
        """Messages still in the outbox, in write order."""
        return [r.message for r in sorted(self._rows.values(), key=lambda r: r.seq)]

    async def claim_batch(self, request: ClaimRequest) -> Claim:
        now = self._clock()
        token = int.from_bytes(os.urandom(8), "big") >> 1
        rows = sorted(self._rows.values(), key=lambda r: r.seq)
        held: set[str] = set()
        if request.ordered and request.hold_dead_keys:
            held = {key for key in self._dead_keys() if key is not None}

        def lease(row: _Row) -> Message:
            row.token, row.locked_by = token, request.relay_id
            row.locked_until = now + dt.timedelta(seconds=request.lease_seconds)
            return replace(row.message, available_at=row.available_at)

        # Crash isolation: a suspect (its lease expired) that heads its key goes alone, first.
        suspect = _suspect_head(rows, now, ordered=request.ordered, held=held)
        if suspect is not None:
            suspect.locked_alone = True
            return Claim(token, [lease(suspect)], isolated=True, solo_deaths=suspect.solo_deaths)
        behind = request.behind if request.ordered else frozenset()
        claimable = _claimable(
            rows, now, ordered=request.ordered, held=held, limit=request.limit, behind=behind
        )
        return Claim(token=token, messages=[lease(row) for row in claimable])

    def _owned(self, ids: Sequence[str], token: int) -> list[_Row]:
        return [r for i in ids if (r := self._rows.get(i)) is not None and r.token == token]

    async def settle(self, claim: Claim, settlement: Settlement) -> None:
        now = self._clock()
        for row in self._owned(settlement.published, claim.token):
            del self._rows[row.message.id]
        reasons = {r.id: r for r in settlement.retries}
        retried = self._owned(list(reasons), claim.token)
        self._publish_retries_since_sweep += len(retried)  # the next sweep's publish_retries
        for row in retried:
            retry = reasons[row.message.id]
            row.message = replace(row.message, attempts=row.message.attempts + 1)
            row.available_at = now + dt.timedelta(seconds=retry.delay)
            row.last_error, row.token, row.locked_by, row.locked_until = (
                retry.reason,
                None,
                None,
                None,
            )
        dead = dict(settlement.dead_letters())
        for row in self._owned(list(dead), claim.token):
            m = row.message
            del self._rows[m.id]
            self._seq += 1
            self._dead[(m.id, "publish")] = (
                self._seq,
                DeadLetter(
                    **envelope_of(m),
                    dead_lettered_at=now,
                    failure_reason=dead[m.id],
                    attempts=m.attempts + 1,
                ),
            )
        for row in self._owned(settlement.released, claim.token):
            row.token, row.locked_by, row.locked_until = None, None, None

    async def extend_lease(self, claim: Claim, lease_seconds: float) -> int:
        until = self._clock() + dt.timedelta(seconds=lease_seconds)
        held = self._owned([m.id for m in claim.messages], claim.token)
        for row in held:
            row.locked_until = until
        return len(held)

    async def release_expired_leases(self) -> int:
        now = self._clock()
        expired = [
            r
            for r in self._rows.values()
            if r.token is not None and r.locked_until is not None and r.locked_until < now
        ]
        for row in expired:
            row.last_error = f"lease of relay {row.locked_by} expired"
            row.token, row.locked_by, row.locked_until = None, None, None
            row.lease_expiries += 1
            row.solo_deaths += row.locked_alone
            row.locked_alone = False
        self._publish_retries_since_sweep += len(expired)
        return len(expired)

    async def sweep(
        self, *, sweeper: str, interval: float, retention_seconds: float, batch_size: int
    ) -> SweepReport | None:
        now = self._clock()
        last = self._last_sweep
        if last is not None and (now - last.started_at).total_seconds() < interval:
            return None
        since = last.started_at if last is not None else dt.datetime.min.replace(tzinfo=dt.UTC)
        purged = 0
        if retention_seconds > 0:
            cutoff = now - dt.timedelta(seconds=retention_seconds)
            old = [k for k, (_, d) in self._dead.items() if d.dead_lettered_at < cutoff]
            for k in old[:batch_size]:
                del self._dead[k]
                purged += 1

        gone = now - dt.timedelta(days=1)  # relays silent for a day, as the SQL stores
        self._relays = {k: r for k, r in self._relays.items() if r.heartbeat_at >= gone}

        def failures(direction: str) -> int:
            return sum(
                d.direction == direction and d.dead_lettered_at >= since
                for _, d in self._dead.values()
            )

        self._last_sweep = SweepReport(
            started_at=now,
            completed_at=self._clock(),
            swept_by=sweeper,
            publish_retries=self._publish_retries_since_sweep,
            publish_failures=failures("publish"),
            consume_retries=self._inbox.retried_since_sweep,
            consume_failures=failures("consume"),
            purged=purged,
        )
        self._publish_retries_since_sweep = 0
        self._inbox.retried_since_sweep = 0
        self._inbox.purge(now, self._dead)
        return self._last_sweep

    async def last_sweep(self) -> SweepReport | None:
        return self._last_sweep

    async def wait_for_messages(self, timeout: float) -> bool:
        return await wait_for_doorbell(self._doorbell, timeout)

    async def heartbeat(self, relay: RelayInfo) -> None:
        self._relays[relay.relay_id] = replace(relay, heartbeat_at=self._clock())

    async def unregister(self, relay_id: str) -> None:
        self._relays.pop(relay_id, None)

    async def stats(self) -> OutboxStats:
        now = self._clock()
        rows = list(self._rows.values())

        def scheduled(r: _Row) -> bool:
            return r.token is None and r.message.attempts == 0 and r.available_at > now

        first_scheduled: dict[str, int] = {}
        for r in rows:
            if r.message.key is not None and scheduled(r):
                first_scheduled[r.message.key] = min(
                    r.seq, first_scheduled.get(r.message.key, r.seq)
                )
        oldest = min((r.message.created_at for r in rows), default=None)
        live = {
            r.relay_id
            for r in self._relays.values()
            if (now - r.heartbeat_at).total_seconds() < LIVE_SECONDS
        }
        return OutboxStats(
            last_sweep=self._last_sweep,
            unowned_in_flight=sum(r.token is not None and r.locked_by not in live for r in rows),
            scheduled=sum(map(scheduled, rows)),
            behind_scheduled=sum(
                r.token is None
                and not scheduled(r)
                and r.message.key in first_scheduled
                and r.seq > first_scheduled[r.message.key]
                for r in rows
            ),
            pending=sum(r.token is None for r in rows),
            in_flight=sum(r.token is not None for r in rows),
            dead_letters=len(self._dead),
            oldest_pending_age_seconds=(now - oldest).total_seconds() if oldest else None,
            relays=[
                replace(relay, in_flight=sum(r.locked_by == relay.relay_id for r in rows))
                for relay in self._relays.values()
            ],
            consume_failures=self._inbox.failing_consumers(now),
        )

    def _matching(self, flt: DeadLetterFilter) -> list[tuple[int, DeadLetter]]:
        def match(d: DeadLetter) -> bool:
            return (
                (flt.topic is None or d.topic == flt.topic)
                and (flt.type is None or d.type == flt.type)
                and (flt.key is None or d.key == flt.key)
                and (flt.ids is None or d.id in flt.ids)
                and (flt.direction is None or d.direction == flt.direction)
            )

        return sorted((v for v in self._dead.values() if match(v[1])), key=lambda v: -v[0])

    async def list_dead_letters(
        self, flt: DeadLetterFilter, *, limit: int, cursor: str | None
    ) -> DeadLetterPage:
        limit = check_limit(limit)
        after = parse_cursor(cursor)
        found = [v for v in self._matching(flt) if after is None or v[0] < after]
        page = _within_budget(found, limit)
        next_cursor = str(page[-1][0]) if len(found) > len(page) else None
        return DeadLetterPage([d for _, d in page], next_cursor)

    async def known_dead_letter_ids(self, ids: Sequence[str]) -> set[str]:
        known = {i for i, _ in self._dead}
        return {i for i in ids if i in known}

    async def known_message_ids(self, ids: Sequence[str]) -> set[str]:
        return {i for i in ids if i in self._rows}

    async def get_dead_letter(
        self, dead_letter_id: str, direction: ports.Direction | None = None
    ) -> DeadLetter:
        found = [
            v for (i, d), v in self._dead.items() if i == dead_letter_id and direction in (None, d)
        ]
        if not found:
            raise ports.dead_letter_not_found(dead_letter_id, direction)
        return max(found, key=lambda v: v[0])[1]  # the newer of the id's two

    def _outbox_message(
        self, row: _Row, now: dt.datetime, dead_keys: set[str | None]
    ) -> OutboxMessage:
        m = row.message
        state: MessageState
        if row.token is not None:
            state = "in_flight"
        elif m.key is not None and m.key in dead_keys:
            state = "held"
        elif row.available_at > now:
            state = "retrying" if m.attempts > 0 else "scheduled"
        else:
            state = "pending"
        return OutboxMessage(
            **envelope_of(m),
            next_attempt_at=row.available_at,
            attempts=m.attempts,
            last_error=row.last_error,
            state=state,
            relay=row.locked_by if row.token is not None else None,
            lease_expires_at=row.locked_until if row.token is not None else None,
        )

    def _dead_keys(self) -> set[str | None]:
        return {d.key for _, d in self._dead.values() if d.direction == "publish"}

    async def list_messages(
        self, flt: MessageFilter, *, limit: int, cursor: str | None
    ) -> MessagePage:
        limit = check_limit(limit)
        after = parse_cursor(cursor)
        now, dead_keys = self._clock(), self._dead_keys()
        found: list[tuple[int, OutboxMessage]] = []
        for row in sorted(self._rows.values(), key=lambda r: r.seq):
            if after is not None and row.seq <= after:
                continue
            message = self._outbox_message(row, now, dead_keys)
            if (
                (flt.state is None or message.state == flt.state)
                and (flt.topic is None or message.topic == flt.topic)
                and (flt.key is None or message.key == flt.key)
                and (flt.type is None or message.type == flt.type)
            ):
                found.append((row.seq, message))
                if len(found) > limit:
                    break
        page = _within_budget(found, limit)
        next_cursor = str(page[-1][0]) if len(found) > len(page) else None
        return MessagePage([m for _, m in page], next_cursor)

    async def get_message(self, message_id: str) -> OutboxMessage:
        row = self._rows.get(message_id)
        if row is None:
            raise message_not_found(message_id)
        return self._outbox_message(row, self._clock(), self._dead_keys())

    async def replay_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        replayed = []
        for _, d in reversed(self._matching(flt)):
            if d.direction != "publish" or d.id in self._rows:
                continue
            del self._dead[(d.id, d.direction)]
            self._add(Message(**envelope_of(d), available_at=self._clock()))
            replayed.append(d.id)
        # Consume dead letters are re-driven to their consumer instead (see docs/inbox.md).
        return unique(replayed + self._replay_consume_dead_letters(flt))

    async def purge_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        purged = [d for _, d in self._matching(flt)]
        for d in purged:
            del self._dead[(d.id, d.direction)]
        return unique(d.id for d in purged)

    # -- inbox (consumers) ---------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def inbox_session(self) -> AsyncIterator[_InboxSession]:
        """The inbox without a database: handlers get ``None`` as their connection (and a
        batch transaction is no different: there are no transactions)."""
        yield _InboxSession(self._inbox, self._dead_letter_consumed, self._clock)

    def _dead_letter_consumed(self, message: Message, attempts: int, reason: str) -> None:
        existing = self._dead.get((message.id, "consume"))
        if existing is not None:  # a second consumer gave up on it too
            self._dead[(message.id, "consume")] = (
                existing[0],
                replace(
                    existing[1],
                    failure_reason=reason,
                    attempts=max(attempts, existing[1].attempts),
                    dead_lettered_at=self._clock(),
                ),
            )
            return
        self._seq += 1
        self._dead[(message.id, "consume")] = (
            self._seq,
            DeadLetter(
                **envelope_of(message),
                dead_lettered_at=self._clock(),
                failure_reason=reason,
                attempts=attempts,
                direction="consume",
            ),
        )

    def _replay_consume_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        replayed = []
        for _, d in reversed(self._matching(flt)):
            if d.direction != "consume":
                continue
            del self._dead[(d.id, d.direction)]
            self._inbox.revive(d.id, self._clock())
            replayed.append(d.id)
        return replayed


class _InboxSession:
    """The inbox primitives of :class:`~outboxer.ports.InboxSession` and
    :class:`~outboxer.ports.InboxTransaction` over the in-memory inbox (applied at once)."""

    def __init__(
        self,
        inbox: _Inbox,
        dead_letter: Callable[[Message, int, str], None],
        clock: Callable[[], dt.datetime],
    ) -> None:
        self._inbox = inbox
        self._dead_letter = dead_letter
        self._clock = clock

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[_InboxSession]:
        yield self

    async def due_failures(self, consumer: str, limit: int) -> list[str]:
        return [f.message.id for f in self._inbox.due(consumer, self._clock())[:limit]]

    async def count_retries(self, count: int) -> None:
        self._inbox.retried_since_sweep += count

    async def receive(
        self, consumer: str, messages: Sequence[Message], retention: float
    ) -> list[InboxReceipt]:
        receipts = []
        for message in messages:
            pair = (consumer, message.id)
            if pair in self._inbox.rows:
                receipts.append(InboxReceipt(fresh=False, blocked=False))
                continue
            blocked = message.key is not None and self._inbox.blocked(consumer, message.key)
            self._inbox.rows[pair] = None if blocked else self._expiry(retention)
            receipts.append(InboxReceipt(fresh=True, blocked=blocked))
        return receipts

    async def run_handler(
        self, handler: InboxHandler, message: Message, attempt: int, *, isolated: bool
    ) -> Exception | None:
        try:
            await handler(message, None, attempt)
        except Exception as exc:  # noqa: BLE001 - the handler's failure is the message's
            return exc
        return None

    async def forget_received(self, consumer: str, message_ids: Sequence[str]) -> None:
        # Never needed here (no transaction a handler could end), kept to the protocol.
        for message_id in message_ids:
            self._inbox.rows.pop((consumer, message_id), None)

    async def record_failure(
        self, consumer: str, message: Message, attempts: int, failure: ConsumeFailure
    ) -> ConsumeFailure:
        if failure.retry_in is not None:  # the inbox row outlives a pending failure
            self._inbox.rows[(consumer, message.id)] = None
        self._inbox.add_failure(consumer, message, attempts, failure, self._clock())
        return failure

    async def dead_letter(self, message: Message, attempts: int, reason: str) -> None:
        self._dead_letter(message, attempts, failure_reason(reason))

    async def lock_failure(self, consumer: str, message_id: str) -> PendingFailure | None:
        pair = (consumer, message_id)
        failure = self._inbox.failures.get(pair)
        if (
            failure is None
            or failure.state != "retrying"
            or failure.next_attempt_at > self._clock()
            or self._inbox.behind(failure)
        ):
            return None
        handled = self._inbox.rows.get(pair) is not None
        return PendingFailure(failure.seq, failure.message, failure.attempts, handled)

    async def delete_failure(self, seq: int) -> None:
        failures = self._inbox.failures
        for pair in [pair for pair, f in failures.items() if f.seq == seq]:
            del failures[pair]

    async def update_failure(self, seq: int, attempts: int, failure: ConsumeFailure) -> None:
        for row in self._inbox.failures.values():
            if row.seq == seq:
                row.attempts, row.last_error = attempts, failure.reason
                if failure.retry_in is None:
                    row.state = "dead"
                else:
                    row.next_attempt_at = self._expiry(failure.retry_in)

    async def set_done(self, consumer: str, message_id: str, retention: float) -> None:
        self._inbox.rows[(consumer, message_id)] = self._expiry(retention)

    def _expiry(self, seconds: float) -> dt.datetime:
        return self._clock() + dt.timedelta(seconds=seconds)


@dataclass(slots=True)
class _Failure:
    seq: int
    consumer: str
    message: Message
    attempts: int
    next_attempt_at: dt.datetime
    last_error: str
    failed_at: dt.datetime
    state: str = "retrying"


@dataclass(slots=True)
class _Inbox:
    """The in-memory inbox: (consumer, message id) → expiry (None while a failure waits)."""

    rows: dict[tuple[str, str], dt.datetime | None] = field(default_factory=dict)
    failures: dict[tuple[str, str], _Failure] = field(default_factory=dict)
    retried_since_sweep: int = 0
    seq: int = 0

    def behind(self, failure: _Failure) -> bool:
        """Whether an earlier failure of its key is still retrying (per-key order)."""
        key = failure.message.key
        return key is not None and any(
            f.consumer == failure.consumer
            and f.message.key == key
            and f.state == "retrying"
            and f.seq < failure.seq
            for f in self.failures.values()
        )

    def blocked(self, consumer: str, key: str) -> bool:
        return any(
            f.consumer == consumer and f.message.key == key and f.state == "retrying"
            for f in self.failures.values()
        )

    def add_failure(
        self,
        consumer: str,
        message: Message,
        attempts: int,
        failure: ConsumeFailure,
        now: dt.datetime,
    ) -> None:
        pair = (consumer, message.id)
        if pair in self.failures:
            return
        self.seq += 1
        self.failures[pair] = _Failure(
            seq=self.seq,
            consumer=consumer,
            message=message,
            attempts=attempts,
            next_attempt_at=now + dt.timedelta(seconds=failure.retry_in or 0.0),
            last_error=failure.reason,
            failed_at=now,
            state="dead" if failure.retry_in is None else "retrying",
        )

    def failing_consumers(self, now: dt.datetime) -> tuple[ConsumerFailures, ...]:
        """The ``consume_failures`` of stats: retrying and waiting (not tried since it was
        stored: attempts 0) failures per consumer, as the SQL stores count them."""
        mine: dict[str, list[_Failure]] = {}
        for failure in self.failures.values():
            if failure.state == "retrying":
                mine.setdefault(failure.consumer, []).append(failure)
        return tuple(
            ConsumerFailures(
                consumer=consumer,
                retrying=sum(f.attempts > 0 for f in failures),
                waiting=sum(f.attempts == 0 for f in failures),
                oldest_age_seconds=max(
                    0.0, (now - min(f.failed_at for f in failures)).total_seconds()
                ),
            )
            for consumer, failures in sorted(mine.items())
        )

    def due(self, consumer: str, now: dt.datetime) -> list[_Failure]:
        mine = sorted(
            (f for f in self.failures.values() if f.consumer == consumer and f.state == "retrying"),
            key=lambda f: f.seq,
        )
        due: list[tuple[int, dt.datetime, int, _Failure]] = []
        runs: dict[str, list[_Failure]] = {}
        for failure in mine:  # (as inbox_due: every key's first, then every key's second, ...;
            # among those, the one due the longest first)
            key = failure.message.key
            run = [] if key is None else runs.setdefault(key, [])  # an unkeyed one: its own
            run.append(failure)
            if failure.next_attempt_at <= now and run[0].next_attempt_at <= now:
                due.append((len(run), failure.next_attempt_at, failure.seq, failure))
        return [d[-1] for d in sorted(due, key=lambda d: d[:3])]

    def revive(self, message_id: str, now: dt.datetime) -> None:
        for failure in self.failures.values():
            if failure.message.id == message_id and failure.state == "dead":
                failure.state, failure.attempts = "retrying", 0
                failure.next_attempt_at = now
                failure.last_error = f"replayed: {failure.last_error}"
                self.rows[(failure.consumer, message_id)] = None

    def purge(self, now: dt.datetime, dead: dict[tuple[str, str], tuple[int, DeadLetter]]) -> None:
        for pair, expires in list(self.rows.items()):
            if expires is not None and expires < now:
                del self.rows[pair]
        for pair, failure in list(self.failures.items()):
            if failure.state == "dead" and (failure.message.id, "consume") not in dead:
                del self.failures[pair]


class RecordingPublisher:
    """A :class:`~outboxer.ports.Publisher` that records what it was given.

    Args:
        fail: Optional function deciding a message's fate: return ``None`` to acknowledge, or a
            ``PublishError`` to report (it is called on every attempt).
        keeps_key_order: Behave like a broker that keeps a call's order per key (Kafka,
            RabbitMQ, NATS, Redis): the relay then gives it a key's whole run in one call, and,
            as those brokers do, a message behind a failed one of its key is still recorded in
            ``messages`` (the relay publishes it again after the failed one: a duplicate).
            ``False`` (the default): one message per key per call (the relay's waves).
    """

    def __init__(
        self,
        fail: Callable[[Message], PublishError | None] | None = None,
        *,
        keeps_key_order: bool = False,
    ) -> None:
        self.messages: list[Message] = []
        self.attempts: list[Message] = []
        self.keeps_key_order = keeps_key_order
        self._fail = fail

    async def __aenter__(self) -> RecordingPublisher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
        results: list[PublishError | None] = []
        for message in messages:
            self.attempts.append(message)
            error = self._fail(message) if self._fail else None
            if error is None:
                self.messages.append(message)
            results.append(error)
        return results


if TYPE_CHECKING:  # mypy checks that the fakes implement the ports they stand in for
    _store: type[Store] = InMemoryStore
    _publisher: type[Publisher] = RecordingPublisher
