"""What the relay asks of PostgreSQL: claims, settlements, the relay registry.

Claims use ``FOR UPDATE SKIP LOCKED`` so any number of relays claim disjoint batches; every
settle statement is fenced by the claim token; acknowledged rows are deleted in one statement
per batch. There is no doorbell: an idle relay polls adaptively (docs/adr/0007-polling-wakeup.md),
because a NOTIFY at every inserting commit serialized the commits of the application's writers.
"""

from __future__ import annotations

import os
from typing import Any

from outboxer.ports import Claim, ClaimRequest, RelayInfo, Settlement
from outboxer.stores._common import claim_from_rows, no_doorbell
from outboxer.stores.postgres.connection import Conn, PostgresPart

__all__ = ["FRONT_PER_MESSAGE", "KEYS_PER_MESSAGE", "REPLAN_GROWTH", "PostgresRelay"]

#: An ordered claim walks the front of the table first: this many values of seq per message of
#: the batch from the oldest row, plus a batch's worth for each of the relay's own batches in
#: flight (``behind``), which sit at the front too. Room for the batches in flight and the next.
FRONT_PER_MESSAGE = 4

#: When the front leaves the batch short, the claim reads the heads of at most this many keys
#: per message (a skip scan of the (key, seq) index); with more keys it walks on behind the front
#: (claimable rows then lie soon behind it). See ``claim_ordered`` in sql/queries.sql.
KEYS_PER_MESSAGE = 4


#: The store's connections keep one generic plan per statement (``plan_cache_mode``, see
#: connection.py), made at its first execution on the connection and kept until the table is
#: analyzed (or asyncpg re-prepares it, after 5 min). The claim's plan made on an empty or tiny
#: outbox scans it sequentially everywhere (a vacuumed empty table has 0 pages: a seq scan costs
#: nothing), also for each row (a suspect's older rows, a front row's lock by ctid): on a burst of
#: 50,000 rows an ordered claim of 500 took 55 s instead of 20 ms (benchmarks.claim_stale_plan).
#: So a claim that follows a short one (the relay was idle or lightly loaded: its plans may be a
#: small table's) first reads the table's size, and when it has grown this many times over the
#: smallest size seen since the plans were last dropped (at least ``_SMALL`` bytes), drops the
#: pool's cached statements: the claim is planned again, on the table as it is now. A plan made
#: on a large table stays good on a small one, so busy claims (full batches) never look.
REPLAN_GROWTH = 8

#: 16 pages: below this, a table counts as this big (an empty outbox has 0 bytes).
_SMALL = 16 * 8192


class PostgresRelay(PostgresPart):
    """The relay's port (:class:`~outboxer.ports.RelayStore`) on PostgreSQL."""

    #: Whether the last claim came back short (fewer rows than its limit): the next looks at
    #: the table's size first. True until a claim came back full.
    _claim_short = True
    #: The smallest outbox size (bytes) the claims saw since the plans were dropped.
    _smallest_seen: int | None = None

    async def _replan_if_grown(self, conn: Conn) -> None:
        """Drop the pool's cached statements when the outbox grew ``REPLAN_GROWTH`` times
        since the smallest size seen: the plans made on it may be a tiny table's."""
        size = int(await conn.fetchval(self.q["outbox_size"]))
        seen = self._smallest_seen
        if seen is not None and size >= REPLAN_GROWTH * max(seen, _SMALL):
            # asyncpg's public way to forget every connection's prepared statements (the pool's
            # when the connection is a pool's); each is prepared again at its next use
            await conn.reload_schema_state()
            seen = None
        self._smallest_seen = size if seen is None else min(seen, size)

    async def claim_batch(self, request: ClaimRequest) -> Claim:
        token = int.from_bytes(os.urandom(8), "big") >> 1  # positive bigint
        query = self.q["claim_ordered" if request.ordered else "claim_unordered"]
        args: tuple[Any, ...] = (
            request.limit,
            token,
            request.relay_id,
            float(request.lease_seconds),
        )
        if request.ordered:
            front = request.limit * (FRONT_PER_MESSAGE + len(request.behind))
            keys = request.limit * KEYS_PER_MESSAGE
            args += (request.hold_dead_keys, list(request.behind), front, keys)
        async with self.db.connection() as conn:
            if self._claim_short:
                await self._replan_if_grown(conn)
            rows = await conn.fetch(query, *args)
        self._claim_short = len(rows) < request.limit
        return claim_from_rows(token, rows)

    async def settle(self, claim: Claim, settlement: Settlement) -> None:
        statements: list[tuple[str, tuple[Any, ...]]] = []
        if settlement.published:
            statements.append((self.q["ack"], (settlement.published, claim.token)))
        if settlement.retries:
            r = settlement.retries
            statements.append(
                (
                    self.q["retry"],
                    ([x.id for x in r], [x.delay for x in r], [x.reason for x in r], claim.token),
                )
            )
        if settlement.dead:
            ids, reasons = zip(*settlement.dead_letters(), strict=True)
            statements.append((self.q["dead_letter"], (list(ids), list(reasons), claim.token)))
        if settlement.released:
            statements.append((self.q["release"], (settlement.released, claim.token)))
        if not statements:
            return
        async with self.db.connection() as conn:
            if len(statements) == 1:  # the common case: one statement, one round trip
                sql, args = statements[0]
                await conn.execute(sql, *args)
                return
            async with conn.transaction():
                for sql, args in statements:
                    await conn.execute(sql, *args)

    async def extend_lease(self, claim: Claim, lease_seconds: float) -> int:
        ids = [m.id for m in claim.messages]
        async with self.db.connection() as conn:
            status = await conn.execute(
                self.q["extend_lease"], ids, claim.token, float(lease_seconds)
            )
        return int(status.split()[-1])

    async def release_expired_leases(self) -> int:
        async with self.db.connection() as conn:
            return int(await conn.fetchval(self.q["release_expired"]))

    async def wait_for_messages(self, timeout: float) -> bool:
        return await no_doorbell(timeout)  # no NOTIFY since schema 6 (docs/adr/0007)

    async def heartbeat(self, relay: RelayInfo) -> None:
        async with self.db.connection() as conn:
            await conn.execute(
                self.q["heartbeat"], relay.relay_id, relay.hostname, relay.pid, relay.started_at
            )

    async def unregister(self, relay_id: str) -> None:
        async with self.db.connection() as conn:
            await conn.execute(self.q["unregister"], relay_id)
