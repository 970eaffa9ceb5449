"""HTTP webhooks: the raw httpx ceiling next to the HttpPublisher's rate.

``raw_ceiling`` POSTs the messages with httpx alone (one ``AsyncClient`` whose keep-alive pool
has ``concurrency`` connections, that many requests in flight, a 2xx checked per message) and no
outboxer code. ``raw_ceiling_small_pools`` does the same through several small pools, the way
the adapter uses httpx (httpcore scans its whole pool per request, see docs/brokers/http.md):
the fairer ceiling for the adapter's own overhead. ``adapter_rate`` sends the same messages
through :class:`~outboxer.brokers.http.HttpPublisher` the way the relay calls it (batches of
500, up to 4 batches at once). ``python benchmarks/raw_http.py`` starts the test receiver
(``tests/http_receiver.py``) in its own process on 127.0.0.1, sends 20,000 messages of ~120
bytes each way, and prints the rates and ratios.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from outboxer._ids import new_message_id  # noqa: E402
from outboxer.brokers.http.publisher import HttpPublisher  # noqa: E402
from outboxer.message import JSON, Message  # noqa: E402

CONCURRENCY = 64
BATCH = 500
BATCHES_IN_FLIGHT = 4
ROUNDS = 3


async def raw_ceiling(url: str, messages: list[Message], concurrency: int = CONCURRENCY) -> float:
    """Messages/s of httpx alone: one pool, ``concurrency`` POSTs in flight, answers checked."""
    return await _raw(url, messages, concurrency, pool_size=concurrency)


async def raw_ceiling_small_pools(
    url: str, messages: list[Message], concurrency: int = CONCURRENCY, pool_size: int = 4
) -> float:
    """Like :func:`raw_ceiling`, the connections split into pools of ``pool_size``."""
    return await _raw(url, messages, concurrency, pool_size=pool_size)


async def _raw(url: str, messages: list[Message], concurrency: int, *, pool_size: int) -> float:
    limits = httpx.Limits(max_connections=pool_size, max_keepalive_connections=pool_size)
    clients = [
        httpx.AsyncClient(limits=limits, timeout=10.0) for _ in range(concurrency // pool_size)
    ]
    try:
        pending = iter(messages)
        failures = 0

        async def worker(client: httpx.AsyncClient) -> None:
            nonlocal failures
            for message in pending:
                response = await client.post(
                    url,
                    content=message.payload,
                    headers={"content-type": message.content_type, "ce-id": message.id},
                )
                if not response.is_success:
                    failures += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(clients[i % len(clients)]) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
    finally:
        for client in clients:
            await client.aclose()
    if failures:
        raise RuntimeError(f"raw: {failures} requests were not acknowledged")
    return len(messages) / elapsed


async def adapter_rate(
    url: str, messages: Sequence[Message], *, secret: str | None = None
) -> float:
    """Messages/s of ``HttpPublisher.publish``: batches of 500, up to 4 batches at once."""
    batches = [messages[i : i + BATCH] for i in range(0, len(messages), BATCH)]
    async with HttpPublisher(url, secret=secret, concurrency=CONCURRENCY) as publisher:
        pending = iter(batches)
        failures = 0

        async def relay_slot() -> None:
            nonlocal failures
            for batch in pending:
                results = await publisher.publish(batch)
                failures += sum(result is not None for result in results)

        started = time.perf_counter()
        await asyncio.gather(*(relay_slot() for _ in range(BATCHES_IN_FLIGHT)))
        elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"adapter: {failures} messages were not acknowledged")
    return len(messages) / elapsed


def build_messages(count: int, topic: str = "orders") -> list[Message]:
    """``count`` distinct-key JSON messages with ~120-byte payloads."""
    now = dt.datetime.now(dt.UTC)
    return [
        Message(
            id=new_message_id(),
            topic=topic,
            payload=(
                f'{{"order_id":{n},"customer":"c-{n % 977:04d}","total_cents":{n * 37 % 100000},'
                f'"currency":"EUR","status":"created","note":"benchmark payload"}}'
            ).encode(),
            key=f"order-{n}",
            type="OrderCreated",
            content_type=JSON,
            created_at=now,
        )
        for n in range(count)
    ]


def _start_receiver() -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.http_receiver", "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("listening on "):
        process.kill()
        raise RuntimeError(f"the receiver did not start: {line!r}")
    return process, line.removeprefix("listening on ").strip()


async def _main() -> None:
    messages = build_messages(20_000)
    size = sum(len(m.payload) for m in messages) / len(messages)
    process, url = _start_receiver()
    try:
        await raw_ceiling(url, build_messages(2_000, "warmup"))  # connections, JIT-free warm-up
        raw, small, adapter, signed = [], [], [], []
        for _ in range(ROUNDS):  # interleaved rounds: every side sees the same machine state
            raw.append(await raw_ceiling(url, messages))
            small.append(await raw_ceiling_small_pools(url, messages))
            adapter.append(await adapter_rate(url, messages))
            signed.append(await adapter_rate(url, messages, secret="benchmark-secret"))
    finally:
        process.terminate()
        process.wait()
    best_raw, best_small = max(raw), max(small)
    best_adapter, best_signed = max(adapter), max(signed)
    print(f"{len(messages)} messages of ~{size:.0f} bytes, concurrency {CONCURRENCY}, best of")
    print(f"raw httpx, one pool:          {best_raw:8.0f} msg/s   (runs: {_fmt(raw)})")
    print(f"raw httpx, pools of 4:        {best_small:8.0f} msg/s   (runs: {_fmt(small)})")
    print(f"HttpPublisher:                {best_adapter:8.0f} msg/s   (runs: {_fmt(adapter)})")
    print(f"HttpPublisher, signed:        {best_signed:8.0f} msg/s   (runs: {_fmt(signed)})")
    print(f"adapter / raw one pool:       {best_adapter / best_raw:8.2f}")
    print(f"adapter / raw pools of 4:     {best_adapter / best_small:8.2f}")
    print(f"signed adapter / pools of 4:  {best_signed / best_small:8.2f}")


def _fmt(rates: list[float]) -> str:
    return ", ".join(f"{r:.0f}" for r in rates)


if __name__ == "__main__":
    asyncio.run(_main())
