"""Relay throughput as the backlog grows (20,000, 100,000, 1,000,000 messages) and relay memory.

For each backlog size, ordered and unordered, one relay process drains a PostgreSQL outbox
(1,000 keys, ≈120-byte JSON payloads):

- to Redis Streams: the ``outboxer relay`` CLI process, default settings; done when the stream
  holds every message (``XLEN``, polled every 20 ms); then every ``order_id`` is read back and
  checked (0 lost, 0 duplicates);
- to a null publisher that acknowledges at once (the database side alone): outboxer's ``Relay``
  on ``PostgresStore`` in its own process (``python -m benchmarks.backlog null …``), done when
  it has published every message.

As in ``benchmarks.peers``, the relay is started first on an empty table, the backlog commits
in one transaction, and the clock runs from that commit. A drain still running after
``OUTBOXER_BENCH_BACKLOG_SECONDS`` (120) is measured over that window: msg/s = what it published
in it (the loss/duplicate check then counts what is left in the outbox as not lost). Memory:
the relay process's resident set size from ``/proc/<pid>/status`` when idle and its peak
(``VmHWM``) over the drain. Targets (docs/benchmarks.md): throughput does not fall as the
backlog grows; RSS ≤ 150 MB.

Run: ``.venv/bin/python -m benchmarks.backlog [20000 100000 1000000]``
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
import uuid
from typing import Any

import asyncpg

from benchmarks.common import PG_URL, NullPublisher, fresh_schema, save
from benchmarks.peers import Redis, RelayProcess, fill_outboxer, outboxer_relay, wait_for
from outboxer.config import RelaySettings, TableNames
from outboxer.relay import Relay
from outboxer.stores.postgres import PostgresStore

SIZES = (20_000, 100_000, 1_000_000)
#: A drain that has not finished after this many seconds is measured over them (its rate: what
#: it published in them); env OUTBOXER_BENCH_BACKLOG_SECONDS.
WINDOW = float(os.environ.get("OUTBOXER_BENCH_BACKLOG_SECONDS", "120"))


async def null_relay(schema: str, ordered: bool, count: int, window: float) -> None:
    """The child process: a relay with a null publisher. Prints ``ready``, then, once it has
    published ``count`` messages or ``window`` seconds after its first claim, ``<published>
    <seconds since the first claim>``."""
    async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
        relay = Relay(store, NullPublisher(), RelaySettings(ordered=ordered))
        task = asyncio.create_task(relay.run())
        print("ready", flush=True)
        while not relay.counters.claimed:
            await asyncio.sleep(0.002)
        started = time.monotonic()
        while relay.counters.published < count and time.monotonic() - started < window:
            await asyncio.sleep(0.005)
        print(relay.counters.published, time.monotonic() - started, flush=True)
        relay.stop()
        await task


async def drain(target: str, ordered: bool, count: int, redis: Redis) -> dict[str, Any]:
    """Drain ``count`` messages, or as many as the relay publishes in WINDOW seconds."""
    topic = await redis.new_topic()
    samples: list[tuple[float, int]] = []
    async with fresh_schema(f"bench_backlog_{uuid.uuid4().hex[:6]}") as schema:
        async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
            await store.migrate()
            if target == "redis":
                relay = outboxer_relay(schema, redis.url, *([] if ordered else ["--unordered"]))
            else:
                relay = RelayProcess(
                    [
                        *(sys.executable, "-m", "benchmarks.backlog", "null", schema),
                        *(str(ordered), str(count), str(WINDOW)),
                    ]
                )
            try:
                if target == "redis":

                    async def live() -> bool:
                        return len((await store.stats()).relays) >= 1

                    await wait_for(live, 30, relay)
                else:
                    await relay.wait_line("ready")
                idle_mb, _ = relay.memory_mb()
                await fill_outboxer(schema, topic, count)
                started = time.perf_counter()  # the backlog has just committed
                if target == "redis":
                    published = 0
                    while published < count and time.perf_counter() - started < WINDOW:
                        relay.check_alive()
                        published = await redis.count(topic)
                        now = time.perf_counter() - started
                        if not samples or now - samples[-1][0] >= 1.0:
                            samples.append((round(now, 2), published))
                        await asyncio.sleep(0.02)
                    elapsed = time.perf_counter() - started
                else:
                    assert relay.process.stdout is not None
                    line = await asyncio.to_thread(relay.process.stdout.readline)
                    published, elapsed = int(line.split()[0]), float(line.split()[1])
                _, peak_mb = relay.memory_mb()
            finally:
                relay.stop()  # graceful: what it has in flight is published and settled
            left = await _left(schema)
    result: dict[str, Any] = {
        "target": target,
        "ordered": ordered,
        "messages": count,
        "published": published,
        "seconds": round(elapsed, 1),
        "msg_per_s": round(published / elapsed),
        "rss_idle_mb": round(idle_mb, 1),
        "rss_peak_mb": round(peak_mb, 1),
    }
    if target == "redis":
        # every message exactly once: on the stream or (the window ended first) still in the outbox
        ids = await redis.order_ids(topic, count)
        await redis.drop(topic)
        result["duplicates"] = len(ids) - len(set(ids))
        result["lost"] = count - len(set(ids)) - left
        if result["lost"] or result["duplicates"]:
            raise RuntimeError(f"lost or duplicated messages: {result}")
        rates = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.pairwise(samples[1:])]
        if rates:  # per-second rates in the middle of the drain (first and last second left out)
            result["per_second_min"] = round(min(rates))
            result["per_second_max"] = round(max(rates))
    print(
        f"  {count:>9,} {target:5} {'ordered' if ordered else 'unordered':9} "
        f"{result['msg_per_s']:8,} msg/s  ({published:,} in {elapsed:.0f} s)  "
        f"RSS {idle_mb:.0f} → {peak_mb:.0f} MB",
        flush=True,
    )
    return result


async def _left(schema: str) -> int:
    conn = await asyncpg.connect(PG_URL)
    try:
        left: int = await conn.fetchval(f'SELECT count(*) FROM "{schema}".outbox')
        return left
    finally:
        await conn.close()


async def main(sizes: list[int]) -> dict[str, Any]:
    rows = []
    async with Redis() as redis:
        for count in sizes:
            for target in ("redis", "null"):
                for ordered in (True, False):
                    rows.append(await drain(target, ordered, count, redis))
    result = {"keys": 1000, "rows": rows}
    save("backlog" if tuple(sizes) == SIZES else "backlog_" + "_".join(map(str, sizes)), result)
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["null"]:
        schema, ordered, count, window = sys.argv[2:6]
        asyncio.run(null_relay(schema, ordered == "True", int(count), float(window)))
    else:
        asyncio.run(main([int(a) for a in sys.argv[1:]] or list(SIZES)))
