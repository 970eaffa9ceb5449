"""What observability costs: enqueue with and without OpenTelemetry, the relay with metrics and
with tracing.

- ``enqueue``: ``Outbox.row`` (the Python work of ``enqueue``) in a fresh interpreter, µs per
  call: OpenTelemetry never imported; imported but no span active; a span active (the
  ``traceparent`` is captured and stored);
- ``observer``: one ``PrometheusRelayObserver.published`` call for a batch of 500 acknowledged
  messages (plus the claim and in-flight calls of that batch), µs per batch and per message;
- ``relay``: one relay draining 20k messages from PostgreSQL to a publisher that acknowledges at
  once (the database-side ceiling, where any overhead shows most), without observer, with the
  Prometheus observer, and with publish spans for every message (SDK with a batch processor
  and an exporter that drops everything). Runs are interleaved and the median is kept.

Run: ``.venv/bin/python -m benchmarks.observability``
"""

from __future__ import annotations

import asyncio
import datetime as dt
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import asyncpg
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import outboxer
from benchmarks.common import PAYLOAD, PG_URL, NullPublisher, fresh_schema, save
from outboxer.config import RelaySettings, TableNames
from outboxer.message import Message
from outboxer.observability.metrics import PrometheusRelayObserver
from outboxer.observability.tracing import TracingPublisher
from outboxer.relay import Relay
from outboxer.stores.postgres import PostgresStore

COUNT = 20_000
ROW = "o.row('orders', {'id': 1, 'total': 12.5}, key='k1', type='OrderCreated')"
SETUPS = {
    "no_opentelemetry": "from outboxer.outbox import Outbox; o = Outbox()",
    "opentelemetry_imported_no_span": (
        "import opentelemetry.trace; from outboxer.outbox import Outbox; o = Outbox()"
    ),
    "active_span": (
        "from opentelemetry import trace; from opentelemetry.sdk.trace import TracerProvider; "
        "span = TracerProvider().get_tracer('b').start_span('request'); "
        "cm = trace.use_span(span); cm.__enter__(); "
        "from outboxer.outbox import Outbox; o = Outbox()"
    ),
}


def enqueue_costs() -> dict[str, float]:
    costs = {}
    for name, setup in SETUPS.items():
        code = (
            "import timeit; "
            f"print(min(timeit.repeat({ROW!r}, setup={setup!r}, number=20000, repeat=7)) / 20000)"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
        costs[name] = round(float(out) * 1e6, 2)
        print(f"enqueue row, {name}: {costs[name]} µs")
    return costs


def observer_cost() -> dict[str, float]:
    now = dt.datetime.now(dt.UTC)
    batch = [Message(id=str(n), topic="orders", payload=b"{}", created_at=now) for n in range(500)]
    outcomes: list[Any] = ["published"] * 500
    observer = PrometheusRelayObserver("kafka")
    rounds = 2000
    started = time.perf_counter()
    for _ in range(rounds):
        observer.claimed(500, 0.002)
        observer.in_flight(2)
        observer.published(batch, outcomes, 0.01)
        observer.in_flight(1)
    per_batch = (time.perf_counter() - started) / rounds * 1e6
    result = {
        "us_per_batch_of_500": round(per_batch, 1),
        "us_per_message": round(per_batch / 500, 3),
    }
    print(f"observer: {result}")
    return result


class DropAll(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


async def fill_traced(schema: str, count: int, traced: bool) -> None:
    outbox = outboxer.Outbox(schema=schema)
    header = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    messages = [
        {
            "topic": "orders",
            "payload": {**PAYLOAD, "order_id": n},
            "key": n % 1000,
            "type": "OrderCreated",
            "headers": header if traced else None,
        }
        for n in range(count)
    ]
    conn = await asyncpg.connect(PG_URL)
    try:
        await outbox.enqueue_many_async(conn, messages)
        await conn.execute(f'VACUUM ANALYZE "{schema}".outbox')
    finally:
        await conn.close()


async def drain(variant: str) -> float:
    async with fresh_schema("bench_observability") as schema:
        async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
            await store.migrate()
        await fill_traced(schema, COUNT, traced=variant == "tracing")
        publisher: Any = NullPublisher()
        observer = None
        provider = None
        if variant == "metrics":
            observer = PrometheusRelayObserver("null")
        elif variant == "tracing":
            provider = TracerProvider()
            provider.add_span_processor(BatchSpanProcessor(DropAll(), max_queue_size=50_000))
            publisher = TracingPublisher(publisher, system="null", tracer_provider=provider)
        async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
            relay = Relay(store, publisher, RelaySettings(batch_size=500), observer=observer)
            started = time.perf_counter()
            counters = await relay.drain(timeout=600)
            elapsed = time.perf_counter() - started
        if provider is not None:
            provider.shutdown()
        assert counters.published == COUNT
        return COUNT / elapsed


async def relay_rates(repeats: int = 3) -> dict[str, float]:
    rates: dict[str, list[float]] = {"none": [], "metrics": [], "tracing": []}
    for _ in range(repeats):
        for variant in rates:
            rates[variant].append(await drain(variant))
    result = {f"{k}_msg_per_s": round(statistics.median(v)) for k, v in rates.items()}
    base = result["none_msg_per_s"]
    result["metrics_ratio"] = round(result["metrics_msg_per_s"] / base, 3)
    result["tracing_ratio"] = round(result["tracing_msg_per_s"] / base, 3)
    print(f"relay: {result}")
    return result


def main() -> None:
    result = {
        "enqueue_row_us": enqueue_costs(),
        "observer": observer_cost(),
        "relay_null_publisher": asyncio.run(relay_rates()),
    }
    print(save("observability", result))


if __name__ == "__main__":
    main()
