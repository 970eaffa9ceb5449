"""Claims after a burst on a relay whose claim plans were made on an empty outbox.

The store's connections keep one generic plan per statement (``plan_cache_mode``), made at its
first execution. Two stores on one outbox, each with a pool of one connection: ``fixed`` (this
revision) and ``before`` (its size check before a claim switched off, as before it). The outbox
(autovacuum off, so no analyze invalidates a plan meanwhile) is vacuumed empty, and both claim
it empty (ordered and unordered) ``IDLE`` times, interleaved: the cost of the check on an idle
relay's claims. Then N messages over K keys arrive in one binary COPY (not analyzed), and each
store claims ``ROUNDS`` batches of each kind, interleaved (fixed, before, fixed, before ...),
each batch released again: ``before`` still runs the plans made on the empty table. Last, the
outbox is emptied and vacuumed again (which invalidates both stores' plans: PostgreSQL plans
again after a vacuum or analyze of the table), and the idle claims are timed once more: a
second sample of the check's cost.

Run: ``.venv/bin/python -m benchmarks.claim_stale_plan [N [KEYS [BATCH]]]`` (20,000 1,000 500:
the stale ordered claim takes ≈ 13 s there, a larger N longer still: it reads the table once per
row).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any

import asyncpg

from benchmarks.common import PAYLOAD, PG_URL, fresh_schema, save
from outboxer._ids import new_message_id
from outboxer.config import TableNames
from outboxer.ports import ClaimRequest, Settlement
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.postgres.connection import PlanWatch


class _Unwatched(PlanWatch):
    """As before the watch: the plans are never dropped."""

    async def check(self, conn: Any, every: float = 0.0) -> None:
        return None


ROUNDS = int(os.environ.get("OUTBOXER_BENCH_ROUNDS", "3"))
IDLE = 300


async def copy_unanalyzed(schema: str, count: int, keys: int) -> None:
    conn = await asyncpg.connect(PG_URL)
    try:
        body = json.dumps(PAYLOAD).encode()
        records = [
            (new_message_id(), "orders", str(n % keys), "OrderCreated", body) for n in range(count)
        ]
        await conn.copy_records_to_table(
            "outbox",
            records=records,
            columns=["id", "topic", "key", "type", "payload"],
            schema_name=schema,
        )
    finally:
        await conn.close()


async def claim_ms(store: PostgresStore, request: ClaimRequest) -> tuple[float, int]:
    started = time.perf_counter()
    claim = await store.claim_batch(request)
    elapsed = (time.perf_counter() - started) * 1000
    if claim.messages:
        await store.settle(claim, Settlement(released=[m.id for m in claim.messages]))
    return elapsed, len(claim.messages)


async def idle_ms(stores: dict[str, PostgresStore], ordered: bool) -> dict[str, float]:
    """Median ms of an empty claim of each store, interleaved."""
    request = ClaimRequest(limit=500, lease_seconds=30, ordered=ordered, relay_id="bench")
    times: dict[str, list[float]] = {name: [] for name in stores}
    for _ in range(IDLE):
        for name, store in stores.items():
            ms, got = await claim_ms(store, request)
            assert got == 0
            times[name].append(ms)
    return {name: round(statistics.median(t), 3) for name, t in times.items()}


async def main(count: int, keys: int, batch: int) -> dict[str, Any]:
    result: dict[str, Any] = {"messages": count, "keys": keys, "batch": batch}
    async with fresh_schema(f"bench_stale_{uuid.uuid4().hex[:6]}") as schema:
        names = TableNames(schema=schema)
        fixed = PostgresStore(PG_URL, names, max_connections=1)
        before = PostgresStore(PG_URL, names, max_connections=1)

        before.outbox_plans = _Unwatched("")
        stores = {"fixed": fixed, "before": before}
        async with fixed, before:
            await fixed.migrate()
            admin = await asyncpg.connect(PG_URL)
            try:
                table = f'"{schema}".outbox'
                await admin.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
                await admin.execute(f"VACUUM ANALYZE {table}")
                for ordered in (True, False):
                    kind = "ordered" if ordered else "unordered"
                    result[f"idle_{kind}_ms"] = await idle_ms(stores, ordered)
                await copy_unanalyzed(schema, count, keys)
                for ordered in (True, False):
                    kind = "ordered" if ordered else "unordered"
                    request = ClaimRequest(
                        limit=batch, lease_seconds=30, ordered=ordered, relay_id="bench"
                    )
                    rows = []
                    for n in range(ROUNDS):
                        new, got_new = await claim_ms(fixed, request)
                        old, got_old = await claim_ms(before, request)
                        assert got_new == got_old == batch, (got_new, got_old)
                        rows.append(
                            {
                                "claim": n,
                                "fixed_ms": round(new, 1),
                                "before_ms": round(old, 1),
                                "before_over_fixed": round(old / new, 1),
                            }
                        )
                        print(kind, rows[-1], flush=True)
                    result[f"burst_{kind}"] = rows
                await admin.execute(f"DELETE FROM {table}")
                await admin.execute(f"VACUUM ANALYZE {table}")
                for ordered in (True, False):
                    kind = "ordered" if ordered else "unordered"
                    result[f"idle_after_{kind}_ms"] = await idle_ms(stores, ordered)
            finally:
                await admin.close()
    for key, value in result.items():
        if key.startswith("idle"):
            print(key, value, flush=True)
    save("claim_stale_plan", result)
    return result


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    count, keys, batch = (args + [20_000, 1_000, 500][len(args) :])[:3]
    asyncio.run(main(count, keys, batch))
