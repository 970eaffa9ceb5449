"""Prometheus metrics of a relay process: what it published, how fast, and whether it is well.

:class:`PrometheusRelayObserver` is a :class:`~outboxer.relay.RelayObserver`: the relay calls it
once per claim and once per publish call, and it turns those calls into counters, gauges and
histograms in its own :class:`~prometheus_client.CollectorRegistry` (never the process-global
one, so two relays or a test never share figures). :func:`serve_metrics` exposes that registry
on ``/metrics`` from a background thread (``outboxer relay --metrics-port``).

These are the figures only the relay process knows (publish totals, failures by outcome,
latency, outages). The backlog figures that live in the database (pending, in flight, dead
letters, oldest pending age) are served by ``outboxer serve`` at its own ``/metrics``
(:mod:`outboxer.admin.metrics`). Names and labels are listed in ``docs/observability.md``.

Cost: the relay calls the observer per batch, and the work per message is a dictionary
increment and, for acknowledged messages, one subtraction and a bucket search: the write → ack
latency histogram is filled a batch at a time under one lock (:class:`BatchHistogram`) instead
of one locked ``observe()`` per message.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from outboxer.message import Message
from outboxer.ports import RelayInfo
from outboxer.relay.observer import NoopObserver, PublishOutcome

__all__ = [
    "CALL_BUCKETS",
    "LATENCY_BUCKETS",
    "OTHER_TOPICS",
    "BatchHistogram",
    "MetricsServer",
    "PrometheusRelayObserver",
    "serve_metrics",
]

#: Write → ack latency buckets (seconds): milliseconds for a healthy relay, up to an hour for
#: a backlog drained after an outage or a replayed dead letter.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
#: Buckets of one broker call or one claim statement (seconds).
CALL_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
#: The ``topic`` label of every topic beyond ``max_topics`` (bounded label cardinality).
OTHER_TOPICS = "_other"

_FAILURES: tuple[PublishOutcome, ...] = ("retry", "dead_letter", "broker_unavailable")


class BatchHistogram(Collector):
    """A histogram filled many values at a time (one lock per batch, not per value).

    Exposed exactly like a ``prometheus_client.Histogram`` (``_bucket``, ``_sum``, ``_count``)
    with the given constant labels.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        labels: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(sorted(float(b) for b in buckets))
        self.labels = dict(labels or {})
        self._counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe_many(self, values: Iterable[float]) -> None:
        """Add every value (seconds); negative values count as 0."""
        bounds, counts = self.bounds, self._counts
        where = bisect.bisect_left
        with self._lock:
            total = self._sum
            for value in values:
                if value < 0:
                    value = 0.0
                counts[where(bounds, value)] += 1
                total += value
            self._sum = total

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), counts, strict=True):
            running += count
            cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
        family = HistogramMetricFamily(self.name, self.documentation, labels=list(self.labels))
        family.add_metric(list(self.labels.values()), cumulative, total)
        yield family


class PrometheusRelayObserver(NoopObserver):
    """Counts what a relay does into a Prometheus registry.

    Args:
        broker: The ``broker`` label: the broker URL's scheme (``kafka``, ``amqp``, …).
        registry: Where the metrics live; a fresh registry by default (see :attr:`registry`).
        max_topics: Distinct ``topic`` label values kept; messages of further topics are
            counted under ``topic="_other"`` so a topic per tenant cannot explode the series.
        clock: Wall-clock time in seconds (tests pass a fake one).
    """

    def __init__(
        self,
        broker: str,
        registry: CollectorRegistry | None = None,
        *,
        max_topics: int = 500,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.broker = broker
        self.registry = registry if registry is not None else CollectorRegistry()
        self.max_topics = max_topics
        self._clock = clock
        r = self.registry
        self.up = Gauge(
            "outboxer_relay_up",
            "1 while this relay runs its loop, 0 once it stopped.",
            ["relay_id"],
            registry=r,
        )
        self.started = Gauge(
            "outboxer_relay_start_timestamp_seconds",
            "When this relay started (Unix time).",
            ["relay_id"],
            registry=r,
        )
        self.last_heartbeat = Gauge(
            "outboxer_relay_last_heartbeat_timestamp_seconds",
            "When this relay last wrote its heartbeat to the database (Unix time).",
            registry=r,
        )
        self.heartbeat_failures = Counter(
            "outboxer_relay_heartbeat_failures",
            "Heartbeats that could not be written to the database.",
            registry=r,
        )
        self.claimed_messages = Counter(
            "outboxer_relay_claimed",
            "Messages claimed from the outbox.",
            registry=r,
        )
        self.claim_duration = Histogram(
            "outboxer_relay_claim_duration_seconds",
            "Duration of one claim statement (including empty claims).",
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self.in_flight_batches = Gauge(
            "outboxer_relay_in_flight_batches",
            "Batches being published right now (at most --window).",
            registry=r,
        )
        self.published_total = Counter(
            "outboxer_relay_published",
            "Messages the broker acknowledged.",
            ["topic", "broker"],
            registry=r,
        )
        self.failed_total = Counter(
            "outboxer_relay_publish_failures",
            "Failed publish attempts by outcome: retry (attempt counted, tried again later), "
            "dead_letter (failed for good), broker_unavailable (handed back, no attempt "
            "counted).",
            ["topic", "broker", "outcome"],
            registry=r,
        )
        self.publish_duration = Histogram(
            "outboxer_relay_publish_duration_seconds",
            "Duration of one publish call to the broker (a batch, or in ordered mode one wave of "
            "it for a publisher that does not keep key order).",
            ["broker"],
            buckets=CALL_BUCKETS,
            registry=r,
        ).labels(broker)
        self.latency = BatchHistogram(
            "outboxer_relay_publish_latency_seconds",
            "Write → ack latency of each acknowledged message: broker acknowledgement time "
            "minus the message's created_at (the database's time of the writing transaction).",
            LATENCY_BUCKETS,
            {"broker": broker},
        )
        r.register(self.latency)
        self.lag = Gauge(
            "outboxer_end_to_end_lag_seconds",
            "Largest write → ack latency in the last publish call that acknowledged messages.",
            registry=r,
        )
        self.last_ack = Gauge(
            "outboxer_relay_last_ack_timestamp_seconds",
            "When the broker last acknowledged a message of this relay (Unix time).",
            registry=r,
        )
        self.outage_state = Gauge(
            "outboxer_relay_broker_outage",
            "1 while the broker is unavailable and the relay pauses claiming, else 0.",
            registry=r,
        )
        self.outage_rounds = Gauge(
            "outboxer_relay_broker_outage_rounds",
            "Consecutive broker-unavailable rounds (0 when healthy).",
            registry=r,
        )
        self.outage_pause = Gauge(
            "outboxer_relay_broker_outage_pause_seconds",
            "The current outage pause (0 when healthy).",
            registry=r,
        )
        self.outages_total = Counter(
            "outboxer_relay_broker_outages",
            "Broker-unavailable rounds since the relay started (each one paused claiming).",
            registry=r,
        )
        self.store_errors = Counter(
            "outboxer_relay_store_errors",
            "Failed store operations (claim, settle, heartbeat, sweep).",
            ["operation"],
            registry=r,
        )
        # Children resolved once per (topic, outcome): ``labels()`` costs a lock and a lookup.
        self._children: dict[tuple[str, str], Any] = {}
        self._topics: set[str] = set()
        self._relay_id: str | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def relay_started(self, info: RelayInfo) -> None:
        self._relay_id = info.relay_id
        self.up.labels(info.relay_id).set(1)
        self.started.labels(info.relay_id).set(info.started_at.timestamp())

    def relay_stopped(self, info: RelayInfo) -> None:
        self.up.labels(info.relay_id).set(0)
        self.in_flight_batches.set(0)

    def heartbeat(self, ok: bool) -> None:
        if ok:
            self.last_heartbeat.set(self._clock())
        else:
            self.heartbeat_failures.inc()
            self.store_errors.labels("heartbeat").inc()

    def store_unavailable(self, operation: str) -> None:
        self.store_errors.labels(operation).inc()

    # -- work -------------------------------------------------------------------------------

    def claimed(self, count: int, seconds: float) -> None:
        self.claim_duration.observe(seconds)
        if count:
            self.claimed_messages.inc(count)

    def in_flight(self, batches: int) -> None:
        self.in_flight_batches.set(batches)

    def published(
        self, messages: Sequence[Message], outcomes: Sequence[PublishOutcome], seconds: float
    ) -> None:
        if not messages:
            return
        self.publish_duration.observe(seconds)
        now = self._clock()
        counts: dict[tuple[str, str], int] = {}
        latencies: list[float] = []
        for message, outcome in zip(messages, outcomes, strict=True):
            group: tuple[str, str] = (message.topic, outcome)
            counts[group] = counts.get(group, 0) + 1
            if outcome == "published":
                latencies.append(now - message.created_at.timestamp())
        for group, n in counts.items():
            self._child(*group).inc(n)
        if latencies:
            self.latency.observe_many(latencies)
            self.lag.set(max(0.0, max(latencies)))
            self.last_ack.set(now)

    def outage(self, failures: int, pause: float) -> None:
        self.outage_state.set(1 if failures else 0)
        self.outage_rounds.set(failures)
        self.outage_pause.set(pause)
        if failures:
            self.outages_total.inc()

    def _child(self, topic: str, outcome: str) -> Any:
        child = self._children.get((topic, outcome))
        if child is None:
            if topic not in self._topics:
                if len(self._topics) < self.max_topics:
                    self._topics.add(topic)
                else:
                    # Not remembered by its own name: a relay meeting a new topic per tenant
                    # for weeks would otherwise keep one entry per topic ever seen (a probe).
                    topic = OTHER_TOPICS
                    child = self._children.get((topic, outcome))
                    if child is not None:
                        return child
            if outcome == "published":
                child = self.published_total.labels(topic, self.broker)
            else:
                child = self.failed_total.labels(topic, self.broker, outcome)
            self._children[(topic, outcome)] = child
        return child

    def __repr__(self) -> str:
        return f"PrometheusRelayObserver(broker={self.broker!r})"


class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`close` stops it."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        """The port it listens on (useful with port 0)."""
        return int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(
    registry: CollectorRegistry, host: str, port: int, *, process_metrics: bool = True
) -> MetricsServer:
    """Serve ``registry`` in Prometheus text format on ``http://host:port/metrics`` from a
    daemon thread (scrapes never run on the relay's event loop).

    ``process_metrics`` adds the standard ``process_*``, ``python_gc_*`` and ``python_info``
    series. Raises ``OSError`` when the port cannot be bound.
    """
    if process_metrics:
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            registry.register(collector)
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(server, thread)
