"""Relay metrics: values checked against known states, and ``outboxer relay --metrics-port``.

The observer is driven three ways: directly with hand-made messages (exact values), by a relay
over a real PostgreSQL outbox with a publisher whose failures are scripted (totals per topic and
outcome, latency counts), and through the CLI, scraped over HTTP like Prometheus does.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import os
import signal
import socket
import subprocess
import sys
import time
import tracemalloc
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import outboxer
from outboxer.config import Backoff, RelaySettings
from outboxer.errors import (
    BrokerUnavailable,
    PermanentPublishError,
    PublishError,
    RetryablePublishError,
)
from outboxer.message import Message
from outboxer.observability.metrics import (
    LATENCY_BUCKETS,
    OTHER_TOPICS,
    BatchHistogram,
    PrometheusRelayObserver,
)
from outboxer.ports import RelayInfo
from outboxer.relay import NoopObserver, Relay
from outboxer.stores.postgres import PostgresStore
from outboxer.testing import InMemoryStore, RecordingPublisher
from tests.acceptance.conftest import PYTHONPATH
from tests.conftest import require_service, wait_past_commit_gate
from tests.tansu import free_port

OUTBOXER = str(Path(sys.executable).parent / "outboxer")
ROOT = Path(__file__).resolve().parents[2]

FAST = RelaySettings(
    batch_size=50,
    max_attempts=2,
    retry=Backoff(base=0.01, factor=2, cap=0.05),
    outage=Backoff(base=0.05, factor=2, cap=0.1),
    min_poll_interval=0.005,
    poll_interval=0.02,
    heartbeat_interval=0.2,
)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


# -- the observer on its own: exact values ---------------------------------------------------


def test_published_counts_per_topic_and_outcome_and_latency_from_created_at() -> None:
    now = 1_700_000_000.0
    observer = PrometheusRelayObserver("kafka", clock=lambda: now)
    r = observer.registry

    def message(topic: str, age: float) -> Message:
        created = dt.datetime.fromtimestamp(now - age, dt.UTC)
        return Message(id=f"{topic}-{age}", topic=topic, payload=b"{}", created_at=created)

    batch = [message("orders", 0.004), message("orders", 0.2), message("audit", 3.0)]
    batch += [message("orders", 7.0), message("audit", 1.0), message("audit", 2.0)]
    observer.published(
        batch,
        ["published", "published", "published", "retry", "dead_letter", "broker_unavailable"],
        0.012,
    )
    sent = "outboxer_relay_published_total"
    failed = "outboxer_relay_publish_failures_total"
    assert value(r, sent, topic="orders", broker="kafka") == 2
    assert value(r, sent, topic="audit", broker="kafka") == 1
    assert value(r, failed, topic="orders", broker="kafka", outcome="retry") == 1
    assert value(r, failed, topic="audit", broker="kafka", outcome="dead_letter") == 1
    assert value(r, failed, topic="audit", broker="kafka", outcome="broker_unavailable") == 1
    # Only acknowledged messages have a write → ack latency.
    latency = "outboxer_relay_publish_latency_seconds"
    assert value(r, f"{latency}_count", broker="kafka") == 3
    assert value(r, f"{latency}_sum", broker="kafka") == pytest.approx(3.204)
    assert value(r, f"{latency}_bucket", broker="kafka", le="0.005") == 1
    assert value(r, f"{latency}_bucket", broker="kafka", le="0.25") == 2
    assert value(r, f"{latency}_bucket", broker="kafka", le="2.5") == 2
    assert value(r, f"{latency}_bucket", broker="kafka", le="+Inf") == 3
    assert value(r, "outboxer_end_to_end_lag_seconds") == pytest.approx(3.0)
    assert value(r, "outboxer_relay_last_ack_timestamp_seconds") == now
    duration = "outboxer_relay_publish_duration_seconds"
    assert value(r, f"{duration}_count", broker="kafka") == 1
    assert value(r, f"{duration}_sum", broker="kafka") == pytest.approx(0.012)

    # A call in which nothing was acknowledged leaves the lag of the last acknowledgement.
    observer.published([message("orders", 9.0)], ["retry"], 0.5)
    assert value(r, "outboxer_end_to_end_lag_seconds") == pytest.approx(3.0)
    assert value(r, failed, topic="orders", broker="kafka", outcome="retry") == 2


def test_lifecycle_heartbeat_claims_in_flight_outage_and_store_errors() -> None:
    clock = {"now": 1_000.0}
    observer = PrometheusRelayObserver("nats", clock=lambda: clock["now"])
    r = observer.registry
    started = dt.datetime(2025, 1, 31, 12, 0, tzinfo=dt.UTC)
    info = RelayInfo("relay-1", "host", 42, started, started)
    observer.relay_started(info)
    assert value(r, "outboxer_relay_up", relay_id="relay-1") == 1
    assert value(r, "outboxer_relay_start_timestamp_seconds", relay_id="relay-1") == (
        started.timestamp()
    )
    observer.heartbeat(True)
    clock["now"] = 1_005.0
    observer.heartbeat(False)
    assert value(r, "outboxer_relay_last_heartbeat_timestamp_seconds") == 1_000.0
    assert value(r, "outboxer_relay_heartbeat_failures_total") == 1
    assert value(r, "outboxer_relay_store_errors_total", operation="heartbeat") == 1

    observer.claimed(500, 0.003)
    observer.claimed(0, 0.001)
    assert value(r, "outboxer_relay_claimed_total") == 500
    assert value(r, "outboxer_relay_claim_duration_seconds_count") == 2
    assert value(r, "outboxer_relay_claim_duration_seconds_sum") == pytest.approx(0.004)
    observer.in_flight(3)
    assert value(r, "outboxer_relay_in_flight_batches") == 3

    observer.outage(1, 5.0)
    observer.outage(2, 10.0)
    assert value(r, "outboxer_relay_broker_outage") == 1
    assert value(r, "outboxer_relay_broker_outage_rounds") == 2
    assert value(r, "outboxer_relay_broker_outage_pause_seconds") == 10.0
    observer.outage(0, 0.0)
    assert value(r, "outboxer_relay_broker_outage") == 0
    assert value(r, "outboxer_relay_broker_outage_rounds") == 0
    assert value(r, "outboxer_relay_broker_outages_total") == 2

    observer.store_unavailable("claim")
    observer.store_unavailable("claim")
    assert value(r, "outboxer_relay_store_errors_total", operation="claim") == 2

    observer.relay_stopped(info)
    assert value(r, "outboxer_relay_up", relay_id="relay-1") == 0
    assert value(r, "outboxer_relay_in_flight_batches") == 0


def test_topic_labels_are_capped() -> None:
    observer = PrometheusRelayObserver("redis", max_topics=2)
    messages = [Message(id=str(n), topic=f"t{n}", payload=b"") for n in range(4)]
    observer.published(messages, ["published"] * 4, 0.001)
    r = observer.registry
    sent = "outboxer_relay_published_total"
    assert value(r, sent, topic="t0", broker="redis") == 1
    assert value(r, sent, topic="t1", broker="redis") == 1
    assert value(r, sent, topic="t2", broker="redis") is None
    assert value(r, sent, topic=OTHER_TOPICS, broker="redis") == 2


def test_topics_past_the_cap_take_no_memory_of_their_own() -> None:
    """A relay meeting a new topic per tenant for weeks: past ``max_topics`` each new topic
    kept an entry of its own (~170 bytes) for ever, 34 MB per 200,000 topics (a probe)."""
    observer = PrometheusRelayObserver("redis", max_topics=2)

    def publish(first: int) -> None:
        numbers = range(first, first + 1000)
        messages = [Message(id=str(n), topic=f"t{n}", payload=b"") for n in numbers]
        observer.published(messages, ["published", "retry"] * 500, 0.001)

    publish(0)  # the cap is reached, the _other series exist
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for first in range(1000, 21_000, 1000):
            publish(first)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 200_000, f"{grown} bytes kept for 20,000 topics past the cap"
    r = observer.registry
    sent = "outboxer_relay_published_total"
    assert value(r, sent, topic=OTHER_TOPICS, broker="redis") == 21 * 500 - 1
    failed = "outboxer_relay_publish_failures_total"
    retried = value(r, failed, topic=OTHER_TOPICS, broker="redis", outcome="retry")
    assert retried == 21 * 500 - 1


def test_batch_histogram_exposes_what_a_prometheus_histogram_would() -> None:
    values = [0.0004, 0.001, 0.003, 0.02, 0.02, 0.7, 12.0, 5000.0, -0.5]
    ours_registry, reference_registry = CollectorRegistry(), CollectorRegistry()
    ours = BatchHistogram("lat", "doc", LATENCY_BUCKETS, {"broker": "x"})
    ours_registry.register(ours)
    ours.observe_many(values[:4])
    ours.observe_many(values[4:])
    reference = Histogram(
        "lat", "doc", ["broker"], buckets=LATENCY_BUCKETS, registry=reference_registry
    ).labels("x")
    for v in values:
        reference.observe(max(0.0, v))  # ours counts a clock-skewed negative latency as 0

    def samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
        text = generate_latest(registry).decode()
        return {
            (s.name, s.labels.get("le", "")): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if not s.name.endswith("_created")
        }

    assert samples(ours_registry) == samples(reference_registry)


# -- a relay over PostgreSQL ------------------------------------------------------------------


class Scripted(RecordingPublisher):
    """Poison always fails (retryable), Permanent is refused for good."""

    def __init__(self) -> None:
        super().__init__(
            fail=lambda m: (
                RetryablePublishError("cannot decode")
                if m.type == "Poison"
                else PermanentPublishError("refused")
                if m.type == "Permanent"
                else None
            )
        )


async def test_relay_over_postgres_counts_every_outcome(
    pg_url: str, pg_schema: str, pg_store: PostgresStore
) -> None:
    outbox = outboxer.Outbox(schema=pg_schema)
    conn = await asyncpg.connect(pg_url)
    try:
        async with conn.transaction():
            for n in range(30):
                await outbox.enqueue_async(conn, "orders", {"n": n}, key=f"k{n % 5}")
            await outbox.enqueue_async(conn, "audit", {"x": 1}, key="p", type="Poison")
            await outbox.enqueue_async(conn, "bad", {"x": 2}, type="Permanent")
    finally:
        await conn.close()
    await wait_past_commit_gate(pg_store)
    observer = PrometheusRelayObserver("test")
    relay = Relay(pg_store, Scripted(), FAST, observer=observer)
    await relay.drain(timeout=30)
    r = observer.registry
    sent, failed = "outboxer_relay_published_total", "outboxer_relay_publish_failures_total"
    assert value(r, sent, topic="orders", broker="test") == 30
    assert value(r, failed, topic="audit", broker="test", outcome="retry") == 1  # max_attempts=2
    assert value(r, failed, topic="audit", broker="test", outcome="dead_letter") == 1
    assert value(r, failed, topic="bad", broker="test", outcome="dead_letter") == 1
    assert value(r, failed, topic="orders", broker="test", outcome="retry") is None
    assert value(r, "outboxer_relay_claimed_total") == 33  # the poison was claimed twice
    latency = "outboxer_relay_publish_latency_seconds"
    assert value(r, f"{latency}_count", broker="test") == 30
    mean = (value(r, f"{latency}_sum", broker="test") or 0) / 30
    assert 0 <= mean < 30, "write → ack from the database's created_at"
    lag = value(r, "outboxer_end_to_end_lag_seconds")
    assert lag is not None and 0 <= lag < 30
    assert (value(r, "outboxer_relay_last_ack_timestamp_seconds") or 0) > time.time() - 60
    assert (value(r, "outboxer_relay_claim_duration_seconds_count") or 0) >= 3
    assert value(r, "outboxer_relay_up", relay_id=relay.relay_id) == 0  # stopped
    assert value(r, "outboxer_relay_in_flight_batches") == 0
    assert (value(r, "outboxer_relay_last_heartbeat_timestamp_seconds") or 0) > 0
    stats = await pg_store.stats()
    assert stats.dead_letters == 2 and stats.pending == 0


async def test_outage_is_visible_while_it_lasts_and_cleared_after() -> None:
    store = InMemoryStore()
    for n in range(10):
        store.enqueue("t", {"n": n})
    observer = PrometheusRelayObserver("test")
    seen: list[tuple[float | None, float | None]] = []

    class DownTwice(RecordingPublisher):
        calls = 0

        async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
            self.calls += 1
            seen.append(
                (
                    value(observer.registry, "outboxer_relay_broker_outage"),
                    value(observer.registry, "outboxer_relay_broker_outage_rounds"),
                )
            )
            if self.calls <= 2:
                return [BrokerUnavailable("connection refused")] * len(messages)
            return await super().publish(messages)

    await Relay(store, DownTwice(), FAST, observer=observer).drain(timeout=10)
    r = observer.registry
    # Before the first call the broker was fine; before the 2nd and 3rd, one and two rounds.
    assert seen == [(0.0, 0.0), (1.0, 1.0), (1.0, 2.0)]
    assert value(r, "outboxer_relay_broker_outage") == 0
    assert value(r, "outboxer_relay_broker_outage_rounds") == 0
    assert value(r, "outboxer_relay_broker_outages_total") == 2
    unavailable = "outboxer_relay_publish_failures_total"
    assert value(r, unavailable, topic="t", broker="test", outcome="broker_unavailable") == 20
    assert value(r, "outboxer_relay_published_total", topic="t", broker="test") == 10


async def test_a_failing_observer_never_stops_delivery(caplog: pytest.LogCaptureFixture) -> None:
    store = InMemoryStore()
    ids = [store.enqueue("t", {"n": n}) for n in range(20)]

    class Broken(NoopObserver):
        def published(self, *args: object) -> None:
            raise RuntimeError("observer bug")

        def claimed(self, count: int, seconds: float) -> None:
            raise RuntimeError("observer bug")

    publisher = RecordingPublisher()
    await Relay(store, publisher, FAST, observer=Broken()).drain(timeout=10)
    assert sorted(m.id for m in publisher.messages) == sorted(ids)
    failures = [r for r in caplog.records if "relay observer" in r.getMessage()]
    assert {r.getMessage().rsplit(" ", 1)[-1] for r in failures} == {"published()", "claimed()"}


# -- outboxer relay --metrics-port ------------------------------------------------------------


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [OUTBOXER, *args], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )


def relay_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXER_")}
    env["PYTHONPATH"] = PYTHONPATH
    return env


async def test_cli_relay_serves_metrics_scraped_over_http(
    pg_url: str, pg_schema: str, pg_store: PostgresStore, topic: str, tmp_path: Path
) -> None:
    require_service("Redis", "127.0.0.1", 6379)
    port = free_port()
    env = relay_env()
    env["OUTBOXER_METRICS_PORT"] = str(port)  # the environment variable works too
    log = tmp_path / "relay.log"
    args = ["relay", "--database-url", pg_url, "--schema", pg_schema]
    args += ["--broker", "redis://127.0.0.1:6379/0", "--metrics-host", "127.0.0.1"]
    proc = start(args, env, log)
    redis = aioredis.Redis()
    try:
        outbox = outboxer.Outbox(schema=pg_schema)
        conn = await asyncpg.connect(pg_url)
        try:
            async with conn.transaction():
                for n in range(50):
                    await outbox.enqueue_async(conn, topic, {"n": n}, key=str(n % 7))
        finally:
            await conn.close()
        key = frozenset({("topic", topic), ("broker", "redis")})
        deadline = time.monotonic() + 30
        figures: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        while time.monotonic() < deadline:
            try:
                figures = await asyncio.to_thread(scrape, port)
            except OSError:
                figures = {}
            if figures.get(("outboxer_relay_published_total", key)) == 50:
                break
            await asyncio.sleep(0.1)
        assert figures.get(("outboxer_relay_published_total", key)) == 50, log.read_text()
        ups = [v for (name, _), v in figures.items() if name == "outboxer_relay_up"]
        assert ups == [1.0]
        latency = frozenset({("broker", "redis")})
        assert figures[("outboxer_relay_publish_latency_seconds_count", latency)] == 50
        heartbeat = figures[("outboxer_relay_last_heartbeat_timestamp_seconds", frozenset())]
        assert time.time() - 60 < heartbeat <= time.time() + 1
        assert ("process_resident_memory_bytes", frozenset()) in figures
        assert await redis.xlen(topic) == 50
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        await redis.delete(topic)
        await redis.aclose()
    assert proc.returncode == 0, log.read_text()
    assert f"relay metrics on http://127.0.0.1:{port}/metrics" in log.read_text()


def test_cli_metrics_port_taken_is_one_line(pg_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                *(OUTBOXER, "relay", "--database-url", pg_url, "--broker", "redis://127.0.0.1"),
                *("--metrics-port", str(port), "--metrics-host", "127.0.0.1"),
            ],
            capture_output=True,
            text=True,
            env=relay_env(),
            timeout=60,
            cwd=ROOT,
        )
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"cannot serve metrics on 127.0.0.1:{port}" in lines[0]
