"""A burst on a relay that idled on a vacuumed empty outbox, end to end, as a user runs it.

A real relay (``outboxer relay``, Redis, ordered, defaults; autovacuum on) drains a warm-up of
2,000 messages; the outbox is vacuumed until the table is truncated to 0 pages, as autovacuum
leaves a drained outbox; the relay idles 3 s (its claims are planned on the empty table); then
N messages over 1,000 keys commit in one transaction. Printed: seconds from that commit until
the first message left the outbox and until the outbox was empty.

Run: ``.venv/bin/python -m benchmarks.burst_after_idle [N]`` (50,000). Against an older revision:
``git worktree add /tmp/old <rev>`` and run with ``PYTHONPATH=/tmp/old/src`` (the relay process
inherits it).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

import outboxer
from benchmarks.common import PG_URL, save

OUTBOXER = str(Path(sys.executable).parent / "outboxer")
LIMIT = 300.0  # seconds: a drain slower than this is reported as not drained


async def main(count: int) -> dict[str, Any]:
    schema = f"bench_burst_{uuid.uuid4().hex[:6]}"
    table = f'"{schema}".outbox'
    db = ["--database-url", PG_URL, "--schema", schema]
    upgrade = await asyncio.create_subprocess_exec(OUTBOXER, "db", "upgrade", *db)
    assert await upgrade.wait() == 0
    conn = await asyncpg.connect(PG_URL)
    relay = await asyncio.create_subprocess_exec(
        OUTBOXER,
        *("relay", *db, "--broker", "redis://127.0.0.1:6379"),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    outbox = outboxer.Outbox(schema=schema)

    async def burst(n: int) -> float:
        batch = [
            {"topic": f"t_{schema}", "payload": {"n": i}, "key": f"k{i % 1000}"} for i in range(n)
        ]
        async with conn.transaction():
            await outbox.enqueue_many_async(conn, batch)
        return time.monotonic()

    async def drained(n: int, since: float) -> tuple[float | None, float | None]:
        first = None
        while left := await conn.fetchval(f"SELECT count(*) FROM {table}"):
            if first is None and left < n:
                first = time.monotonic() - since
            if time.monotonic() - since > LIMIT:
                return first, None
            await asyncio.sleep(0.05)
        return first or time.monotonic() - since, time.monotonic() - since

    try:
        await drained(2000, await burst(2000))
        for _ in range(20):  # a truncation waits for a moment between the relay's claims
            await conn.execute(f"VACUUM {table}")
            if not await conn.fetchval(f"SELECT pg_relation_size('{table}')"):
                break
            await asyncio.sleep(0.5)
        pages = await conn.fetchval(f"SELECT pg_relation_size('{table}') / 8192")
        await asyncio.sleep(3)
        first, drain = await drained(count, await burst(count))
    finally:
        relay.terminate()
        await relay.wait()
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.close()
    result = {
        "messages": count,
        "pages_before_the_burst": pages,
        "first_out_s": first and round(first, 2),
        "drained_s": drain and round(drain, 2),
        "outboxer": outboxer.__file__,
    }
    print(result)
    save("burst_after_idle", result)
    return result


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 50_000))
