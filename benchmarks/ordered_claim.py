"""The ordered claim statement of this tree against a baseline revision's, alternating in one
process (issue 14, docs/adr/0011).

The baseline's ``claim_ordered`` (``OUTBOXER_BENCH_BASELINE``, default ``7db8e67``: main before
ADR 0011) is put into the same store (``store.q``) with everything else this tree's, so the
figures measure the statement alone; ``unordered`` runs alongside as the reference. Every round
runs each variant once (the order reversed every other round) and the ratio to unordered is
taken per round, so the machine's load moves both sides of a ratio alike.

- ``claim``: claim cost, as ``claim_cost`` (claims of 500, each acknowledged) on one table of
  ``OUTBOXER_BENCH_KEYS`` keys (default 1,000), µs per message;
- ``null``: drains of 20,000 messages by one relay (batch 500) with a publisher that acknowledges
  at once, ``NullPublisher`` (waves) and one declaring ``keeps_key_order`` (the brokers' path:
  pipelined runs, chained batches);
- ``kafka``, ``nats``, ``rabbitmq``, ``redis``: drains to that broker, as ``benchmarks.brokers``.

Run: ``OUTBOXER_BENCH_KEYS=200 .venv/bin/python -m benchmarks.ordered_claim claim null kafka nats``
(``OUTBOXER_BENCH_ROUNDS``: rounds, default 8).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import time
import uuid
from typing import Any

from benchmarks import brokers
from benchmarks.claim_blocked import baseline_claim
from benchmarks.common import PG_URL, NullPublisher, drain_store, fill, fresh_schema, save
from outboxer.brokers import publisher_from_url
from outboxer.config import RelaySettings, TableNames
from outboxer.ports import ClaimRequest, Settlement
from outboxer.stores.postgres import PostgresStore

BASELINE = os.environ.get("OUTBOXER_BENCH_BASELINE", "7db8e67")
ROUNDS = int(os.environ.get("OUTBOXER_BENCH_ROUNDS", "8"))
KEYS = int(os.environ.get("OUTBOXER_BENCH_KEYS", "1000"))
COUNT = 20_000
VARIANTS = ("baseline", "new", "unordered")


class KeyOrderNull(NullPublisher):
    """Acknowledges at once and declares ``keeps_key_order``, as every broker's publisher."""

    keeps_key_order = True


_statements: dict[str, str] = {}


def use(store: PostgresStore, variant: str) -> None:
    """The store claims with this tree's statement, or the baseline's."""
    current = _statements.setdefault(f"new {store.names.schema}", store.q["claim_ordered"])
    if variant == "baseline":
        key = f"baseline {store.names.schema}"
        if key not in _statements:
            _statements[key] = baseline_claim(BASELINE, store.names)
        current = _statements[key]
    store.q = {**store.q, "claim_ordered": current}


def order(round_: int) -> tuple[str, ...]:
    return VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]


def summary(name: str, samples: dict[str, list[float]], higher_is_better: bool) -> dict[str, Any]:
    """Per-round ratios ordered / unordered of the measured quantity (msg/s, or µs per message
    when not ``higher_is_better``), their medians, and in how many rounds the new statement's
    ratio was the better one."""
    unordered = samples["unordered"]
    row: dict[str, Any] = {"what": name, "rounds": len(unordered)}
    for variant in ("baseline", "new"):
        ratios = [v / u for v, u in zip(samples[variant], unordered, strict=True)]
        row[f"{variant}_median"] = round(statistics.median(samples[variant]), 1)
        row[f"{variant}_over_unordered"] = round(statistics.median(ratios), 2)
        row[f"{variant}_over_unordered_rounds"] = [round(r, 2) for r in ratios]
    row["unordered_median"] = round(statistics.median(unordered), 1)
    pairs = zip(
        row["new_over_unordered_rounds"], row["baseline_over_unordered_rounds"], strict=True
    )
    wins = sum((n > b) == higher_is_better for n, b in pairs)
    row["new_better_in_rounds"] = wins
    print(
        f"{name:24} {'msg/s' if higher_is_better else 'µs/msg'} ordered / unordered: "
        f"{BASELINE} {row['baseline_over_unordered']:.2f} -> this tree "
        f"{row['new_over_unordered']:.2f} (better in {wins} of {len(unordered)} rounds)",
        flush=True,
    )
    return row


async def claim_costs() -> dict[str, Any]:
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    async with fresh_schema(f"bench_oc_{uuid.uuid4().hex[:6]}") as schema:
        async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
            await store.migrate()
            await fill(schema, 500 * len(VARIANTS) * (ROUNDS + 2) + COUNT, keys=KEYS)
            for round_ in range(ROUNDS + 2):
                for variant in order(round_):
                    use(store, variant)
                    request = ClaimRequest(
                        limit=500, lease_seconds=30, ordered=variant != "unordered", relay_id="b"
                    )
                    started = time.perf_counter()
                    claim = await store.claim_batch(request)
                    elapsed = time.perf_counter() - started
                    await store.settle(claim, Settlement(published=[m.id for m in claim.messages]))
                    if len(claim.messages) != 500:
                        raise RuntimeError(f"{variant} claimed {len(claim.messages)} of 500")
                    if round_ >= 2:  # the first rounds prepare the statements
                        samples[variant].append(elapsed / 500 * 1e6)
    return summary(f"claim, {KEYS} keys", samples, higher_is_better=False)


async def drain(variant: str, publisher: Any, topic: str = "orders") -> float:
    async with fresh_schema(f"bench_oc_{uuid.uuid4().hex[:6]}") as schema:
        async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
            await store.migrate()
            await fill(schema, COUNT, topic=topic, keys=KEYS)
            use(store, variant)
            settings = RelaySettings(batch_size=500, ordered=variant != "unordered")
            return await drain_store(store, publisher, settings, COUNT)


async def null_drains() -> list[dict[str, Any]]:
    rows = []
    for publisher in (NullPublisher, KeyOrderNull):
        samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for round_ in range(ROUNDS):
            for variant in order(round_):
                samples[variant].append(await drain(variant, publisher()))
        rows.append(summary(f"{publisher.__name__}, {KEYS} keys", samples, True))
    return rows


async def broker_drains(name: str) -> dict[str, Any]:
    setup, _ = brokers.BROKERS[name]
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    async with setup() as (url, new_topic):
        for round_ in range(ROUNDS):
            topics = {v: new_topic() for v in VARIANTS}
            async with contextlib.AsyncExitStack() as stack:
                if name == "nats":
                    await stack.enter_async_context(
                        brokers.nats_streams(url, list(topics.values()))
                    )
                for variant in order(round_):
                    async with publisher_from_url(url) as publisher:
                        # connections and metadata set up before the clock starts
                        [warm] = brokers.messages(topics[variant], 1)
                        assert list(await publisher.publish([warm])) == [None]
                        samples[variant].append(await drain(variant, publisher, topics[variant]))
    return summary(f"{name}, {KEYS} keys", samples, True)


async def main(what: list[str]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for item in what:
        if item == "claim":
            rows.append(await claim_costs())
        elif item == "null":
            rows.extend(await null_drains())
        else:
            rows.append(await broker_drains(item))
    result = {"baseline": BASELINE, "keys": KEYS, "rounds": ROUNDS, "rows": rows}
    save(f"ordered_claim_{KEYS}_keys", result)
    return result


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] or ["claim", "null", "kafka", "nats"]))
