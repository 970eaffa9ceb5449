"""CPU per message of the inbox alone, on both sides: the consumer's process and PostgreSQL.

No broker: ``COUNT`` messages (~120 bytes, 1,000 keys, as in :mod:`benchmarks.consumers`) are
decoded beforehand and fed in batches of ``BATCH`` through :class:`~outboxer.inbox.consumer.
Deliveries` (two batches in flight, as every broker adapter does) to
:meth:`Inbox.receive_batch <outboxer.inbox.Inbox.receive_batch>` on PostgreSQL, with a handler
that does nothing: with the context (``ctx``) and without. Reported per message: wall time,
the client's CPU (``time.process_time``) and the CPU of the pool's PostgreSQL backends (from
``/proc``, so PostgreSQL must run on this machine; 0 otherwise). CPU figures hold up on a
loaded machine far better than throughput does, which makes this the probe for changes to the
inbox's cost per message (issue 14); compare trees by running it from each
(``PYTHONPATH=<tree>/src:<tree>``).

Run: ``.venv/bin/python -m benchmarks.inbox_cpu`` (``OUTBOXER_BENCH_COUNT``, default 10,000;
``OUTBOXER_BENCH_BATCH``, default 100). An older tree is measured with this file:
``PYTHONPATH=<old tree>/src:. .venv/bin/python -m benchmarks.inbox_cpu``.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import PG_URL, fresh_schema, save
from benchmarks.consumers import COUNT, messages, plain_registry, registry
from outboxer.config import TableNames
from outboxer.inbox import Inbox, InboxSettings
from outboxer.inbox.consumer import Deliveries
from outboxer.stores.postgres import PostgresStore

BATCH = int(os.environ.get("OUTBOXER_BENCH_BATCH", "100"))
ROUNDS = 3  # best of
_TICK = os.sysconf("SC_CLK_TCK")


def backend_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` have used; 0 for those not here."""
    total = 0
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists():
            fields = stat.read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / _TICK


async def acknowledge() -> None:
    return None


async def one_round(store: PostgresStore, with_context: bool) -> dict[str, float]:
    handlers = registry if with_context else plain_registry
    settings = InboxSettings(consumer=f"c_{uuid.uuid4().hex[:8]}", sweep_interval=0)
    inbox = Inbox(store, handlers, settings)
    batch = messages("orders")
    batches = [batch[i : i + BATCH] for i in range(0, len(batch), BATCH)]
    async with Deliveries(inbox.receive_batch) as deliveries:  # warm-up: connections, plans
        await deliveries.submit(batches[0], acknowledge)
    pool: Any = store.db.pool
    pids = [h._con.get_server_pid() for h in pool._holders if h._con is not None]
    server, client, wall = backend_seconds(pids), time.process_time(), time.perf_counter()
    async with Deliveries(inbox.receive_batch) as deliveries:
        for each in batches[1:]:
            await deliveries.submit(each, acknowledge)
    wall = time.perf_counter() - wall
    client = time.process_time() - client
    server = backend_seconds(pids) - server
    n = sum(len(b) for b in batches[1:])
    return {
        "msg_per_s": round(n / wall),
        "wall_us": round(wall / n * 1e6, 1),
        "client_cpu_us": round(client / n * 1e6, 1),
        "server_cpu_us": round(server / n * 1e6, 1),
    }


async def main() -> None:
    rows = []
    async with fresh_schema(f"bench_inbox_cpu_{uuid.uuid4().hex[:6]}") as schema:
        async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
            await store.migrate()
            for with_context in (True, False):
                runs = [await one_round(store, with_context) for _ in range(ROUNDS)]
                best = min(runs, key=lambda r: r["client_cpu_us"])
                row = {"handler": "ctx" if with_context else "no ctx", **best}
                print(row, flush=True)
                rows.append(row)
    save("inbox_cpu", {"count": COUNT, "batch_size": BATCH, "rounds": ROUNDS, "rows": rows})


if __name__ == "__main__":
    asyncio.run(main())
