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
in one transaction, and the clock runs from that commit. Memory: the relay process's resident
set size from ``/proc/<pid>/status`` when idle and its peak (``VmHWM``) over the drain.
Target (docs/benchmarks.md): throughput does not fall as the backlog grows; RSS ≤ 150 MB.

Run: ``.venv/bin/python -m benchmarks.backlog [20000 100000 1000000]``
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
import uuid
from typing import Any

from benchmarks.common import PG_URL, NullPublisher, fresh_schema, save
from benchmarks.peers import Redis, RelayProcess, fill_outboxer, outboxer_relay, wait_for
from outboxer.config import RelaySettings, TableNames
from outboxer.relay import Relay
from outboxer.stores.postgres import PostgresStore

SIZES = (20_000, 100_000, 1_000_000)


async def null_relay(schema: str, ordered: bool, count: int) -> None:
    """The child process: a relay with a null publisher; prints ``ready``, then ``done`` once
    it has published ``count`` messages."""
    async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
        relay = Relay(store, NullPublisher(), RelaySettings(ordered=ordered))
        task = asyncio.create_task(relay.run())
        print("ready", flush=True)
        while relay.counters.published < count:
            await asyncio.sleep(0.005)
        print("done", flush=True)
        relay.stop()
        await task


async def drain(target: str, ordered: bool, count: int, redis: Redis) -> dict[str, Any]:
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
                    sys.executable,
                    "-m",
                    "benchmarks.backlog",
                    "null",
                    schema,
                    str(ordered),
                    str(count),
                ]
            )
        try:
            if target == "redis":
                async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:

                    async def live() -> bool:
                        return len((await store.stats()).relays) >= 1

                    await wait_for(live, 30, relay)
            else:
                await relay.wait_line("ready")
            idle_mb, _ = relay.memory_mb()
            await fill_outboxer(schema, topic, count)
            started = time.perf_counter()  # the backlog has just committed
            if target == "redis":

                async def delivered() -> bool:
                    now, have = time.perf_counter() - started, await redis.count(topic)
                    if not samples or now - samples[-1][0] >= 1.0:
                        samples.append((round(now, 2), have))
                    return have >= count

                await wait_for(delivered, 1800, relay)
                finished = time.perf_counter()
            else:
                finished = await relay.wait_line("done", timeout=1800)
            _, peak_mb = relay.memory_mb()
        finally:
            relay.stop()
    result: dict[str, Any] = {
        "target": target,
        "ordered": ordered,
        "messages": count,
        "msg_per_s": round(count / (finished - started)),
        "rss_idle_mb": round(idle_mb, 1),
        "rss_peak_mb": round(peak_mb, 1),
    }
    if target == "redis":
        ids = await redis.order_ids(topic, count)
        await redis.drop(topic)
        distinct = set(ids)
        result["lost"] = len(set(range(count)) - distinct)
        result["duplicates"] = len(ids) - len(distinct)
        if result["lost"] or result["duplicates"]:
            raise RuntimeError(f"lost or duplicated messages: {result}")
        rates = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.pairwise(samples[1:])]
        if rates:  # per-second rates in the middle of the drain (first and last second left out)
            result["per_second_min"], result["per_second_max"] = (
                round(min(rates)),
                round(max(rates)),
            )
    print(
        f"  {count:>9,} {target:5} {'ordered' if ordered else 'unordered':9} "
        f"{result['msg_per_s']:8,} msg/s  RSS {idle_mb:.0f} → {peak_mb:.0f} MB",
        flush=True,
    )
    return result


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
        schema, ordered, count = sys.argv[2:5]
        asyncio.run(null_relay(schema, ordered == "True", int(count)))
    else:
        asyncio.run(main([int(a) for a in sys.argv[1:]] or list(SIZES)))
