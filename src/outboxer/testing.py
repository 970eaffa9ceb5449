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
import datetime as dt
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from outboxer.errors import ConfigurationError, NotFound, PublishError
from outboxer.message import Message
from outboxer.outbox import Outbox
from outboxer.ports import (
    Claim,
    DeadLetter,
    DeadLetterFilter,
    DeadLetterPage,
    OutboxStats,
    RelayInfo,
    Settlement,
    SweepReport,
)
from outboxer.stores._common import check_limit, decode_headers, parse_cursor

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


class InMemoryStore:
    """A :class:`~outboxer.ports.Store` in a dict, with the PostgreSQL store's semantics."""

    def __init__(self) -> None:
        self._rows: dict[str, _Row] = {}
        self._dead: dict[str, tuple[int, DeadLetter]] = {}
        self._relays: dict[str, RelayInfo] = {}
        self._last_sweep: SweepReport | None = None
        self._released_since_sweep = 0
        self._seq = 0
        self._doorbell = asyncio.Event()
        self._outbox = Outbox()

    async def __aenter__(self) -> InMemoryStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    def enqueue(self, topic: str, payload: object, **options: Any) -> str:
        """Add a message as ``outboxer.enqueue`` would (committed at once)."""
        row = self._outbox.row(topic, payload, **options)
        if row.id in self._rows:
            raise ConfigurationError(f"duplicate message id {row.id!r}")
        now = _now()
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

    async def claim_batch(
        self, *, limit: int, lease_seconds: float, ordered: bool, relay_id: str
    ) -> Claim:
        now = _now()
        token = int.from_bytes(os.urandom(8), "big") >> 1
        claimed: list[Message] = []
        blocked: set[str] = set()  # keys with an older row that is leased or waiting
        for row in sorted(self._rows.values(), key=lambda r: r.seq):
            if len(claimed) >= limit:
                break
            key = row.message.key
            if row.token is not None or row.available_at > now:
                if key is not None:
                    blocked.add(key)
                continue
            if ordered and key is not None and key in blocked:
                continue
            row.token, row.locked_by = token, relay_id
            row.locked_until = now + dt.timedelta(seconds=lease_seconds)
            claimed.append(replace(row.message, available_at=row.available_at))
        return Claim(token=token, messages=claimed)

    def _owned(self, ids: Sequence[str], token: int) -> list[_Row]:
        return [r for i in ids if (r := self._rows.get(i)) is not None and r.token == token]

    async def settle(self, claim: Claim, settlement: Settlement) -> None:
        now = _now()
        for row in self._owned(settlement.published, claim.token):
            del self._rows[row.message.id]
        reasons = {r.id: r for r in settlement.retries}
        for row in self._owned(list(reasons), claim.token):
            retry = reasons[row.message.id]
            row.message = replace(row.message, attempts=row.message.attempts + 1)
            row.available_at = now + dt.timedelta(seconds=retry.delay)
            row.last_error, row.token, row.locked_by, row.locked_until = (
                retry.reason,
                None,
                None,
                None,
            )
        dead = dict(settlement.dead)
        for row in self._owned(list(dead), claim.token):
            m = row.message
            del self._rows[m.id]
            self._seq += 1
            self._dead[m.id] = (
                self._seq,
                DeadLetter(
                    id=m.id,
                    topic=m.topic,
                    key=m.key,
                    type=m.type,
                    payload=m.payload,
                    content_type=m.content_type,
                    headers=m.headers,
                    created_at=m.created_at,
                    dead_lettered_at=now,
                    failure_reason=dead[m.id],
                    attempts=m.attempts + 1,
                ),
            )
        for row in self._owned(settlement.released, claim.token):
            row.token, row.locked_by, row.locked_until = None, None, None

    async def release_expired_leases(self) -> int:
        now = _now()
        expired = [
            r
            for r in self._rows.values()
            if r.token is not None and r.locked_until is not None and r.locked_until < now
        ]
        for row in expired:
            row.last_error = f"lease of relay {row.locked_by} expired"
            row.token, row.locked_by, row.locked_until = None, None, None
        self._released_since_sweep += len(expired)
        return len(expired)

    async def sweep(
        self, *, sweeper: str, interval: float, retention_seconds: float, batch_size: int
    ) -> SweepReport | None:
        now = _now()
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

        def failures(direction: str) -> int:
            return sum(
                d.direction == direction and d.dead_lettered_at >= since
                for _, d in self._dead.values()
            )

        self._last_sweep = SweepReport(
            started_at=now,
            completed_at=_now(),
            swept_by=sweeper,
            publish_retries=self._released_since_sweep,
            publish_failures=failures("publish"),
            consume_retries=0,
            consume_failures=failures("consume"),
            purged=purged,
        )
        self._released_since_sweep = 0
        return self._last_sweep

    async def last_sweep(self) -> SweepReport | None:
        return self._last_sweep

    async def wait_for_messages(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._doorbell.wait(), timeout)
        except TimeoutError:
            return False
        self._doorbell.clear()
        return True

    async def heartbeat(self, relay: RelayInfo) -> None:
        self._relays[relay.relay_id] = replace(relay, heartbeat_at=_now())

    async def unregister(self, relay_id: str) -> None:
        self._relays.pop(relay_id, None)

    async def stats(self) -> OutboxStats:
        now = _now()
        rows = list(self._rows.values())
        oldest = min((r.message.created_at for r in rows), default=None)
        live = {r.relay_id for r in self._relays.values() if (now - r.heartbeat_at).seconds < 15}
        return OutboxStats(
            last_sweep=self._last_sweep,
            unowned_in_flight=sum(r.token is not None and r.locked_by not in live for r in rows),
            pending=sum(r.token is None for r in rows),
            in_flight=sum(r.token is not None for r in rows),
            dead_letters=len(self._dead),
            oldest_pending_age_seconds=(now - oldest).total_seconds() if oldest else None,
            relays=[
                replace(relay, in_flight=sum(r.locked_by == relay.relay_id for r in rows))
                for relay in self._relays.values()
            ],
        )

    def _matching(self, flt: DeadLetterFilter) -> list[tuple[int, DeadLetter]]:
        def match(d: DeadLetter) -> bool:
            return (
                (flt.topic is None or d.topic == flt.topic)
                and (flt.type is None or d.type == flt.type)
                and (flt.key is None or d.key == flt.key)
                and (flt.ids is None or d.id in flt.ids)
            )

        return sorted((v for v in self._dead.values() if match(v[1])), key=lambda v: -v[0])

    async def list_dead_letters(
        self, flt: DeadLetterFilter, *, limit: int, cursor: str | None
    ) -> DeadLetterPage:
        limit = check_limit(limit)
        after = parse_cursor(cursor)
        found = [v for v in self._matching(flt) if after is None or v[0] < after]
        page = found[:limit]
        next_cursor = str(page[-1][0]) if len(found) > limit else None
        return DeadLetterPage([d for _, d in page], next_cursor)

    async def get_dead_letter(self, dead_letter_id: str) -> DeadLetter:
        try:
            return self._dead[dead_letter_id][1]
        except KeyError:
            raise NotFound(f"no dead letter with id {dead_letter_id!r}") from None

    async def replay_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        replayed = []
        for _, d in reversed(self._matching(flt)):
            if d.direction != "publish":
                continue
            del self._dead[d.id]
            self._add(
                Message(
                    id=d.id,
                    topic=d.topic,
                    payload=d.payload,
                    key=d.key,
                    type=d.type,
                    headers=d.headers,
                    content_type=d.content_type,
                    created_at=d.created_at,
                    available_at=_now(),
                )
            )
            replayed.append(d.id)
        return replayed

    async def purge_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        ids = [d.id for _, d in self._matching(flt)]
        for i in ids:
            del self._dead[i]
        return ids


class RecordingPublisher:
    """A :class:`~outboxer.ports.Publisher` that records what it was given.

    Args:
        fail: Optional function deciding a message's fate: return ``None`` to acknowledge, or a
            ``PublishError`` to report (it is called on every attempt).
    """

    def __init__(self, fail: Callable[[Message], PublishError | None] | None = None) -> None:
        self.messages: list[Message] = []
        self.attempts: list[Message] = []
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
