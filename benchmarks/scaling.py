"""Scale-out figures: 1/2/4 relay processes, takeover of a dead relay, a 1M-message backlog.

- ``relays``: N ``outboxer relay`` processes (ordered and unordered) drain 40,000 messages over
  1,000 keys to Redis Streams; msg/s from the commit of the backlog to the empty outbox.
- ``takeover``: a relay holding claimed messages is killed with SIGKILL; the time until another
  relay has published them (lease expiry + the sweeper's half-lease tick).
- ``backlog``: 1,000,000 messages drained by one relay (null publisher: the database side),
  the rate sampled every second; table size before, after the drain and after VACUUM.

Run: ``.venv/bin/python -m benchmarks.scaling [relays takeover backlog]``
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis

import outboxer
from benchmarks.common import PAYLOAD, PG_URL, NullPublisher, fill, fresh_schema, save
from benchmarks.peers import relay_command
from outboxer.config import RelaySettings, TableNames
from outboxer.ports import ClaimRequest
from outboxer.relay import Relay
from outboxer.stores.postgres import PostgresStore

ROOT = Path(__file__).resolve().parents[1]


def start_relays(count: int, schema: str, *extra: str) -> list[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXER_")}
    return [
        subprocess.Popen(
            relay_command(schema, "redis://127.0.0.1:6379/0", *extra),
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=30)


async def wait_for(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError
        await asyncio.sleep(0.02)


async def relays(count_messages: int = 40_000) -> list[dict[str, Any]]:
    rows = []
    for ordered in (True, False):
        for count in (1, 2, 4):
            stream = f"scale-{uuid.uuid4().hex[:8]}"
            async with fresh_schema(f"bench_scale_{uuid.uuid4().hex[:6]}") as schema:
                async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
                    await store.migrate()
                    procs = start_relays(count, schema, *([] if ordered else ["--unordered"]))
                    try:
                        await wait_for(functools.partial(_live, store, count), 30)
                        await fill(schema, count_messages, topic=stream, keys=1000, analyze=False)
                        started = time.perf_counter()  # the backlog has just committed
                        await wait_for(functools.partial(_drained, store), timeout=300)
                        rate = count_messages / (time.perf_counter() - started)
                    finally:
                        stop(procs)
            client = aioredis.Redis()
            await client.delete(stream)
            await client.aclose()
            rows.append({"relays": count, "ordered": ordered, "msg_per_s": round(rate)})
            print(f"{count} relay(s) {'ordered' if ordered else 'unordered':9} {rate:8.0f} msg/s")
    return rows


async def _live(store: PostgresStore, count: int) -> bool:
    return len((await store.stats()).relays) >= count


async def _drained(store: PostgresStore) -> bool:
    stats = await store.stats()
    return stats.pending == 0 and stats.in_flight == 0


async def takeover(lease: float = 10.0) -> dict[str, Any]:
    stream = f"takeover-{uuid.uuid4().hex[:8]}"
    async with fresh_schema(f"bench_takeover_{uuid.uuid4().hex[:6]}") as schema:
        async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
            await store.migrate()
            await fill(schema, 2000, topic=stream, keys=None)
            # Relay A claims everything and dies before settling: a store claim stands for it.
            claim = await store.claim_batch(
                ClaimRequest(limit=2000, lease_seconds=lease, ordered=True, relay_id="killed")
            )
            killed_at = time.perf_counter()
            procs = start_relays(1, schema, "--lease-seconds", str(lease))
            try:
                await wait_for(lambda: _drained(store), timeout=lease * 4)
                took = time.perf_counter() - killed_at
            finally:
                stop(procs)
    client = aioredis.Redis()
    await client.delete(stream)
    await client.aclose()
    print(
        f"takeover of {len(claim.messages)} claimed messages with a {lease:.0f} s lease: "
        f"{took:.1f} s (bound: lease + lease/2 = {lease * 1.5:.0f} s)"
    )
    return {"lease_seconds": lease, "messages": len(claim.messages), "seconds": round(took, 1)}


async def backlog(count: int = 1_000_000) -> dict[str, Any]:
    async with fresh_schema("bench_backlog") as schema:
        async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
            await store.migrate()
            conn = await asyncpg.connect(PG_URL)
            outbox = outboxer.Outbox(schema=schema)
            for start in range(0, count, 50_000):
                messages = [
                    {
                        "topic": "orders",
                        "payload": {**PAYLOAD, "order_id": n},
                        "key": n % 10_000,
                        "type": "OrderCreated",
                    }
                    for n in range(start, start + 50_000)
                ]
                await outbox.enqueue_many_async(conn, messages)
            await conn.execute(f'ANALYZE "{schema}".outbox')
            size = f"SELECT pg_total_relation_size('\"{schema}\".outbox')"
            before = await conn.fetchval(size)
            relay = Relay(store, NullPublisher(), RelaySettings())
            task = asyncio.create_task(relay.run())
            samples: list[tuple[float, int]] = []
            started = time.perf_counter()
            last = 0
            while relay.counters.published < count:
                await asyncio.sleep(1.0)
                now = relay.counters.published
                samples.append((round(time.perf_counter() - started, 1), now - last))
                last = now
            elapsed = time.perf_counter() - started
            relay.stop()
            await task
            after = await conn.fetchval(size)
            await conn.execute(f'VACUUM "{schema}".outbox')
            vacuumed = await conn.fetchval(size)
            await conn.close()
    rates = [r for _, r in samples[1:-1]]
    print(
        f"1M backlog: {count / elapsed:.0f} msg/s overall, per second min {min(rates)} "
        f"max {max(rates)}; table {before / 2**20:.0f} MiB → {after / 2**20:.0f} MiB after the "
        f"drain → {vacuumed / 2**20:.1f} MiB after VACUUM"
    )
    return {
        "messages": count,
        "seconds": round(elapsed, 1),
        "per_second": samples,
        "size_before": before,
        "size_after": after,
        "size_vacuumed": vacuumed,
    }


async def main(parts: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if "relays" in parts:
        result["relays"] = await relays()
    if "takeover" in parts:
        result["takeover"] = await takeover()
    if "backlog" in parts:
        result["backlog"] = await backlog()
    save("scaling" + ("" if len(parts) == 3 else "_" + "_".join(parts)), result)
    return result


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] or ["relays", "takeover", "backlog"]))
