"""PostgreSQL's ordered claim with every key blocked reads a number of pages bounded by the keys
and the batch, not by the backlog (issue 14, docs/adr/0010).

Not a clock: the pages the claim statement touches, from EXPLAIN (ANALYZE, BUFFERS). The claim
that walked the seq index read every row behind the blocked heads (and probed each one's key):
on this table about 120,000 pages; the bounded claim reads the front of the table and one probe
per key, about 7,000.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from outboxer.ports import ClaimRequest, Retry, Settlement
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.postgres import relay as postgres_relay
from tests.conftest import wait_past_commit_gate

KEYS = 1000
ROWS = 40_000  # 40 per key
BATCH = 500
#: The bounded claim's pages: the front (4 rows per message, a few pages each) and the heads (a
#: few pages per key). The walk of the old claim read about 5 pages per row of the backlog.
MAX_PAGES = 20 * KEYS


async def fill(pg_url: str, schema: str) -> None:
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(
            f'INSERT INTO "{schema}".outbox (id, topic, key, payload) '
            f"SELECT 'm' || n, 't', (n % {KEYS})::text, '{{}}'::bytea "
            f"FROM generate_series(0, {ROWS - 1}) AS n"
        )
        await conn.execute(f'VACUUM ANALYZE "{schema}".outbox')
    finally:
        await conn.close()


async def pages_of_a_claim(store: PostgresStore, request: ClaimRequest) -> tuple[int, int]:
    """(shared pages hit + read, rows claimed) of one ordered claim statement, rolled back."""
    args: tuple[Any, ...] = (
        *(request.limit, 1, request.relay_id, float(request.lease_seconds)),
        *(request.hold_dead_keys, list(request.behind)),
        *(request.limit * postgres_relay.FRONT_PER_MESSAGE, request.limit * 4),
    )
    async with store.db.connection() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            explained = await conn.fetchval(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + store.q["claim_ordered"], *args
            )
        finally:
            await tx.rollback()
    plan = json.loads(explained)[0]["Plan"]
    return plan["Shared Hit Blocks"] + plan["Shared Read Blocks"], plan["Actual Rows"]


async def test_an_ordered_claim_with_every_key_blocked_reads_pages_bounded_by_the_keys(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    await fill(pg_url, pg_schema)
    await wait_past_commit_gate(pg_store)  # another test's transaction may hold it a moment
    holder = ClaimRequest(limit=BATCH, lease_seconds=3600, ordered=True, relay_id="holder")
    held = [await pg_store.claim_batch(holder) for _ in range(KEYS // BATCH)]
    assert sum(len(c.messages) for c in held) == KEYS  # every key's head
    # half of the heads wait for a retry, half stay leased by the holder
    await pg_store.settle(
        held[0], Settlement(retries=[Retry(m.id, 3600, "later") for m in held[0].messages])
    )
    request = ClaimRequest(limit=BATCH, lease_seconds=30, ordered=True, relay_id="other")
    pages, claimed = await pages_of_a_claim(pg_store, request)
    assert claimed == 0
    assert pages < MAX_PAGES, pages
    # the holder's own next claim continues its leased keys (behind): a full batch, as cheaply
    chained = ClaimRequest(
        limit=BATCH,
        lease_seconds=30,
        ordered=True,
        relay_id="holder",
        behind=frozenset({held[1].token}),
    )
    pages, claimed = await pages_of_a_claim(pg_store, chained)
    assert claimed == BATCH
    assert pages < MAX_PAGES, pages


RUN = 40_000  # one blocked key's rows, written in one go
MANY_KEYS = 5 * BATCH  # more than the claim reads heads of: it walks on behind its front
#: A claim that walks the run reads a few pages per row of it (the old claim probed each row's
#: key head: about 4 per row, 160,000 here); one that skips the run's key reads the run's pages
#: (about 2,000 here) besides its front and the key heads it reads (about 10,000).
MAX_RUN_PAGES = RUN // 2


@pytest.mark.parametrize("head", ["front", "behind"])
async def test_an_ordered_claim_passes_a_blocked_keys_long_run_without_a_probe_per_row(
    pg_store: PostgresStore, pg_url: str, pg_schema: str, head: str
) -> None:
    """One key's head is blocked, its long run at the front of the table, many other keys behind
    it (docs/adr/0010, the last bullet). ``front``: the key's head is in the claim's front (it
    waits an hour). ``behind``: another relay's batches fill the front, the key's head (waiting)
    comes right after them."""
    leased = 4 * BATCH if head == "behind" else 0  # single-row keys, leased by another relay
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(
            f'INSERT INTO "{pg_schema}".outbox (id, topic, key, payload) '
            f"SELECT 'm' || n, 't', CASE WHEN n < {leased} THEN 'a' || n "
            f"WHEN n < {leased + RUN} THEN 'K' ELSE (n % {MANY_KEYS})::text END, '{{}}'::bytea "
            f"FROM generate_series(0, {leased + RUN + 2 * MANY_KEYS - 1}) AS n"
        )
        await conn.execute(
            f"UPDATE \"{pg_schema}\".outbox SET available_at = now() + interval '1 hour' "
            f"WHERE seq = (SELECT min(seq) FROM \"{pg_schema}\".outbox WHERE key = 'K')"
        )
        await conn.execute(f'VACUUM ANALYZE "{pg_schema}".outbox')
    finally:
        await conn.close()
    await wait_past_commit_gate(pg_store)
    holder = ClaimRequest(limit=BATCH, lease_seconds=3600, ordered=True, relay_id="holder")
    for _ in range(leased // BATCH):
        claim = await pg_store.claim_batch(holder)
        assert len(claim.messages) == BATCH
        assert all(m.key is not None and m.key.startswith("a") for m in claim.messages)
    request = ClaimRequest(limit=BATCH, lease_seconds=30, ordered=True, relay_id="other")
    pages, claimed = await pages_of_a_claim(pg_store, request)
    assert claimed == BATCH  # the other keys' heads, none of K's rows (the contract's rules)
    assert pages < MAX_RUN_PAGES, pages
