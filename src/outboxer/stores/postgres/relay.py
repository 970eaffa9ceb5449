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
from outboxer.stores.postgres.connection import PostgresPart

__all__ = ["FRONT_PER_MESSAGE", "KEYS_PER_MESSAGE", "PostgresRelay"]

#: An ordered claim walks the front of the table first: this many values of seq per message of
#: the batch from the oldest row, plus a batch's worth for each of the relay's own batches in
#: flight (``behind``), which sit at the front too. Room for the batches in flight and the next.
FRONT_PER_MESSAGE = 4

#: When the front leaves the batch short, the claim reads the heads of at most this many keys
#: per message (a skip scan of the (key, seq) index); with more keys it walks on behind the front
#: (claimable rows then lie soon behind it). See ``claim_ordered`` in sql/queries.sql.
KEYS_PER_MESSAGE = 4


class PostgresRelay(PostgresPart):
    """The relay's port (:class:`~outboxer.ports.RelayStore`) on PostgreSQL."""

    #: Whether the last claim came back short (fewer rows than its limit): the relay was idle
    #: or lightly loaded, its plans may be a small table's, so the next claim checks the
    #: outbox's size first (:class:`PlanWatch`; one round trip, full batches never look).
    _claim_short = True

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
                await self.outbox_plans.check(conn)
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
