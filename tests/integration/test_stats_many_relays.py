"""``stats`` (``outboxer stats``, ``/api/stats``, ``/metrics``, ``/readyz``) with many live
relays over a backlog: what each relay holds is counted in one pass over the outbox.

A count per relay read the whole outbox once per live relay (no index covers ``locked_by``: a
claim must stay a HOT update on PostgreSQL). A probe registered 200 relays over a backlog of
300,000 messages: the stats query took 6 s, past the 5 s of ``/readyz``, which then called the
database unreachable, and ``/metrics`` reported ``outboxer_database_up 0``. The tests count the
rows the statement reads (the plan's loops, the server's row counters, SQLite's steps), never
the time it takes.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from pathlib import Path
from typing import Any

import asyncpg

from outboxer.outbox import Outbox
from outboxer.ports import ClaimRequest, RelayInfo, Store
from outboxer.stores.mysql import MysqlStore
from outboxer.stores.sqlite import SqliteStore
from tests.conftest import Server, mysql_connect

BACKLOG = 2000
RELAYS = 40
#: relay index -> messages it claims
HOLDING = {3: 7, 17: 2}


async def _relays(store: Store) -> None:
    """RELAYS live relays, those of HOLDING holding that many messages of the backlog."""
    now = dt.datetime.now(dt.UTC)
    for n in range(RELAYS):
        await store.heartbeat(RelayInfo(f"relay-{n:02}", "host", n, now, now))
    for n, count in HOLDING.items():
        relay_id = f"relay-{n:02}"
        request = ClaimRequest(limit=count, lease_seconds=60, ordered=False, relay_id=relay_id)
        assert len((await store.claim_batch(request)).messages) == count


async def _check_figures(store: Store) -> None:
    stats = await store.stats()
    assert len(stats.relays) == RELAYS
    held = {r.relay_id: r.in_flight for r in stats.relays if r.in_flight}
    assert held == {f"relay-{n:02}": count for n, count in HOLDING.items()}
    assert stats.in_flight == sum(HOLDING.values()) and stats.unowned_in_flight == 0


def _outbox_loops(plan: dict[str, Any], table: str) -> int:
    """How many times the plan (EXPLAIN ANALYZE, JSON) read ``table``: the loops of its scans."""
    loops = plan.get("Actual Loops", 0) if plan.get("Relation Name") == table else 0
    return loops + sum(_outbox_loops(child, table) for child in plan.get("Plans", []))


async def test_live_relays_are_counted_in_one_pass_over_the_outbox(server: Server) -> None:
    await server.fill(BACKLOG)
    await _relays(server.store)
    await _check_figures(server.store)
    query = server.store.q["live_relays"]
    if isinstance(server.store, MysqlStore):
        conn = await mysql_connect(server.schema)
        try:
            async with conn.cursor() as cur:
                await cur.execute("FLUSH STATUS")  # this session's counters
                await cur.execute(query, {"live_us": 15_000_000})
                assert len(await cur.fetchall()) == RELAYS
                await cur.execute("SHOW SESSION STATUS LIKE 'Handler_read%'")
                read = sum(int(value) for _, value in await cur.fetchall())
        finally:
            conn.close()
        # once over the outbox and the relays (and the index entries they lead to), not
        # once over the outbox per relay (RELAYS * BACKLOG = 80,000 before)
        assert read < 3 * (BACKLOG + RELAYS), read
        return
    conn = await asyncpg.connect(server.url)
    try:
        await conn.execute("SET jit = off")
        [row] = await conn.fetch(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}", 15.0)
        plan = json.loads(row[0])[0]["Plan"]
    finally:
        await conn.close()
    assert _outbox_loops(plan, "outbox") == 1  # it was RELAYS


async def test_live_relays_are_counted_in_one_pass_over_the_sqlite_outbox(
    sqlite_store: SqliteStore, sqlite_path: Path
) -> None:
    conn = sqlite3.connect(sqlite_path)
    try:
        with conn:
            messages = [{"topic": "t", "payload": {"n": n}} for n in range(BACKLOG)]
            Outbox().enqueue_many(conn, messages)
    finally:
        conn.close()
    await _relays(sqlite_store)
    await _check_figures(sqlite_store)
    conn = sqlite3.connect(sqlite_path)
    steps = 0

    def step() -> int:
        nonlocal steps
        steps += 1
        return 0

    try:
        conn.set_progress_handler(step, 100)  # called every 100 virtual-machine instructions
        assert len(conn.execute(sqlite_store.q["live_relays"], {"live": 15.0}).fetchall()) == RELAYS
    finally:
        conn.close()
    # a few instructions a row of the outbox, once: under 100 calls (over 3,000 before, a pass
    # over the outbox per relay)
    assert steps < BACKLOG // 10, steps
