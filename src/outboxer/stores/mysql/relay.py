"""What the relay asks of the MySQL store: claims, settlements, leases, the doorbell, the
registry.

A claim is a few round trips in one short transaction: lock the candidates (``FOR UPDATE SKIP
LOCKED``, full rows returned), then lease the kept ones and commit (MySQL has no ``UPDATE ...
RETURNING``). Ordered claims decide here which candidates to keep, from the ``head`` and
``next_seq`` the query returns (``claim_ordered`` in queries.sql, docs/adr/0003), and look at the
front of the table first, then behind it from the claimable key heads (``claim_heads``): a claim
never walks the rows of keys in flight (with every key in flight, a scan from the front read the
whole backlog to find nothing).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from outboxer.ports import Claim, ClaimRequest, RelayInfo, Settlement
from outboxer.stores._common import claim_from_rows
from outboxer.stores.mysql.connection import (
    Conn,
    MysqlPart,
    execute,
    fetch_all,
    fetch_value,
    retried_on_deadlock,
)

__all__ = ["MysqlRelay", "keep_in_order", "seq_ranges", "text_row", "utc"]

#: How often an idle relay's doorbell looks for a new row (there is no LISTEN/NOTIFY).
DOORBELL_POLL = 0.02

#: The ordered claim reads other transactions' uncommitted rows (the commit-order gate).
_BEGIN_ORDERED = "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED; START TRANSACTION"

#: Columns stored as VARBINARY (compared byte by byte) that outboxer hands out as text.
_TEXT_COLUMNS = ("id", "topic", "key", "type", "content_type", "consumer", "message_id")


def text_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` with its VARBINARY text columns decoded from UTF-8."""
    out = dict(row)
    for column in _TEXT_COLUMNS:
        value = out.get(column)
        if isinstance(value, bytes | bytearray):
            out[column] = bytes(value).decode()
    return out


def utc(value: dt.datetime) -> dt.datetime:
    """A naive UTC datetime, as DATETIME(6) columns hold them."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


def micros(seconds: float) -> int:
    return max(0, round(float(seconds) * 1_000_000))


#: An ordered claim looks at the front of the table first: this many rows (of seq) per message,
#: from the oldest row. Room for a relay's window of batches in flight and the next batch.
FRONT_PER_MESSAGE = 4

#: When the front is not enough, the ordered claim reads the heads of at most this many keys per
#: message. A table with more keys than that has claimable rows soon behind its front (a relay
#: leases at most its window of batches): the claim scans on from there.
KEYS_PER_MESSAGE = 4


def seq_ranges(heads: Sequence[int], width: int) -> str:
    """The SQL condition "seq in one of the ranges [head, head + width]", overlaps merged.

    A key's run (its rows claimable in one batch) is looked for in the ``width`` rows after its
    head; beyond, it waits for the next claim. Empty when there is no head.
    """
    spans: list[list[int]] = []
    for head in sorted(heads):
        if spans and head <= spans[-1][1] + 1:
            spans[-1][1] = head + width
        else:
            spans.append([head, head + width])
    return " OR ".join(f"o.seq BETWEEN {int(low)} AND {int(high)}" for low, high in spans)


def keep_in_order(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The candidates of an ordered claim that may be leased now.

    Unkeyed rows are always kept. A key's candidates are kept as a chain from its first one:
    the first only if it is the key's ``head`` (its oldest row, uncommitted rows included), each
    next one only if it is the ``next_seq`` of the one before (the row of the key that follows
    it): every earlier row of the key is in this batch. After the first candidate that fails,
    none of its key is kept. The probes are not read from one snapshot (``READ UNCOMMITTED``
    reads each row as it is at that instant), so a later candidate may pass where an earlier one
    did not, because a row of its key vanished (an acknowledgement committed) between the two
    reads: taking it would skip the earlier one.
    """
    expected: dict[bytes, int] = {}
    stopped: set[bytes] = set()
    kept = []
    for row in sorted(rows, key=lambda r: r["seq"]):
        key = row["key"]
        if key is None:
            kept.append(row)
            continue
        if key in stopped:
            continue
        if row["seq"] == expected.get(key, row["head"]):
            kept.append(row)
            expected[key] = row["next_seq"]
        else:
            stopped.add(key)
    return kept


class MysqlRelay(MysqlPart):
    """The relay's port (:class:`~outboxer.ports.RelayStore`) on MySQL."""

    _latest_seq: int | None = None

    async def claim_batch(self, request: ClaimRequest) -> Claim:
        # A deadlock victim leased nothing: claimed again now, not paused as for an outage.
        return await retried_on_deadlock(lambda: self._claim_once(request))

    async def _claim_once(self, request: ClaimRequest) -> Claim:
        token = int.from_bytes(os.urandom(8), "big") >> 1  # a positive BIGINT
        mode = "ordered" if request.ordered else "unordered"
        begin = _BEGIN_ORDERED if request.ordered else "START TRANSACTION"
        args: dict[str, Any] = {"limit": request.limit, "hold": request.hold_dead_keys}
        async with self.db.transaction(begin) as conn:
            # A suspect (crash isolation) goes alone: only when there is none, a batch.
            kept: list[dict[str, Any]] = await fetch_all(
                conn, self.q[f"claim_suspect_{mode}"], args
            )
            alone = bool(kept)
            if not alone and request.ordered:
                kept = await self._claim_ordered(conn, args, request.limit)
            elif not alone:
                kept = await fetch_all(conn, self.q["claim_unordered"], args)
            if kept:
                await execute(
                    conn,
                    self.q["claim_mark"],
                    {
                        "token": token,
                        "relay": request.relay_id,
                        "lease_us": micros(request.lease_seconds),
                        "seqs": tuple(row["seq"] for row in kept),
                        "alone": alone,
                    },
                )
        return claim_from_rows(token, [text_row(row) for row in kept])

    async def _claim_ordered(
        self, conn: Conn, args: dict[str, Any], limit: int
    ) -> list[dict[str, Any]]:
        """Lock the candidates of an ordered claim and return those to lease, in seq order.

        First the front of the table (``FRONT_PER_MESSAGE`` rows per message from its oldest
        row): enough when its keys are free, the usual case. Then, if that left the batch
        short, the rest: from the claimable heads (``claim_heads``), the keyed rows in the
        ranges that start at them and the unkeyed rows apart; or, with more keys than
        ``KEYS_PER_MESSAGE`` per message, everything behind the front. Rows locked twice are
        one candidate.
        """
        template = self.q["claim_ordered"]
        front = {**args, "front": limit * FRONT_PER_MESSAGE}
        rows = await fetch_all(
            conn, template.replace("{ranges}", self.q["claim_ordered_front"]), front
        )
        kept = keep_in_order(rows)
        if len(kept) == limit:
            return kept
        cap = limit * KEYS_PER_MESSAGE
        heads = await fetch_all(conn, self.q["claim_heads"], {**args, "keys": cap})
        if len(heads) >= cap:
            behind = template.replace("{ranges}", self.q["claim_ordered_behind_front"])
            rows += await fetch_all(conn, behind, front)
        else:
            taken = {row["key"] for row in kept}
            free = [h["head"] for h in heads if h["free"] and h["key"] not in taken]
            if free := sorted(free)[:limit]:
                keyed = f"o.`key` IS NOT NULL AND ({seq_ranges(free, limit)})"
                rows += await fetch_all(conn, template.replace("{ranges}", keyed), args)
            if any(h["key"] is None for h in heads):
                rows += await fetch_all(conn, self.q["claim_unkeyed"], args)
        unique = {row["seq"]: row for row in reversed(rows)}  # the first read of each row
        return keep_in_order(list(unique.values()))[:limit]

    async def settle(self, claim: Claim, settlement: Settlement) -> None:
        token = claim.token
        steps: list[tuple[str, dict[str, Any]]] = []
        if settlement.published:
            steps.append((self.q["ack"], {"ids": tuple(settlement.published), "token": token}))
        retry = self.q["retry"]
        if settlement.retries:
            items = json.dumps([[r.id, r.delay, r.reason] for r in settlement.retries])
            steps.append((retry, {"items": items, "token": token}))
        if settlement.dead:
            reasons = json.dumps([[i, reason] for i, reason in settlement.dead_letters()])
            ids = tuple(i for i, _ in settlement.dead)
            steps.append((self.q["dead_letter_copy"], {"items": reasons, "token": token}))
            steps.append((self.q["dead_letter_delete"], {"ids": ids, "token": token}))
        if settlement.released:
            steps.append((self.q["release"], {"ids": tuple(settlement.released), "token": token}))
        if len(steps) == 1 and not settlement.retries:  # the common case: one round trip
            async with self.db.connection() as conn:
                await execute(conn, *steps[0])
        elif steps:
            async with self.db.transaction() as conn:
                for sql, args in steps:
                    changed = await execute(conn, sql, args)
                    if sql is retry and changed:
                        # The sweep reports publish retries: counted in the settle transaction
                        # (only batches with a failure pay this statement).
                        await execute(conn, self.q["count_released"], {"count": changed})

    async def extend_lease(self, claim: Claim, lease_seconds: float) -> int:
        if not claim.messages:
            return 0
        args = {
            "ids": tuple(m.id for m in claim.messages),
            "token": claim.token,
            "lease_us": micros(lease_seconds),
        }
        async with self.db.connection() as conn:
            return await execute(conn, self.q["extend_lease"], args)

    async def release_expired_leases(self) -> int:
        async with self.db.transaction() as conn:
            released = await execute(conn, self.q["release_expired"])
            if released:
                await execute(conn, self.q["count_released"], {"count": released})
        return released

    async def wait_for_messages(self, timeout: float) -> bool:
        """Poll the newest row's seq (an index dive) every 20 ms until it changes.

        MySQL has no LISTEN/NOTIFY. A row committed late with a smaller seq than one already
        seen does not change the newest seq; the relay's own adaptive polling finds it.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            async with self.db.connection() as conn:
                seq = int(await fetch_value(conn, self.q["latest_seq"]) or 0)
            previous, self._latest_seq = self._latest_seq, seq
            if previous is not None and seq != previous:
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            await asyncio.sleep(min(DOORBELL_POLL, remaining))

    async def heartbeat(self, relay: RelayInfo) -> None:
        args = {
            "relay_id": relay.relay_id,
            "hostname": relay.hostname,
            "pid": relay.pid,
            "started_at": utc(relay.started_at),
        }
        async with self.db.connection() as conn:
            await execute(conn, self.q["heartbeat"], args)

    async def unregister(self, relay_id: str) -> None:
        async with self.db.connection() as conn:
            await execute(conn, self.q["unregister"], {"relay_id": relay_id})
