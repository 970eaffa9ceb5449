"""Kafka consumer adapter: publish → deliver latency at a steady moderate rate, by batch size.

librdkafka's ``consume(n, timeout)`` returns when it holds ``n`` records or the timeout (0.5 s
in the adapter) ran out, so below ``n`` records per half second a bigger batch waits longer to
fill. This measures what that costs: messages published at ``RATE`` msg/s (1,000 keys, 3
partitions, Tansu) for 6 s, consumed by the adapter without the inbox (a handler that records
the arrival), batch sizes alternately, twice (100, 500, 100, 500 by default).

Run: ``.venv/bin/python -m benchmarks.kafka_batch_latency [RATE [BATCH ...]]``
(e.g. ``... kafka_batch_latency 1000 100 500``); results in ``kafka_batch_latency_<rate>.json``.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from benchmarks.common import save
from outboxer.brokers import consumer_from_url, publisher_from_url
from outboxer.message import Message
from outboxer.outbox import Outbox

SECONDS = 6.0
ROUNDS = 2


def quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


async def one_run(bootstrap: str, rate: int, batch: int) -> list[float]:
    """Seconds from publish acknowledged to delivery, per message."""
    from tests.tansu import create_topic

    topic = f"lat-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(create_topic, bootstrap, topic, 3)
    outbox = Outbox()
    sent: dict[str, float] = {}
    latencies: list[float] = []
    stop = asyncio.Event()

    def message(n: int) -> Message:
        row = outbox.row(topic, {"n": n}, key=str(n % 1000), type="T")
        return Message(id=row.id, topic=topic, payload=row.payload, key=row.key, type=row.type)

    async def deliver(batch: Sequence[Message]) -> None:
        now = time.perf_counter()
        latencies.extend(now - sent[m.id] for m in batch if m.id in sent)

    url = f"kafka://{bootstrap}"
    name = f"lat_{uuid.uuid4().hex[:8]}"
    adapter = consumer_from_url(url, name=name, topics=[topic], batch_size=batch)
    async with adapter, publisher_from_url(url) as publisher:
        runner = asyncio.create_task(adapter.run(deliver, stop))
        await publisher.publish([message(-1)])
        await asyncio.sleep(8)  # the group join
        start = time.perf_counter()
        n = 0
        while time.perf_counter() - start < SECONDS:
            due = int((time.perf_counter() - start) * rate) - n
            if due > 0:
                chunk = [message(n + i) for i in range(due)]
                n += due
                published = time.perf_counter()
                sent.update((m.id, published) for m in chunk)
                await publisher.publish(chunk)
            await asyncio.sleep(0.005)
        await asyncio.sleep(1.5)
        stop.set()
        await runner
    return sorted(latencies)


async def main(rate: int, batches: list[int]) -> list[dict[str, Any]]:
    from tests.tansu import TansuBroker

    rows = []
    tansu = await asyncio.to_thread(TansuBroker().start)
    try:
        for run in range(1, ROUNDS + 1):
            for batch in batches:
                latencies = await one_run(tansu.bootstrap, rate, batch)
                row = {"run": run, "rate": rate, "batch_size": batch, "messages": len(latencies)}
                for q in (0.5, 0.9, 0.99):
                    row[f"p{round(q * 100)}_ms"] = round(quantile(latencies, q) * 1000, 1)
                print(row, flush=True)
                rows.append(row)
    finally:
        tansu.stop()
    save(f"kafka_batch_latency_{rate}", {"seconds": SECONDS, "rows": rows})
    return rows


if __name__ == "__main__":
    arguments = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(arguments[0] if arguments else 1000, arguments[1:] or [100, 500]))
