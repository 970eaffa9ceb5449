"""An ordered PostgreSQL claim while every key of the backlog is blocked (issue 14).

For each backlog size, N messages over 1,000 keys (key = n % 1,000, ≈120-byte payloads) are
loaded with one binary COPY and analyzed. Then every key is blocked, one of two ways:

- ``leased``: another relay holds every key's head (two ordered claims of 500, never settled);
- ``retry``: every key's head waits for a retry (those claims settled as retries 1 h away).

and one ordered claim of 500 by a second relay, which must find nothing, is timed (the median of
``ROUNDS``). ``free``: the same claim with no key blocked (it claims 500 rows, released again
after each timing), the usual case, which must not get slower. With
``OUTBOXER_BENCH_BASELINE=<git revision>`` the claim statement of that revision (its single
``claim_ordered`` statement, executed as its relay did) is timed too, interleaved with the
current store's claim on the same table (new, old, new, old ...): the figures are ratios from one
run. The pool runs with jit=off, as the store's does.

The normal case, for a comparison across revisions: ``python -m benchmarks.claim_blocked drain
N`` prints the msg/s of one relay (default settings, ordered, a null publisher) draining N
messages loaded the same way; run it alternately with ``PYTHONPATH`` on each revision's ``src``.

Run: ``.venv/bin/python -m benchmarks.claim_blocked [20000 100000 1000000]``
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from benchmarks.common import PAYLOAD, PG_URL, NullPublisher, drain_store, fresh_schema, save
from outboxer._ids import new_message_id
from outboxer.config import RelaySettings, TableNames
from outboxer.ports import ClaimRequest, Retry, Settlement
from outboxer.stores import _sql
from outboxer.stores._common import claim_from_rows
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.postgres.relay import FRONT_PER_MESSAGE, KEYS_PER_MESSAGE

SIZES = (20_000, 100_000, 1_000_000)
KEYS = 1000
ROUNDS = int(os.environ.get("OUTBOXER_BENCH_ROUNDS", "5"))
BASELINE = os.environ.get("OUTBOXER_BENCH_BASELINE")


async def copy_fill(schema: str, count: int, keys: int = KEYS) -> None:
    """``count`` rows (key = n % keys) in one binary COPY, then VACUUM ANALYZE."""
    await copy_keys(schema, [str(n % keys) for n in range(count)])


async def copy_keys(schema: str, keys: list[str]) -> None:
    """One row per key of ``keys`` (≈120-byte payloads), by binary COPY; then VACUUM ANALYZE."""
    conn = await asyncpg.connect(PG_URL)
    try:
        for start in range(0, len(keys), 100_000):
            records = [
                (
                    new_message_id(),
                    "orders",
                    key,
                    "OrderCreated",
                    json.dumps({**PAYLOAD, "order_id": start + i}).encode(),
                )
                for i, key in enumerate(keys[start : start + 100_000])
            ]
            await conn.copy_records_to_table(
                "outbox",
                records=records,
                columns=["id", "topic", "key", "type", "payload"],
                schema_name=schema,
            )
        await conn.execute(f'VACUUM ANALYZE "{schema}".outbox')
    finally:
        await conn.close()


def baseline_claim(revision: str, names: TableNames) -> str:
    """The ``claim_ordered`` statement of ``revision`` (one statement at every revision)."""
    text = subprocess.run(
        ["git", "show", f"{revision}:src/outboxer/stores/postgres/sql/queries.sql"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    parts = _sql._NAME.split(text)
    named = dict(zip(parts[1::2], parts[2::2], strict=False))
    return _sql.render(named["claim_ordered"].strip(), names)


async def released(store: PostgresStore, token: int, rows: list[Any]) -> list[str | None]:
    """The keys of a claim's rows (of a baseline statement), the rows released again."""
    claim = claim_from_rows(token, rows)
    if claim.messages:
        await store.settle(claim, Settlement(released=[m.id for m in claim.messages]))
    return [m.key for m in claim.messages]


async def interleaved(
    new: Callable[[], Awaitable[Any]],
    old: Callable[[], Awaitable[Any]] | None,
    check: Callable[[Any], str | None],
) -> dict[str, Any]:
    """Medians of ``ROUNDS`` timings of ``new`` and (when given) ``old``, interleaved (new, old,
    new, old ...) after one untimed run of each (the first plans and warms the cache); ``check``
    returns what is wrong with a claim's result, if anything."""

    async def timed(claim: Callable[[], Awaitable[Any]]) -> float:
        started = time.perf_counter()
        result = await claim()
        elapsed = time.perf_counter() - started
        if wrong := check(result):
            raise RuntimeError(wrong)
        return elapsed * 1000

    claims = [new] if old is None else [new, old]
    for claim in claims:
        await claim()
    times: list[list[float]] = [[] for _ in claims]
    for _ in range(ROUNDS):
        for claim, ms in zip(claims, times, strict=True):
            ms.append(await timed(claim))
    result: dict[str, Any] = {"claim_ms": round(statistics.median(times[0]), 2)}
    if old is not None:
        result["baseline"] = BASELINE
        result["baseline_claim_ms"] = round(statistics.median(times[1]), 2)
        result["baseline_over_new"] = round(result["baseline_claim_ms"] / result["claim_ms"], 1)
    return result


async def run(count: int, how: str) -> dict[str, Any]:
    async with fresh_schema(f"bench_blocked_{uuid.uuid4().hex[:6]}") as schema:
        names = TableNames(schema=schema)
        async with PostgresStore(PG_URL, names) as store:
            await store.migrate()
            filled = time.perf_counter()
            await copy_fill(schema, count)
            fill_s = time.perf_counter() - filled
            holder = ClaimRequest(limit=500, lease_seconds=3600, ordered=True, relay_id="holder")
            held = []
            if how != "free":
                held = [await store.claim_batch(holder) for _ in range(KEYS // 500)]
                assert sum(len(c.messages) for c in held) == KEYS, "every key's head held"
            if how == "retry":
                for c in held:
                    retries = [Retry(m.id, 3600.0, "later") for m in c.messages]
                    await store.settle(c, Settlement(retries=retries))
            request = ClaimRequest(limit=500, lease_seconds=30, ordered=True, relay_id="bench")

            expected = 500 if how == "free" else 0

            async def new() -> int:
                claim = await store.claim_batch(request)
                if claim.messages:  # "free": released again, for the next claim
                    await store.settle(claim, Settlement(released=[m.id for m in claim.messages]))
                return len(claim.messages)

            old_sql = baseline_claim(BASELINE, names) if BASELINE else None

            async def old() -> int:
                # as the store's claim_batch of that revision did, and released the same way
                assert old_sql is not None
                args: tuple[Any, ...] = (500, 1, "bench", 30.0, False, [])
                if "$8" in old_sql:  # the bounded claim (ADR 0010): front and keys, as relay.py
                    args += (500 * FRONT_PER_MESSAGE, 500 * KEYS_PER_MESSAGE)
                async with store.db.connection() as conn:
                    rows = await conn.fetch(old_sql, *args)
                return len(await released(store, 1, rows))

            timings = await interleaved(
                new,
                old if old_sql else None,
                lambda rows: None if rows == expected else f"claimed {rows}, not {expected}",
            )
    result = {"messages": count, "blocked_by": how, "fill_s": round(fill_s, 1), **timings}
    print(result, flush=True)
    return result


async def main(sizes: list[int]) -> dict[str, Any]:
    rows = [await run(count, how) for count in sizes for how in ("leased", "retry", "free")]
    result = {"keys": KEYS, "rounds": ROUNDS, "rows": rows}
    save("claim_blocked", result)
    return result


async def drain(count: int) -> None:
    async with fresh_schema(f"bench_drain_{uuid.uuid4().hex[:6]}") as schema:
        async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
            await store.migrate()
            await copy_fill(schema, count)
            rate = await drain_store(store, NullPublisher(), RelaySettings(), count, 3600)
    print(f"drain {count} ordered {rate:.0f} msg/s", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["drain"]:
        asyncio.run(drain(int(sys.argv[2])))
    else:
        asyncio.run(main([int(a) for a in sys.argv[1:]] or list(SIZES)))
