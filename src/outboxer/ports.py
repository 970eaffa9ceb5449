"""The Protocols the core is written against.

Stores (PostgreSQL, SQLite, the in-memory fake) and publishers (in-process handlers, Kafka, ...)
implement these; the relay, the inbox, the CLI and the admin API only ever see these types.
Adapters carry their own driver-specific settings in their constructors, never as extra
arguments here.

The store ports are split by who uses them:

- :class:`RelayStore`: the relay (claim, settle, doorbell, registry, leases; it also sweeps
  and reads the counts to know when a drain is done);
- :class:`SweeperStore`: whoever offers to run the periodic sweep (relays, consumers);
- :class:`StatsStore`, :class:`DeadLetterStore` and :class:`MessageReader` (together
  :class:`AdminStore`): operators, through the CLI and the admin API;
- :class:`SchemaStore`: ``outboxer db upgrade`` and the start-up schema check;
- :class:`InboxStore`: the inbox of consumers.

:class:`Store` is their union (what :class:`~outboxer.testing.InMemoryStore` implements) and
:class:`DatabaseStore` adds schema management and a lifecycle (what ``open_store`` returns).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, Self, runtime_checkable

from outboxer.errors import NotFound, PublishError, StoreError
from outboxer.message import Message, printable, storable_text

__all__ = [
    "AdminStore",
    "Claim",
    "ClaimRequest",
    "ConsumeFailure",
    "ConsumeOutcome",
    "ConsumerFailures",
    "DeadLetter",
    "DeadLetterFilter",
    "DeadLetterPage",
    "DeadLetterStore",
    "dead_letter_ids",
    "dead_letter_not_found",
    "replay_skipped",
    "DatabaseStore",
    "FailurePolicy",
    "failure_reason",
    "keeps_key_order",
    "log_last_sweep",
    "InboxHandler",
    "InboxReceipt",
    "BLOCKED_RECEIPT",
    "DUPLICATE_RECEIPT",
    "FRESH_RECEIPT",
    "InboxSession",
    "InboxStore",
    "InboxTransaction",
    "MessageFilter",
    "MessagePage",
    "MessageReader",
    "MessageState",
    "MAX_REASON",
    "NO_REASON",
    "PAGE_PAYLOAD_BYTES",
    "OutboxMessage",
    "OutboxStats",
    "PendingFailure",
    "Publisher",
    "RelayInfo",
    "RelayStore",
    "Retry",
    "SchemaStore",
    "StatsStore",
    "SweepReport",
    "Settlement",
    "Store",
    "SweeperStore",
]


#: What a failure with no text of its own is stored as: a dead letter's ``failure_reason`` (and
#: a retry's ``last_error``) is never empty, so an operator always reads why.
NO_REASON = "failed without a reason (the error carried no message)"


#: A failure's reason is cut to this many characters (an error may quote a whole payload; MariaDB
#: refused a reason over its ``TEXT`` column's 64 KiB, and the consumer retried its batch forever).
MAX_REASON = 2000

#: A page of a list (``list_dead_letters``, ``list_messages``) stops taking rows once the
#: payloads of the rows before reach this many bytes, even short of its ``limit``; the first row
#: always comes, however large, so a page holds at most this plus one payload. The store stops
#: in its query, so neither the database's answer nor the process (CLI, admin server) ever
#: holds more: a thousand payloads of 8 MB took a dashboard refresh to gigabytes. The page's
#: ``next_cursor`` is set as when ``limit`` rows were returned; clients follow it.
PAGE_PAYLOAD_BYTES = 4 * 1024 * 1024


def failure_reason(text: str) -> str:
    """``text`` as every store keeps it (NUL and lone surrogates, which a broker's or a
    webhook's error may quote, as U+FFFD: :func:`~outboxer.message.storable_text`; other
    control characters escaped: :func:`~outboxer.message.printable`; cut to
    :data:`MAX_REASON` characters), or :data:`NO_REASON` when it is blank.

    Every path that stores a failure goes through this: retries and dead letters of the relay
    (:class:`Retry`, :meth:`Settlement.dead_letters`) and of consumers (:class:`ConsumeFailure`).
    """
    if not text.strip():
        return NO_REASON
    text = printable(storable_text(text))  # a receiver's escape sequences: never stored raw
    if len(text) > MAX_REASON:
        text = text[: MAX_REASON - 1] + "…"
    return text


@dataclass(frozen=True, slots=True)
class Claim:
    """A batch of messages leased to one relay.

    ``token`` is the fencing token: every settle statement matches on it, so a relay whose lease
    expired (and whose rows another relay has since claimed) can never acknowledge, retry or
    dead-letter rows it no longer owns.

    Crash isolation: a message whose lease expired (its relay died or froze holding it) is a
    *suspect* and is claimed alone: ``isolated`` is then true and ``solo_deaths`` says how often
    a relay already died holding it alone. The relay publishes an isolated claim with nothing
    else in flight, and dead-letters it instead once ``solo_deaths`` reaches its limit.
    """

    token: int
    messages: Sequence[Message]
    isolated: bool = False
    solo_deaths: int = 0


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """What a relay asks of :meth:`RelayStore.claim_batch`; it builds one from its settings.

    Attributes:
        limit: Messages at most (a suspect of crash isolation comes alone).
        lease_seconds: How long the claim is owned before another relay may take it over.
        ordered: Only the head (oldest remaining message) of each key is eligible, so a key's
            next message is claimable only after its predecessor left the outbox; unkeyed
            messages are always eligible.
        relay_id: The relay holding the claim (operators see it).
        hold_dead_keys: Ordered only: a key with a publish dead letter is not claimed until that
            dead letter is replayed or purged.
        behind: Ordered only: claim tokens of this relay's batches in flight. A key's next rows
            may also be claimed while its earlier rows are leased under one of these tokens; the
            relay publishes them only after those batches' calls returned, and releases them if
            an earlier one failed (ADR 0008). A permission, not a duty: a store that does not
            support it claims as without it (MySQL/MariaDB today). Rows leased under any other
            token (another relay, or a batch of this one whose settle was abandoned) still
            block their key.
    """

    limit: int
    lease_seconds: float
    ordered: bool
    relay_id: str
    hold_dead_keys: bool = False
    behind: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class Retry:
    """A failed message to try again after ``delay`` seconds (one attempt is counted)."""

    id: str
    delay: float
    reason: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", failure_reason(self.reason))


@dataclass(slots=True)
class Settlement:
    """How a claimed batch ended; a store applies it in one transaction.

    Attributes:
        published: Ids the broker acknowledged: removed from the outbox.
        retries: Ids that failed and will be retried (attempt counted).
        dead: ``(id, reason)`` pairs moved to the dead-letter table (attempt counted).
        released: Ids handed back untouched (broker down, shutdown): no attempt counted.
    """

    published: list[str] = field(default_factory=list)
    retries: list[Retry] = field(default_factory=list)
    dead: list[tuple[str, str]] = field(default_factory=list)
    released: list[str] = field(default_factory=list)

    def dead_letters(self) -> list[tuple[str, str]]:
        """``dead`` as stores write it: every reason non-empty (:func:`failure_reason`)."""
        return [(i, failure_reason(reason)) for i, reason in self.dead]

    def settled_ids(self) -> set[str]:
        """Every id this settlement already decides."""
        ids = {*self.published, *self.released, *(r.id for r in self.retries)}
        ids.update(i for i, _ in self.dead)
        return ids


Direction = Literal["publish", "consume"]


@dataclass(frozen=True, slots=True)
class _StoredEnvelope:
    """What operators see of a stored message, dead letter or not: its envelope."""

    id: str
    topic: str
    key: str | None
    type: str | None
    payload: bytes
    content_type: str
    headers: Mapping[str, str]
    created_at: dt.datetime

    def _envelope_json(self) -> dict[str, Any]:
        """The envelope's part of the JSON shapes; the payload is parsed JSON, text, or
        ``{"base64": …}`` for other bytes: also for a JSON payload that is not plain JSON
        (``NaN``, ``Infinity``: no JSON answer can carry them) or nests deeper than
        :data:`MAX_SHOWN_DEPTH` (a hostile message made every list holding it fail)."""
        try:
            payload: Any = self.payload.decode()
            if self.content_type.startswith("application/json"):
                payload = json.loads(
                    payload, parse_constant=_no_constant, parse_float=_finite_float
                )
                if not _shallow(payload):
                    raise ValueError("nested too deep")
        except (UnicodeDecodeError, ValueError, RecursionError):
            import base64

            payload = {"base64": base64.b64encode(self.payload).decode()}
        return {
            "id": self.id,
            "topic": self.topic,
            "key": self.key,
            "type": self.type,
            "payload": payload,
            "content_type": self.content_type,
            "headers": dict(self.headers),
            "created_at": self.created_at.isoformat(),
        }


#: Nesting depth up to which a JSON payload is shown parsed (deeper: base64).
MAX_SHOWN_DEPTH = 100


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    """A JSON number as a float, unless it is beyond a float's range (``1e400``, valid JSON):
    ``float`` makes it infinite, which JSON output cannot carry (``json.dumps`` wrote
    ``Infinity``, pydantic ``null``): such a payload is shown as base64 instead."""
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is beyond the range of a float")
    return value


def _shallow(value: Any) -> bool:
    """Whether ``value`` nests at most :data:`MAX_SHOWN_DEPTH` lists and objects deep (walked
    without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        if children and depth > MAX_SHOWN_DEPTH:
            return False
        stack.extend((child, depth + 1) for child in children)
    return True


@dataclass(frozen=True, slots=True)
class DeadLetter(_StoredEnvelope):
    """A message that failed for good, with why and how often."""

    dead_lettered_at: dt.datetime
    failure_reason: str
    attempts: int
    direction: Direction = "publish"

    def to_json(self) -> dict[str, Any]:
        """The JSON shape of the CLI (``--json``) and the admin API."""
        return {
            **self._envelope_json(),
            "dead_lettered_at": self.dead_lettered_at.isoformat(),
            "failure_reason": self.failure_reason,
            "attempts": self.attempts,
            "direction": self.direction,
        }


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """Selects dead letters; empty fields match everything. ``ids`` narrows to those ids,
    ``direction`` to publish or consume dead letters (an id may have one of each)."""

    topic: str | None = None
    type: str | None = None
    key: str | None = None
    ids: Sequence[str] | None = None
    direction: Direction | None = None


@dataclass(frozen=True, slots=True)
class DeadLetterPage:
    """One page of dead letters, newest first; pass ``next_cursor`` to get the next page."""

    items: Sequence[DeadLetter]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class RelayInfo:
    """A relay instance as registered in the database by its heartbeat."""

    relay_id: str
    hostname: str
    pid: int
    started_at: dt.datetime
    heartbeat_at: dt.datetime
    in_flight: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "relay_id": self.relay_id,
            "hostname": self.hostname,
            "pid": self.pid,
            "started_at": self.started_at.isoformat(),
            "heartbeat_at": self.heartbeat_at.isoformat(),
            "in_flight": self.in_flight,
        }


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What the last sweep did (persisted; see ``SweeperStore.sweep``).

    The counts cover all relays and consumers since the previous sweep (docs/operations.md):

    Attributes:
        publish_retries: Publish attempts to be made again: retryable failures settled by
            relays plus messages taken back from an expired lease.
        publish_failures: Publish dead letters written since the previous sweep (still there).
        consume_retries: Failed consumptions retried by consumers.
        consume_failures: Consume dead letters written since the previous sweep.
        purged: Dead letters past their retention that this sweep deleted.
    """

    started_at: dt.datetime
    completed_at: dt.datetime
    swept_by: str
    publish_retries: int
    publish_failures: int
    consume_retries: int
    consume_failures: int
    purged: int

    def to_json(self) -> dict[str, Any]:
        return {
            "started_at": self.started_at.isoformat(),
            "completed_at": self.completed_at.isoformat(),
            "swept_by": self.swept_by,
            "publish_retries": self.publish_retries,
            "publish_failures": self.publish_failures,
            "consume_retries": self.consume_retries,
            "consume_failures": self.consume_failures,
            "purged": self.purged,
        }


@dataclass(frozen=True, slots=True)
class ConsumerFailures:
    """The messages one consumer of the inbox still has to re-drive (``consume_failures`` of
    ``outboxer stats``): what a failing handler holds up, which the outbox figures never show.

    Attributes:
        consumer: The consumer's name (``outboxer consume --consumer-name``).
        retrying: Messages its handlers failed on, waiting for their next attempt.
        waiting: Messages stored and not tried since: behind an earlier failed message of their
            key (per-key order), or a replayed consume dead letter before its re-drive.
        oldest_age_seconds: Age of its oldest failure, from when it was first stored (the
            database's clock): how long this consumer has been held up.

    Failures given up on are dead letters, counted in ``dead_letters``, not here.
    """

    consumer: str
    retrying: int
    waiting: int
    oldest_age_seconds: float

    def to_json(self) -> dict[str, Any]:
        """The figures without the name: the name is their key in ``consume_failures``."""
        return {
            "retrying": self.retrying,
            "waiting": self.waiting,
            "oldest_age_seconds": self.oldest_age_seconds,
        }


@dataclass(frozen=True, slots=True)
class OutboxStats:
    """What ``outboxer stats`` and ``GET /api/stats`` report.

    ``unowned_in_flight`` (beyond the core figures) counts messages leased by a relay whose
    heartbeat stopped: work nobody owns until the lease expires and the sweeper takes it back.
    ``scheduled`` counts the ``pending`` messages written for a later time and never tried yet
    (``available_at`` in the future): :meth:`Relay.drain <outboxer.relay.Relay.drain>` does not
    wait for them, nor, when the relay keeps each key's order, for the ``behind_scheduled`` ones
    (pending, not scheduled themselves, behind a scheduled message of their key; the drain's
    figure, not in the JSON). ``consume_failures`` is the inbox's side: the consumers that have
    failed messages still to re-drive, by name (none listed when nothing fails).
    """

    pending: int
    in_flight: int
    dead_letters: int
    oldest_pending_age_seconds: float | None
    relays: Sequence[RelayInfo] = ()
    last_sweep: SweepReport | None = None
    unowned_in_flight: int = 0
    scheduled: int = 0
    consume_failures: Sequence[ConsumerFailures] = ()
    behind_scheduled: int = 0

    def left_for_later(self, *, ordered: bool) -> int:
        """The pending messages a drain leaves for a later run: the scheduled ones, and with
        per-key order those their key holds behind them."""
        return self.scheduled + (self.behind_scheduled if ordered else 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "pending": self.pending,
            "in_flight": self.in_flight,
            "dead_letters": self.dead_letters,
            "oldest_pending_age_seconds": self.oldest_pending_age_seconds,
            "relays": [relay.to_json() for relay in self.relays],
            "last_sweep": self.last_sweep.to_json() if self.last_sweep is not None else None,
            "unowned_in_flight": self.unowned_in_flight,
            "scheduled": self.scheduled,
            "consume_failures": {c.consumer: c.to_json() for c in self.consume_failures},
        }


# -- the stores, split by who uses them ------------------------------------------------------
#
# A store implements all of these; each caller depends only on the part it uses, so a test
# double (or a new store) need not fake the rest, and a reader sees at the signature what a
# component may do to the outbox.


@runtime_checkable
class SweeperStore(Protocol):
    """What runs the periodic sweep (relays and consumers offer to; one instance at a time)."""

    async def sweep(
        self, *, sweeper: str, interval: float, retention_seconds: float, batch_size: int
    ) -> SweepReport | None:
        """Run one sweep unless another instance is sweeping or the last one is younger than
        ``interval`` seconds (then return ``None``). Only one instance sweeps at a time (a
        database lock); the report is persisted. Dead letters older than
        ``retention_seconds`` (0 = keep) are purged, ``batch_size`` at a time."""
        ...

    async def last_sweep(self) -> SweepReport | None:
        """The persisted report of the last completed sweep."""
        ...


async def log_last_sweep(store: SweeperStore, log: logging.Logger) -> None:
    """Log the persisted report of the last sweep: relays and consumers do when they start, so
    an operator reads the retry report of the previous run first. A database that is down is
    not worth failing a start for: the line is skipped (the start's own checks report it)."""
    try:
        last = await store.last_sweep()
    except StoreError:
        return
    log.info("last sweep: %s", json.dumps(last.to_json()) if last else "none yet")


@runtime_checkable
class StatsStore(Protocol):
    """Figures for operators (CLI ``stats``, admin API, ``/readyz``) and the relay's drain."""

    async def stats(self) -> OutboxStats:
        """Counts and ages for operators."""
        ...


@runtime_checkable
class RelayStore(SweeperStore, StatsStore, Protocol):
    """What the relay needs: claims and settlements under a lease, its doorbell, its registry
    entry, taking back expired leases; plus the sweep it runs and the counts ``drain`` reads."""

    async def claim_batch(self, request: ClaimRequest) -> Claim:
        """Lease up to ``request.limit`` available messages, oldest first (see
        :class:`ClaimRequest`). Messages leased by anyone else are never returned."""
        ...

    async def settle(self, claim: Claim, settlement: Settlement) -> None:
        """Apply the outcome of a batch atomically, fenced by ``claim.token``."""
        ...

    async def extend_lease(self, claim: Claim, lease_seconds: float) -> int:
        """Extend the lease of the claim's messages to ``lease_seconds`` from now, fenced by
        ``claim.token``: only rows this claim still holds are extended (a lease that expired
        and was taken back stays lost). Returns how many are still held."""
        ...

    async def release_expired_leases(self) -> int:
        """Make messages whose lease ran out claimable again; return how many."""
        ...

    async def wait_for_messages(self, timeout: float) -> bool:
        """Return True when new messages may have been committed, False after ``timeout``."""
        ...

    async def heartbeat(self, relay: RelayInfo) -> None:
        """Register or refresh a relay instance."""
        ...

    async def unregister(self, relay_id: str) -> None:
        """Remove a relay instance that stops cleanly."""
        ...


@runtime_checkable
class DeadLetterStore(Protocol):
    """Dead-letter tooling for operators (CLI ``dlq``, admin API)."""

    async def list_dead_letters(
        self, flt: DeadLetterFilter, *, limit: int, cursor: str | None
    ) -> DeadLetterPage:
        """Dead letters matching ``flt``, newest first: up to ``limit``, fewer when their
        payloads reach :data:`PAGE_PAYLOAD_BYTES` (then ``next_cursor`` goes on)."""
        ...

    async def get_dead_letter(
        self, dead_letter_id: str, direction: Direction | None = None
    ) -> DeadLetter:
        """One dead letter; raises ``NotFound``. An id may have two (one publish, one consume
        dead letter): ``direction`` chooses, and without it the newer is returned."""
        ...

    async def known_dead_letter_ids(self, ids: Sequence[str]) -> set[str]:
        """Those of ``ids`` that name a dead letter (the check before a replay or purge by
        ids): ids only, whatever the payloads' size."""
        ...

    async def replay_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        """Move matching dead letters back to the outbox (same id, attempts reset)."""
        ...

    async def purge_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        """Delete matching dead letters; return their ids."""
        ...


def dead_letter_not_found(dead_letter_id: str, direction: Direction | None) -> NotFound:
    """The error of a dead letter that is not there (of ``direction``, if given)."""
    return dead_letters_not_found([dead_letter_id], direction)


def dead_letters_not_found(ids: Sequence[str], direction: Direction | None) -> NotFound:
    """The error of dead letters that are not there: the first ten ids, quoted."""
    kind = "dead letter" if direction is None else f"{direction} dead letter"
    more = f" (+{len(ids) - 10} more)" if len(ids) > 10 else ""
    return NotFound(f"no {kind} with id {', '.join(repr(i) for i in ids[:10])}{more}")


async def missing_dead_letters(
    store: DeadLetterStore, ids: Sequence[str], direction: Direction | None
) -> list[str]:
    """Those of ``ids`` (each once, in order) with no dead letter (of ``direction``, if given):
    the check before a replay or purge by ids, which acts on none of them unless all exist."""
    wanted = list(dict.fromkeys(ids))
    if direction is None:
        known = await store.known_dead_letter_ids(wanted)
    else:
        known = set(await dead_letter_ids(store, DeadLetterFilter(ids=wanted, direction=direction)))
    return [i for i in wanted if i not in known]


async def dead_letter_ids(store: DeadLetterStore, flt: DeadLetterFilter) -> list[str]:
    """The ids of every dead letter ``flt`` selects, newest first, each once (page after page).
    After a replay, those it left: publish dead letters whose id is in the outbox again."""
    ids: dict[str, None] = {}
    cursor = None
    while True:
        page = await store.list_dead_letters(flt, limit=1000, cursor=cursor)
        ids.update(dict.fromkeys(d.id for d in page.items))
        cursor = page.next_cursor
        if cursor is None:
            return list(ids)


#: Where a message not yet published stands, judged in this order:
#:
#: - ``in_flight``: leased by a relay (``relay`` names it) that is publishing it;
#: - ``held``: its key has a publish dead letter; relays started with
#:   ``--hold-keys-after-dead-letter`` leave it until that dead letter is replayed or purged;
#: - ``retrying``: a publish attempt failed; the next one is due at ``next_attempt_at``;
#: - ``scheduled``: written with an ``available_at`` in the future, never tried yet;
#: - ``pending``: due now, waiting for a relay to claim it.
MessageState = Literal["pending", "scheduled", "retrying", "in_flight", "held"]


@dataclass(frozen=True, slots=True)
class OutboxMessage(_StoredEnvelope):
    """A message still in the outbox, as operators see it: the envelope and where it stands.

    Attributes:
        next_attempt_at: When it may be claimed (its ``available_at``; in the past when due).
        last_error: Why the previous attempt failed (or whose lease expired); ``None`` if none.
        relay: The relay holding its lease, when ``in_flight``.
        lease_expires_at: When that lease runs out (then the sweeper takes the message back).
    """

    next_attempt_at: dt.datetime
    attempts: int
    last_error: str | None
    state: MessageState
    relay: str | None = None
    lease_expires_at: dt.datetime | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON shape of ``outboxer messages --json`` and ``GET /api/messages``."""
        return {
            **self._envelope_json(),
            "state": self.state,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "next_attempt_at": self.next_attempt_at.isoformat(),
            "relay": self.relay,
            "lease_expires_at": self.lease_expires_at.isoformat()
            if self.lease_expires_at is not None
            else None,
        }


@dataclass(frozen=True, slots=True)
class MessageFilter:
    """Selects outbox messages; empty fields match everything."""

    state: MessageState | None = None
    topic: str | None = None
    key: str | None = None
    type: str | None = None


@dataclass(frozen=True, slots=True)
class MessagePage:
    """One page of outbox messages, oldest first (the order relays claim them in); pass
    ``next_cursor`` to get the next page."""

    items: Sequence[OutboxMessage]
    next_cursor: str | None


@runtime_checkable
class MessageReader(Protocol):
    """Read-only view of the messages not yet published (CLI ``messages``, admin API)."""

    async def list_messages(
        self, flt: MessageFilter, *, limit: int, cursor: str | None
    ) -> MessagePage:
        """Messages matching ``flt``, oldest first. A page costs an index walk in write order
        from the cursor, never a scan of the whole backlog (except to find a rare topic/type
        or state: those are filtered along the walk). Up to ``limit``, fewer when their payloads
        reach :data:`PAGE_PAYLOAD_BYTES` (then ``next_cursor`` goes on)."""
        ...

    async def known_message_ids(self, ids: Sequence[str]) -> set[str]:
        """Those of ``ids`` that name a message in the outbox (what a replay left where it was:
        a dead letter whose id is back in the outbox), in a round trip per 1,000."""
        ...

    async def get_message(self, message_id: str) -> OutboxMessage:
        """One message still in the outbox; raises ``NotFound``."""
        ...


@runtime_checkable
class AdminStore(StatsStore, DeadLetterStore, MessageReader, Protocol):
    """What the admin API and the operator commands of the CLI use."""


async def replay_skipped(store: AdminStore, flt: DeadLetterFilter) -> list[str]:
    """After a replay with ``flt``: the ids of the publish dead letters it left where they are
    because a message with the id is in the outbox again (a consume dead letter is always
    replayed; one written since the replay, with no such message, is not counted)."""
    if flt.direction == "consume":
        return []
    # one round trip per 1,000 (a get_message each took 7 s for 20,000 left; a probe)
    left = await dead_letter_ids(store, replace(flt, direction="publish"))
    back = await store.known_message_ids(left)
    return [dead_letter_id for dead_letter_id in left if dead_letter_id in back]


@runtime_checkable
class SchemaStore(Protocol):
    """Schema management (``outboxer db upgrade``, the start-up check of every command)."""

    async def migrate(self, target: int | None = None) -> list[int]:
        """Create or upgrade the schema; returns the versions applied (empty when current).

        ``target`` stops at that version (tests of the upgrade path); concurrent upgrades are
        safe and a failed upgrade leaves nothing behind.
        """
        ...

    async def schema_version(self) -> int:
        """The installed schema version, 0 when outboxer's tables do not exist."""
        ...

    async def check_schema(self) -> None:
        """Raise ``SchemaError`` unless the schema is exactly at this version of outboxer."""
        ...


@runtime_checkable
class Publisher(Protocol):
    """Sends messages to a broker and reports, per message, whether the broker has them.

    ``publish`` returns one entry per input message, in the same order: ``None`` when the broker
    acknowledged it, otherwise the :class:`~outboxer.errors.PublishError` subclass that says what
    to do (retry later, dead-letter, or back off because the broker is down). It may also raise
    ``BrokerUnavailable`` for the whole batch. A publisher must be usable as an async context
    manager that opens and closes its connections.

    **Per-key order within a call** (optional capability, see :func:`keeps_key_order`): a
    publisher whose broker stores the messages of one call that share a key in the order of the
    call (it writes them in input order over one ordered path: a Kafka partition of one
    idempotent producer, one AMQP channel, one NATS connection, one Redis pipeline) declares the
    class attribute ``keeps_key_order = True``. In ordered mode the relay then publishes a key's
    whole run of a batch in one call, and settles every message of a key behind a failed one as
    not yet published (docs/adr/0008-pipelined-key-runs.md). A publisher without it gets at
    most one message per key per call (the relay publishes a run in *waves*), so it may send
    the messages of a call concurrently.
    """

    async def __aenter__(self) -> Publisher: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]: ...


def keeps_key_order(publisher: Publisher) -> bool:
    """Whether ``publisher`` declares that the broker keeps, for the messages of one call that
    share a key, the order of the call (``keeps_key_order = True``; see :class:`Publisher`).

    A capability rather than a method of the port, so that a publisher written before it (or
    one that sends a call's messages concurrently, such as in-process async handlers) needs no
    change and keeps the safe default: waves of one message per key.
    """
    return getattr(publisher, "keeps_key_order", False) is True


# -- the receiving side ------------------------------------------------------------------------

#: What became of one delivery to an inbox consumer:
#:
#: - ``handled``: the handlers ran and their writes committed with the inbox row;
#: - ``duplicate``: the consumer had this message id already (handled, waiting or given up):
#:   nothing ran;
#: - ``waiting``: an earlier message of the same key is still failing for this consumer: this one
#:   is stored and runs after it (per-key order);
#: - ``retrying``: the handlers failed; the failure is recorded and re-driven after a delay;
#: - ``dead``: the handlers failed for good; the message is a dead letter (direction
#:   ``consume``).
ConsumeOutcome = Literal["handled", "duplicate", "waiting", "retrying", "dead"]

#: Runs a message's handlers: ``(message, connection, attempt)``. ``connection`` is the driver
#: connection of the inbox transaction (asyncpg, aiosqlite; ``None`` for the in-memory store);
#: ``attempt`` counts from 1.
InboxHandler = Callable[[Message, Any, int], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ConsumeFailure:
    """What to do after a failed consumption attempt.

    Attributes:
        reason: Stored as the failure's ``last_error`` and, for good, the dead letter's reason.
        retry_in: Seconds until the next attempt; ``None`` makes the message a dead letter.
    """

    reason: str
    retry_in: float | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", failure_reason(self.reason))


#: Decides a failed attempt: ``(message, attempts so far including this one, error)``.
FailurePolicy = Callable[[Message, int, Exception], ConsumeFailure]


@dataclass(frozen=True, slots=True)
class InboxReceipt:
    """What recording a delivery in the inbox found.

    Attributes:
        fresh: The pair (consumer, message id) was not there: it is recorded now, in the open
            transaction; ``False`` means a duplicate.
        blocked: An earlier message of the same key is still failing for this consumer, so
            this one must wait behind it (its inbox row then has no expiry).
    """

    fresh: bool
    blocked: bool


#: The three receipts there are (stores hand these out rather than make one per message).
FRESH_RECEIPT = InboxReceipt(fresh=True, blocked=False)
BLOCKED_RECEIPT = InboxReceipt(fresh=True, blocked=True)
DUPLICATE_RECEIPT = InboxReceipt(fresh=False, blocked=False)


@dataclass(frozen=True, slots=True)
class PendingFailure:
    """A failed consumption taken for a re-drive (locked until its transaction ends).

    Attributes:
        seq: The failure's row, for the updates of this re-drive.
        message: The whole message, as it was first delivered.
        attempts: Failed attempts so far (0 for a message that waited behind its key).
        handled: The inbox says the message was handled meanwhile (a replayed dead letter the
            broker delivered again): nothing to run, the failure is forgotten.
    """

    seq: int
    message: Message
    attempts: int
    handled: bool


class InboxTransaction(Protocol):
    """The SQL of the inbox, inside one open transaction of an :class:`InboxSession`.

    The consume state machine (:mod:`outboxer.inbox.consume`) is written once against these
    primitives; a store supplies only their statements. Every method runs in the transaction
    the session opened, so the handler's writes and the inbox rows commit together. A first
    delivery of a batch costs one round trip for all its inbox rows (:meth:`receive`), one
    savepoint round trip per message whose handler may write, and the commit.
    """

    async def receive(
        self, consumer: str, messages: Sequence[Message], retention: float
    ) -> list[InboxReceipt]:
        """Record (consumer, id) of each message unless it is there already, in one round trip;
        rows of messages that are not blocked expire after ``retention`` seconds. The ids are
        distinct (the core drops repeats within a batch). One receipt per message, in order.

        A concurrent transaction holding a row of the batch (another instance consuming the
        same message) makes this one wait for its outcome, so duplicates never run side by
        side; the rows are inserted in id order so that two overlapping batches cannot
        deadlock on them."""
        ...

    async def run_handler(
        self, handler: InboxHandler, message: Message, attempt: int, *, isolated: bool
    ) -> Exception | None:
        """Run ``handler`` on this transaction's connection; return its exception, or ``None``.

        ``isolated``: the handler may write through the connection, so it runs in a savepoint:
        a failure undoes its writes (and nothing else), and a handler that left the
        transaction unusable (it swallowed a database error) counts as failed. Without it the
        handler cannot reach the transaction (it takes no context), and no round trip is
        spent.

        Raises:
            HandlerEndedTransaction: an ``isolated`` handler committed, rolled back or closed
                the connection (found out without a round trip, where the driver tells); no
                statement was sent after it.
        """
        ...

    async def forget_received(self, consumer: str, message_ids: Sequence[str]) -> None:
        """Delete the inbox rows :meth:`receive` recorded for these messages, which were never
        handled: a handler ended the transaction
        (:class:`~outboxer.errors.HandlerEndedTransaction`), and if it committed, those rows
        were committed with it and would turn the redelivery of the messages into duplicates.
        Runs on the connection as the handler left it (in autocommit after a commit; after a
        rollback the rows are gone and it deletes nothing)."""
        ...

    async def record_failure(
        self, consumer: str, message: Message, attempts: int, failure: ConsumeFailure
    ) -> ConsumeFailure:
        """Store a failed (or, with ``attempts`` 0, a waiting) first delivery with the whole
        message: ``retrying`` after ``failure.retry_in`` seconds, or ``dead``. While it is
        retrying the message's inbox row does not expire (the pair must outlive the failure);
        a dead one keeps the expiry :meth:`receive` gave it. Returns the failure as stored:
        ``failure``, or a dead one when the store cannot keep what a retry needs (MariaDB: a
        payload over ``max_allowed_packet``); the caller dead-letters a dead one."""
        ...

    async def dead_letter(self, message: Message, attempts: int, reason: str) -> None:
        """Add (or, when another consumer gave up too, update) the consume dead letter."""
        ...

    async def lock_failure(self, consumer: str, message_id: str) -> PendingFailure | None:
        """Take a due failure for a re-drive; ``None`` when another instance has it or it is
        no longer due."""
        ...

    async def delete_failure(self, seq: int) -> None:
        """Forget a failure (handled now, or handled elsewhere)."""
        ...

    async def update_failure(self, seq: int, attempts: int, failure: ConsumeFailure) -> None:
        """A re-drive failed again: retry after ``failure.retry_in`` seconds, or give up
        (``None``: the failure row becomes ``dead``)."""
        ...

    async def set_done(self, consumer: str, message_id: str, retention: float) -> None:
        """The message is handled or given up: its inbox row expires after ``retention``."""
        ...


class InboxSession(Protocol):
    """One connection of the inbox, held while a chunk of deliveries (or a round of re-drives)
    is processed; its transactions run one after the other."""

    def transaction(self) -> AbstractAsyncContextManager[InboxTransaction]:
        """A transaction for a batch of first deliveries (each handler in its own savepoint,
        see :meth:`InboxTransaction.run_handler`) or for one re-drive; committed when the
        block ends, rolled back when it raises."""
        ...

    async def due_failures(self, consumer: str, limit: int) -> list[str]:
        """Ids of up to ``limit`` due failed consumptions, soonest first, only the earliest
        waiting message of each key."""
        ...

    async def count_retries(self, count: int) -> None:
        """Add ``count`` re-drive attempts to the figures of the next sweep report."""
        ...


@runtime_checkable
class InboxStore(Protocol):
    """Where consumers record what they processed, in the transaction of the handler's writes.

    The pair (consumer, message id) is inserted in the same transaction as everything the
    handler writes through the connection it is given, so a redelivered message finds the pair
    and has no second effect. Inbox rows are kept ``retention_seconds`` after the message was
    handled (or given up), then purged by the sweep. What happens to a delivery is decided
    once, in :mod:`outboxer.inbox.consume`; a store offers only sessions of SQL primitives.
    """

    def inbox_session(self) -> AbstractAsyncContextManager[InboxSession]:
        """A connection for a chunk of deliveries; driver errors leave it as ``StoreError``."""
        ...


@runtime_checkable
class Store(RelayStore, AdminStore, InboxStore, Protocol):
    """Every port a store offers its users (the relay, operators, consumers), as one type.

    The in-memory fake (:class:`outboxer.testing.InMemoryStore`) is one. Inside outboxer each
    component asks for the narrow port it uses instead.
    """


@runtime_checkable
class DatabaseStore(Store, SchemaStore, Protocol):
    """A store in a database, as ``outboxer.stores.open_store`` returns it: every port, schema
    management, and a lifecycle (``async with store:`` opens and closes its connections)."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...
