"""What the relay asks of SQLite: claims, settlements, the relay registry.

A claim is a ``BEGIN IMMEDIATE`` transaction: relays in several processes serialize on the
database lock instead of skipping each other's rows, and leased rows are excluded by their
claim token exactly as on PostgreSQL. There is no NOTIFY: the relay polls (adaptively) for
work committed by other processes.
"""

from __future__ import annotations

import json
import os
from typing import Any

from outboxer.ports import Claim, ClaimRequest, RelayInfo, Settlement
from outboxer.stores._common import claim_from_rows, no_doorbell
from outboxer.stores.sqlite.connection import SqlitePart

__all__ = ["SqliteRelay"]


class SqliteRelay(SqlitePart):
    """The relay's port (:class:`~outboxer.ports.RelayStore`) on SQLite."""

    async def claim_batch(self, request: ClaimRequest) -> Claim:
        token = int.from_bytes(os.urandom(8), "big") >> 1
        params = {
            "token": token,
            "relay": request.relay_id,
            "lease": request.lease_seconds,
            "limit": request.limit,
            "hold": request.hold_dead_keys,
            "behind": json.dumps(sorted(request.behind) if request.ordered else []),
        }
        mode = "ordered" if request.ordered else "unordered"
        async with self.db.transaction() as conn:
            # A suspect (crash isolation) goes alone: only when there is none, a batch.
            async with conn.execute(self.q[f"claim_suspect_{mode}"], params) as cur:
                rows = list(await cur.fetchall())
            if not rows:
                async with conn.execute(self.q[f"claim_{mode}"], params) as cur:
                    rows = list(await cur.fetchall())
        return claim_from_rows(token, rows)

    async def settle(self, claim: Claim, settlement: Settlement) -> None:
        token = claim.token
        steps: list[tuple[str, dict[str, Any]]] = []
        if settlement.published:
            steps.append(("ack", {"ids": json.dumps(settlement.published), "token": token}))
        if settlement.retries:
            items = [[r.id, r.delay, r.reason] for r in settlement.retries]
            steps.append(("retry", {"items": json.dumps(items), "token": token}))
        if settlement.dead:
            items_json = json.dumps([list(d) for d in settlement.dead_letters()])
            steps.append(("dead_letter_copy", {"items": items_json, "token": token}))
            steps.append(("dead_letter_delete", {"items": items_json, "token": token}))
        if settlement.released:
            steps.append(("release", {"ids": json.dumps(settlement.released), "token": token}))
        if not steps:
            return
        async with self.db.transaction() as conn:
            for name, params in steps:
                changed = (await conn.execute(self.q[name], params)).rowcount
                if name == "retry" and changed:
                    # The sweep reports publish retries: counted in the settle transaction.
                    await conn.execute(self.q["count_released"], {"released": changed})

    async def extend_lease(self, claim: Claim, lease_seconds: float) -> int:
        params = {
            "ids": json.dumps([m.id for m in claim.messages]),
            "token": claim.token,
            "lease": float(lease_seconds),
        }
        async with self.db.connection() as conn:
            extended: int = (await conn.execute(self.q["extend_lease"], params)).rowcount
        return extended

    async def release_expired_leases(self) -> int:
        async with self.db.transaction() as conn:
            released: int = (await conn.execute(self.q["release_expired"])).rowcount
            if released:
                await conn.execute(self.q["count_released"], {"released": released})
        return released

    async def wait_for_messages(self, timeout: float) -> bool:
        # No cross-process notification in SQLite: the relay's adaptive polling does the work.
        return await no_doorbell(timeout)

    async def heartbeat(self, relay: RelayInfo) -> None:
        params = {
            "relay_id": relay.relay_id,
            "hostname": relay.hostname,
            "pid": relay.pid,
            "started_at": relay.started_at.timestamp(),
        }
        async with self.db.connection() as conn:
            await conn.execute(self.q["heartbeat"], params)

    async def unregister(self, relay_id: str) -> None:
        async with self.db.connection() as conn:
            await conn.execute(self.q["unregister"], {"relay_id": relay_id})
