"""Tracing: the trace context captured at enqueue is continued by the relay's publish span and
handed on to the broker, with the OpenTelemetry SDK's in-memory exporter (and, for the CLI, its
console exporter)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, TraceState

import outboxer
from outboxer.config import Backoff, RelaySettings
from outboxer.errors import PermanentPublishError, RetryablePublishError
from outboxer.message import Message
from outboxer.observability.tracing import TracingPublisher, messaging_system
from outboxer.relay import Relay
from outboxer.stores.postgres import PostgresStore
from outboxer.testing import InMemoryStore, RecordingPublisher
from tests.conftest import require_service, wait_past_commit_gate

OUTBOXER = str(Path(sys.executable).parent / "outboxer")
ROOT = Path(__file__).resolve().parents[2]

FAST = RelaySettings(
    batch_size=50,
    max_attempts=2,
    retry=Backoff(base=0.01, factor=2, cap=0.05),
    min_poll_interval=0.005,
    poll_interval=0.02,
)


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """A private SDK provider (the global one can be set only once per process)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def traceparent(span: ReadableSpan) -> str:
    context = span.context
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def by_name(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def test_publish_span_is_the_child_of_the_enqueue_span_and_travels_to_the_broker(
    pg_url: str,
    pg_schema: str,
    pg_store: PostgresStore,
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    app = provider.get_tracer("app")
    outbox = outboxer.Outbox(schema=pg_schema)
    conn = await asyncpg.connect(pg_url)
    try:
        with app.start_as_current_span("POST /api/orders"):
            async with conn.transaction():
                traced = await outbox.enqueue_async(
                    conn, "orders", {"id": 1}, key="1", type="OrderCreated"
                )
        async with conn.transaction():  # outside any span
            untraced = await outbox.enqueue_async(conn, "orders", {"id": 2}, key="2")
    finally:
        await conn.close()
    [request] = by_name(exporter, "POST /api/orders")
    stored = await pg_store.execute("SELECT id, headers::text FROM {outbox} ORDER BY seq")
    headers = {row[0]: json.loads(row[1]) for row in stored}
    assert headers[traced] == {"traceparent": traceparent(request)}
    assert headers[untraced] == {}

    await wait_past_commit_gate(pg_store)
    recorder = RecordingPublisher()
    publisher = TracingPublisher(recorder, system="kafka", tracer_provider=provider)
    await Relay(pg_store, publisher, FAST).drain(timeout=30)

    [publish] = by_name(exporter, "publish orders")
    assert publish.parent is not None and request.context is not None
    assert publish.parent.span_id == request.context.span_id
    assert publish.context is not None
    assert publish.context.trace_id == request.context.trace_id
    assert publish.kind is SpanKind.PRODUCER
    assert publish.status.status_code is StatusCode.UNSET  # success: libraries leave it unset
    assert dict(publish.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "send",
        "messaging.destination.name": "orders",
        "messaging.message.id": traced,
        "outboxer.attempt": 1,
        "outboxer.message.type": "OrderCreated",
    }
    delivered = {m.id: m for m in recorder.messages}
    # The broker gets the publish span's context, so consumers continue below it.
    assert delivered[traced].headers == {"traceparent": traceparent(publish)}
    assert delivered[untraced].headers == {}  # no context, no span, nothing added


async def test_failed_publishes_are_error_spans_one_per_attempt(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    store = InMemoryStore()
    with provider.get_tracer("app").start_as_current_span("request"):
        flaky = store.enqueue("audit", {"x": 1}, type="Flaky")
        refused = store.enqueue("bad", {"x": 2}, type="Refused")

    def fail(message: Message) -> RetryablePublishError | PermanentPublishError | None:
        if message.type == "Refused":
            return PermanentPublishError("topic 'bad' does not exist")
        return RetryablePublishError("broker said no") if message.attempts == 0 else None

    recorder = RecordingPublisher(fail=fail)
    publisher = TracingPublisher(recorder, system="nats", tracer_provider=provider)
    await Relay(store, publisher, FAST).drain(timeout=10)

    [bad] = by_name(exporter, "publish bad")
    assert bad.status.status_code is StatusCode.ERROR
    assert bad.status.description == "topic 'bad' does not exist"
    assert (bad.attributes or {})["error.type"] == "PermanentPublishError"
    first, second = sorted(by_name(exporter, "publish audit"), key=lambda s: s.start_time or 0)
    assert first.status.status_code is StatusCode.ERROR
    assert (first.attributes or {})["outboxer.attempt"] == 1
    assert second.status.status_code is StatusCode.UNSET
    assert (second.attributes or {})["outboxer.attempt"] == 2
    # Both attempts are children of the request that wrote the message.
    [request] = by_name(exporter, "request")
    assert request.context is not None
    assert {s.parent.span_id for s in (first, second, bad) if s.parent} == {request.context.span_id}
    assert [m.id for m in recorder.messages] == [flaky]
    assert (await store.get_dead_letter(refused)).failure_reason == "topic 'bad' does not exist"


async def test_tracestate_is_carried_and_user_traceparent_wins(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    store = InMemoryStore()
    parent = trace.SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=trace.TraceFlags(1),
        trace_state=TraceState([("vendor", "abc")]),
    )
    with trace.use_span(trace.NonRecordingSpan(parent)):
        with_state = store.enqueue("t", {"n": 1})
        theirs = "00-11111111111111111111111111111111-2222222222222222-01"
        explicit = store.enqueue("t", {"n": 2}, headers={"traceparent": theirs, "x": "y"})
    stored = {m.id: m.headers for m in store.pending_messages}
    assert stored[with_state] == {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tracestate": "vendor=abc",
    }
    assert stored[explicit] == {"traceparent": theirs, "x": "y"}

    recorder = RecordingPublisher()
    await Relay(
        store, TracingPublisher(recorder, system="x", tracer_provider=provider), FAST
    ).drain(timeout=10)
    published = {s.attributes["messaging.message.id"]: s for s in exporter.get_finished_spans()}  # type: ignore[index]
    sent = {m.id: m.headers for m in recorder.messages}
    assert sent[with_state] == {
        "traceparent": traceparent(published[with_state]),
        "tracestate": "vendor=abc",
    }
    assert published[explicit].parent is not None
    assert published[explicit].parent.span_id == 0x2222222222222222
    assert sent[explicit]["x"] == "y"


async def test_unsampled_and_malformed_contexts_pass_through_without_a_span(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    store = InMemoryStore()
    unsampled = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}
    malformed = {"traceparent": "00-not-a-context-01"}
    ids = [store.enqueue("t", {"n": 1}, headers=unsampled)]
    ids.append(store.enqueue("t", {"n": 2}, headers=malformed))
    recorder = RecordingPublisher()
    publisher = TracingPublisher(recorder, system="x", tracer_provider=provider)
    await Relay(store, publisher, FAST).drain(timeout=10)
    assert [dict(m.headers) for m in recorder.messages] == [unsampled, malformed]
    assert [m.id for m in recorder.messages] == ids
    assert exporter.get_finished_spans() == ()


def test_enqueue_without_opentelemetry_imports_nothing_and_adds_nothing() -> None:
    code = (
        "import sys; from outboxer.outbox import Outbox; "
        "row = Outbox().row('t', {'a': 1}); "
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')]; "
        "print(row.headers)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "{}"


def test_messaging_system_names() -> None:
    assert messaging_system("kafka://h:9092") == "kafka"
    assert messaging_system("amqp://u:p@h/") == "rabbitmq"
    assert messaging_system("inprocess://m:r") == "outboxer.inprocess"


# -- outboxer relay --tracing ----------------------------------------------------------------


def relay_process(args: list[str], env_extra: dict[str, str]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOXER_", "OTEL_"))}
    env.update(env_extra)
    return subprocess.Popen(
        [OUTBOXER, "relay", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


async def relay_to_redis_and_read_headers(
    pg_url: str, pg_schema: str, topic: str, env_extra: dict[str, str], provider: TracerProvider
) -> tuple[ReadableSpan | None, dict[str, str], str, str]:
    """Enqueue one message inside a span, run a relay until Redis has it; return the request
    span, the headers Redis got, and the relay's stdout and stderr."""
    require_service("Redis", "127.0.0.1", 6379)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    outbox = outboxer.Outbox(schema=pg_schema)
    conn = await asyncpg.connect(pg_url)
    try:
        with provider.get_tracer("app").start_as_current_span("POST /api/orders"):
            async with conn.transaction():
                await outbox.enqueue_async(conn, topic, {"id": 1}, key="1")
    finally:
        await conn.close()
    [request] = exporter.get_finished_spans()
    args = ["--database-url", pg_url, "--schema", pg_schema, "--broker", "redis://127.0.0.1:6379"]
    proc = relay_process(args, env_extra)
    redis = aioredis.Redis()
    try:
        deadline = time.monotonic() + 30
        while not await redis.xlen(topic):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            await asyncio.sleep(0.05)
        [(_, fields)] = await redis.xrange(topic)
        headers = json.loads(fields[b"headers"])
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        await redis.delete(topic)
        await redis.aclose()
    assert proc.returncode == 0, err
    return request, headers, out, err


async def test_cli_relay_tracing_exports_the_publish_span_and_sends_its_context(
    pg_url: str,
    pg_schema: str,
    pg_store: PostgresStore,
    topic: str,
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, _ = spans
    request, headers, out, _ = await relay_to_redis_and_read_headers(
        pg_url,
        pg_schema,
        topic,
        {"OUTBOXER_TRACING": "1", "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "r1"},
        provider,
    )
    exported = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    [publish] = [s for s in exported if s["name"] == f"publish {topic}"]
    assert request is not None and request.context is not None
    assert publish["parent_id"] == f"0x{request.context.span_id:016x}"
    assert publish["context"]["trace_id"] == f"0x{request.context.trace_id:032x}"
    assert publish["kind"] == "SpanKind.PRODUCER"
    assert publish["attributes"]["messaging.system"] == "redis"
    assert publish["resource"]["attributes"]["service.name"] == "r1"
    span_id = publish["context"]["span_id"].removeprefix("0x")
    version, trace_id, parent_id, flags = headers["traceparent"].split("-")
    assert (version, trace_id, parent_id) == ("00", f"{request.context.trace_id:032x}", span_id)
    assert int(flags, 16) & 1, "sampled"


async def test_cli_relay_without_tracing_passes_the_stored_context_through(
    pg_url: str,
    pg_schema: str,
    pg_store: PostgresStore,
    topic: str,
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, _ = spans
    request, headers, out, _ = await relay_to_redis_and_read_headers(
        pg_url, pg_schema, topic, {"OTEL_TRACES_EXPORTER": "console"}, provider
    )
    assert out.strip() == ""  # no span exported: tracing is off
    assert request is not None
    assert headers == {"traceparent": traceparent(request)}  # the consumer continues the request


def test_cli_tracing_with_an_unknown_exporter_is_one_line(pg_url: str) -> None:
    proc = relay_process(
        ["--database-url", pg_url, "--broker", "redis://127.0.0.1:6379", "--tracing"],
        {"OTEL_TRACES_EXPORTER": "carrier-pigeon"},
    )
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "carrier-pigeon" in lines[0], err
