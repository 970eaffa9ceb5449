"""What the relay asks of PostgreSQL: claims, settlements, the doorbell, the relay registry.

Claims use ``FOR UPDATE SKIP LOCKED`` so any number of relays claim disjoint batches; every
settle statement is fenced by the claim token; acknowledged rows are deleted in one statement
per batch. A statement-level trigger sends a NOTIFY at commit (the doorbell) and the store
LISTENs on one pooled connection; polling remains the fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

import asyncpg

from outboxer.ports import Claim, ClaimRequest, RelayInfo, Settlement
from outboxer.stores._common import claim_from_rows, wait_for_doorbell
from outboxer.stores.postgres.connection import Conn, PostgresDatabase, PostgresPart

__all__ = ["Doorbell", "PostgresRelay"]

log = logging.getLogger("outboxer.store.postgres")


class Doorbell:
    """LISTEN on the outbox's channel, on one connection held from the pool while relays wait.

    If LISTEN cannot be set up (or its connection died, e.g. in a database restart), it is set
    up again at the next wait; meanwhile the relay's polling carries on alone.
    """

    def __init__(self, db: PostgresDatabase, channel: str) -> None:
        self._db = db
        self._channel = channel
        self._listener: Conn | None = None
        self._rung = asyncio.Event()

    async def wait(self, timeout: float) -> bool:
        if not self._listening():
            await self._listen()
        return await wait_for_doorbell(self._rung, timeout)

    async def close(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.remove_listener(self._channel, self._ring)
                await self._db.pool.release(self._listener, timeout=2)
            self._listener = None

    def _listening(self) -> bool:
        if self._listener is None:
            return False
        try:
            return not self._listener.is_closed()
        except asyncpg.InterfaceError:  # the pool took the broken connection back (restart)
            return False

    async def _listen(self) -> None:
        """Hold one pooled connection for LISTEN; on failure polling carries on alone."""
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._db.pool.release(self._listener, timeout=2)
        self._listener = None
        try:
            conn = await self._db.pool.acquire()
        except Exception as exc:  # noqa: BLE001 - polling is the documented fallback
            log.warning("LISTEN unavailable, polling only: %s", exc)
            return
        try:
            await conn.add_listener(self._channel, self._ring)
        except BaseException as exc:
            # Failed, or cancelled (the relay stops waiting whenever a batch finishes): the
            # connection goes back to the pool, or each database restart would eat one.
            with contextlib.suppress(Exception):
                await self._db.pool.release(conn, timeout=2)
            if not isinstance(exc, Exception):
                raise
            log.warning("LISTEN unavailable, polling only: %s", exc)
            return
        self._listener = conn

    def _ring(self, *_: object) -> None:
        self._rung.set()


class PostgresRelay(PostgresPart):
    """The relay's port (:class:`~outboxer.ports.RelayStore`) on PostgreSQL."""

    doorbell: Doorbell

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
            args += (request.hold_dead_keys,)
        async with self.db.connection() as conn:
            rows = await conn.fetch(query, *args)
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
        return await self.doorbell.wait(timeout)

    async def heartbeat(self, relay: RelayInfo) -> None:
        async with self.db.connection() as conn:
            await conn.execute(
                self.q["heartbeat"], relay.relay_id, relay.hostname, relay.pid, relay.started_at
            )

    async def unregister(self, relay_id: str) -> None:
        async with self.db.connection() as conn:
            await conn.execute(self.q["unregister"], relay_id)
