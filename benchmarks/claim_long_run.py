"""An ordered PostgreSQL claim behind one blocked key with a long run (ADR 0010, last bullet).

For each run length R: R messages of one key ``K``, written first (the oldest rows, so every
walk of the table from its front passes them), then 15,000 messages over 5,000 other keys
(key = n % 5,000, three rows each, ≈120-byte payloads): at least ``4 × batch`` keys, so the
claim looks behind its front through the ``seq`` index. One binary COPY, then VACUUM ANALYZE.
K's head is then blocked, one of two ways:

- ``scheduled``: K's head is written for an hour from now (``available_at``);
- ``leased``: another relay holds K's head (its window of four ordered claims of 500: K's
  first 2,000 rows).

With a run of 0 there is no K: ``leased`` is then the usual case of a busy outbox with many keys
(another relay's batches in flight fill the front, every key behind it free), which must not get
slower; ``scheduled`` delays one row of one key.

and one ordered claim of 500 by a relay is timed (the median of ``ROUNDS``): it must claim 500
rows of the other keys and none of K's (released again after each timing). With
``OUTBOXER_BENCH_BASELINE=<git revision>`` the ``claim_ordered`` statement of that revision is
timed too, interleaved with the current store's claim on the same table (new, old, new, old
...): the figures are ratios from one run.

Run: ``.venv/bin/python -m benchmarks.claim_long_run [20000 100000 300000]``
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from dataclasses import replace
from typing import Any

from benchmarks.claim_blocked import baseline_claim, copy_keys, interleaved, released
from benchmarks.common import PG_URL, fresh_schema, save
from outboxer.config import TableNames
from outboxer.ports import Claim, ClaimRequest, Settlement
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.postgres.relay import FRONT_PER_MESSAGE, KEYS_PER_MESSAGE

RUNS = (20_000, 100_000, 300_000)
KEYS = 5000
PER_KEY = 3
BATCH = 500
ROUNDS = int(os.environ.get("OUTBOXER_BENCH_ROUNDS", "5"))
BASELINE = os.environ.get("OUTBOXER_BENCH_BASELINE")


def wrong(keys: list[str | None]) -> str | None:
    """What is wrong with a claim of these keys: it must take a batch of the other keys."""
    if len(keys) != BATCH or "K" in keys:
        return f"claimed {len(keys)} rows, {keys.count('K')} of K"
    return None


async def run(length: int, how: str) -> dict[str, Any]:
    async with fresh_schema(f"bench_run_{uuid.uuid4().hex[:6]}") as schema:
        names = TableNames(schema=schema)
        async with PostgresStore(PG_URL, names) as store:
            await store.migrate()
            filled = time.perf_counter()
            await copy_keys(schema, ["K"] * length + [str(n % KEYS) for n in range(KEYS * PER_KEY)])
            fill_s = time.perf_counter() - filled
            if how == "scheduled":
                async with store.db.connection() as conn:
                    await conn.execute(
                        f"UPDATE \"{schema}\".outbox SET available_at = now() + interval '1 hour'"
                        f' WHERE seq = (SELECT min(seq) FROM "{schema}".outbox)'
                    )
            else:
                holder = ClaimRequest(
                    limit=BATCH, lease_seconds=3600, ordered=True, relay_id="holder"
                )
                held: list[Claim] = []
                for _ in range(4):  # as a relay does: its batches in flight are "behind"
                    behind = frozenset(claim.token for claim in held)
                    held.append(await store.claim_batch(replace(holder, behind=behind)))
                keys = {m.key for claim in held for m in claim.messages}
                assert sum(len(claim.messages) for claim in held) == 4 * BATCH
                assert length < 4 * BATCH or keys == {"K"}, "the holder leases K's head"
            request = ClaimRequest(limit=BATCH, lease_seconds=30, ordered=True, relay_id="bench")

            async def new() -> list[str | None]:
                claim = await store.claim_batch(request)
                if claim.messages:  # released again, for the next claim
                    await store.settle(claim, Settlement(released=[m.id for m in claim.messages]))
                return [m.key for m in claim.messages]

            old_sql = baseline_claim(BASELINE, names) if BASELINE else None

            async def old() -> list[str | None]:
                # as the store's claim_batch of that revision did (ADR 0010's arguments)
                assert old_sql is not None
                front, keys = BATCH * FRONT_PER_MESSAGE, BATCH * KEYS_PER_MESSAGE
                args: tuple[Any, ...] = (BATCH, 1, "bench", 30.0, False, [], front, keys)
                async with store.db.connection() as conn:
                    rows = await conn.fetch(old_sql, *args)
                return await released(store, 1, rows)

            timings = await interleaved(new, old if old_sql else None, wrong)
    result = {"run": length, "blocked_by": how, "fill_s": round(fill_s, 1), **timings}
    print(result, flush=True)
    return result


async def main(runs: list[int]) -> dict[str, Any]:
    rows = [await run(length, how) for length in runs for how in ("scheduled", "leased")]
    result = {"keys": KEYS, "per_key": PER_KEY, "rounds": ROUNDS, "rows": rows}
    save("claim_long_run", result)
    return result


if __name__ == "__main__":
    asyncio.run(main([int(a) for a in sys.argv[1:]] or list(RUNS)))
