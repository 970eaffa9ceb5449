"""Per-key order under concurrent commits: PostgreSQL's commit-order gate before and since schema 9.

Writers (asyncpg and psycopg alternately, a connection each) run transactions that write a
business row (the xid is taken there), then 1-3 messages of a few hot keys, with random sleeps of
0-20 ms between statements and before the end; one in ten rolls back. Ordered relays (batches of
50) publish meanwhile. A committed message is *overtaken* when a later-written message of its key
(higher ``seq``) was published first; ``pairs`` counts each such (earlier, later) pair.

The same settings and seeds run with two defaults of the ``txid`` column the gate reads,
interleaved (old, new, old, new ...), each in a fresh schema: ``old`` is the writer's xid,
``pg_current_xact_id()`` (before schema 9; the claim's ``txid <= xmin`` is then the old ``<``, a
committed row's writer no longer running), ``new`` schema 9's ``greatest(pg_current_xact_id(),
pg_snapshot_xmax(pg_current_snapshot()))``: a row also waits for every writer older than the
latest transaction to complete before its insert (docs/guarantees.md, "Per-key ordering").

Per run: committed messages, overtaken messages and pairs, lost (committed, never published: must
be 0), duplicates (published again), and commit → first publish latency (p50/p99/max ms); the
summary adds up the overtaken messages of each mode and gives their ratio. ``--rr``: the share of
REPEATABLE READ transactions; ``--bare``: of those whose first write is the enqueue itself.

Run: ``PYTHONPATH=src:. .venv/bin/python -m benchmarks.commit_order [SEED ...] [--seconds 10]
[--writers 8] [--relays 2] [--keys 3] [--rr 0] [--bare 0]`` (seeds 1 2 3 by default)
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import random
import time
import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

import asyncpg
import psycopg

import outboxer
from benchmarks.common import PG_URL, NullPublisher, fresh_schema, save
from outboxer.config import RelaySettings, TableNames
from outboxer.errors import PublishError
from outboxer.message import Message
from outboxer.relay import Relay
from outboxer.stores.postgres import PostgresStore

SLEEP = 0.02  # the longest random pause between a transaction's statements
ROLLBACK = 0.1
OLD_DEFAULT = "pg_current_xact_id()"


class Written(NamedTuple):
    key: str
    seq: int
    committed: bool
    ended: float  # monotonic time the commit (or rollback) returned


class LoggingPublisher(NullPublisher):
    """Acknowledges everything, noting when each message went out."""

    def __init__(self, log: list[tuple[float, str]]) -> None:
        self.log = log

    async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
        now = time.monotonic()
        self.log.extend((now, m.id) for m in messages)
        return [None] * len(messages)


async def writer(
    w: int, schema: str, opts: argparse.Namespace, seed: int, stop: float, out: dict[str, Written]
) -> None:
    rnd = random.Random(seed * 1000 + w)
    outbox = outboxer.Outbox(schema=schema)
    conn: asyncpg.Connection | psycopg.AsyncConnection[Any]
    if w % 2:
        conn = await psycopg.AsyncConnection.connect(PG_URL, autocommit=True)
    else:
        conn = await asyncpg.connect(PG_URL)

    async def sql(query: str, *args: Any) -> list[Any]:
        if isinstance(conn, asyncpg.Connection):
            return list(await conn.fetch(query, *args))
        cursor = await conn.execute(query.replace("$1", "%s"), args)
        return await cursor.fetchall() if cursor.description else []

    try:
        while time.monotonic() < stop:
            rr = rnd.random() < opts.rr
            await sql("BEGIN ISOLATION LEVEL " + ("REPEATABLE READ" if rr else "READ COMMITTED"))
            if rnd.random() < 0.3:
                await sql("SELECT 1")  # a snapshot taken early (matters under REPEATABLE READ)
            if rnd.random() >= opts.bare:  # the xid is taken here, before the first enqueue
                await sql(f'INSERT INTO "{schema}".biz DEFAULT VALUES')
            await asyncio.sleep(rnd.random() * SLEEP)
            ids = []
            for _ in range(rnd.randint(1, 3)):
                key = f"k{rnd.randrange(opts.keys)}"
                ids.append(await outbox.enqueue_async(conn, "orders", {"w": w}, key=key))
                await asyncio.sleep(rnd.random() * SLEEP)
            rows = await sql(f'SELECT id, key, seq FROM "{schema}".outbox WHERE id = ANY($1)', ids)
            commit = rnd.random() >= ROLLBACK
            await sql("COMMIT" if commit else "ROLLBACK")
            ended = time.monotonic()
            out.update((i, Written(k, s, commit, ended)) for i, k, s in rows)
    finally:
        await conn.close()


async def run(mode: str, seed: int, opts: argparse.Namespace) -> dict[str, Any]:
    written: dict[str, Written] = {}
    log: list[tuple[float, str]] = []
    async with (
        fresh_schema(f"bench_commit_order_{uuid.uuid4().hex[:6]}") as schema,
        contextlib.AsyncExitStack() as stack,
    ):
        names = TableNames(schema=schema)
        stores = [
            await stack.enter_async_context(PostgresStore(PG_URL, names))
            for _ in range(opts.relays)
        ]
        await stores[0].migrate()
        async with stores[0].db.connection() as conn:
            await conn.execute(f'CREATE TABLE "{schema}".biz (id bigserial PRIMARY KEY)')
            if mode == "old":
                await conn.execute(
                    f'ALTER TABLE "{schema}".outbox ALTER COLUMN txid SET DEFAULT {OLD_DEFAULT}'
                )
        settings = RelaySettings(batch_size=50, poll_interval=0.2, min_poll_interval=0.005)
        relays = [Relay(store, LoggingPublisher(log), settings) for store in stores]
        tasks = [asyncio.create_task(r.run()) for r in relays]
        stop = time.monotonic() + opts.seconds
        await asyncio.gather(
            *(writer(w, schema, opts, seed, stop, written) for w in range(opts.writers))
        )
        committed = {i for i, m in written.items() if m.committed}
        deadline = time.monotonic() + 60
        while not committed <= {i for _, i in log} and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for relay in relays:
            relay.stop()
        await asyncio.gather(*tasks)
    first = {i: at for at, i in reversed(log)}  # each message's first publish
    if stray := set(first) - committed:
        raise RuntimeError(f"{len(stray)} rolled-back messages published")
    published: dict[str, list[int]] = {}  # per key, the seqs published so far, sorted
    overtaken = pairs = 0
    for i in sorted(first, key=first.__getitem__):  # in order of first publication
        seqs = published.setdefault(written[i].key, [])
        later = len(seqs) - bisect.bisect(seqs, written[i].seq)  # published before, written after
        overtaken, pairs = overtaken + (later > 0), pairs + later
        bisect.insort(seqs, written[i].seq)
    lat = sorted(at - written[i].ended for i, at in first.items())
    result = {
        "mode": mode,
        "seed": seed,
        "committed": len(committed),
        "overtaken": overtaken,
        "pairs": pairs,
        "lost": len(committed - set(first)),
        "duplicates": len(log) - len(first),
        "latency_ms": {
            name: round(1000 * lat[min(int(len(lat) * q), len(lat) - 1)], 1)
            for name, q in (("p50", 0.5), ("p99", 0.99), ("max", 1))
        },
    }
    print(result, flush=True)
    return result


async def main(opts: argparse.Namespace) -> dict[str, Any]:
    runs = [await run(mode, seed, opts) for seed in opts.seeds for mode in ("old", "new")]
    totals = {m: sum(r["overtaken"] for r in runs if r["mode"] == m) for m in ("old", "new")}
    summary = {
        "overtaken_old": totals["old"],
        "overtaken_new": totals["new"],
        "old_over_new": round(totals["old"] / totals["new"], 1) if totals["new"] else None,
        "lost": sum(r["lost"] for r in runs),
    }
    print(summary, flush=True)
    scenario = {k: v for k, v in vars(opts).items() if k != "seeds"}
    result = {"scenario": scenario, "seeds": opts.seeds, "runs": runs, "summary": summary}
    save("commit_order", result)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.commit_order")
    parser.add_argument("seeds", type=int, nargs="*", default=[1, 2, 3])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--relays", type=int, default=2)
    parser.add_argument("--keys", type=int, default=3)
    parser.add_argument("--rr", type=float, default=0.0, help="share of REPEATABLE READ")
    parser.add_argument("--bare", type=float, default=0.0, help="share enqueueing first")
    asyncio.run(main(parser.parse_args()))
