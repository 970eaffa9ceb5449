"""Prometheus exposition of the outbox figures, computed from ``store.stats()`` at scrape time.

Why a collector over one snapshot rather than module-level ``Gauge`` objects: the figures live
in the database, not in this process. Global gauges would be mutable state shared by every app
in the process (two admin apps, tests) and would show stale values between scrapes. Here each
scrape reads the store once and renders a fresh registry holding a single
:class:`OutboxStatsCollector`, so what Prometheus sees is exactly what the database said.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from outboxer.ports import OutboxStats

__all__ = ["CONTENT_TYPE", "OutboxStatsCollector", "render_metrics"]

# The text format 0.0.4 that every Prometheus server accepts.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_NAME = re.compile(r"[^a-z0-9_]")


class OutboxStatsCollector(Collector):
    """Gauges for one stats snapshot; ``stats=None`` means the database could not be read.

    Metrics:
        outboxer_database_up: 1 when the stats query succeeded, else 0 (and nothing else).
        outboxer_pending_messages: messages waiting in the outbox (not leased).
        outboxer_in_flight_messages: messages leased by a relay right now.
        outboxer_dead_letters: rows in the dead-letter table.
        outboxer_oldest_pending_age_seconds: age of the oldest outbox row (0 when empty).
        outboxer_live_relays: relays with a recent heartbeat.
        outboxer_relay_in_flight_messages{relay_id}: messages each live relay holds.
        outboxer_relay_heartbeat_timestamp_seconds{relay_id}: its last heartbeat (Unix time).
        outboxer_unowned_in_flight_messages: leased by a relay that stopped (when reported).
        outboxer_consume_failures{consumer,state}: failed consumptions still to re-drive,
            ``state`` ``retrying`` or ``waiting`` (only consumers with failures have series).
        outboxer_consume_failures_oldest_age_seconds{consumer}: age of each one's oldest.
        outboxer_last_sweep_*: the last sweep's counts and ``*_timestamp_seconds`` (when one
            has run), e.g. ``outboxer_last_sweep_completed_timestamp_seconds``.
    """

    def __init__(self, stats: OutboxStats | None) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "outboxer_database_up", "1 when the outbox database answered the stats query."
        )
        up.add_metric([], 0.0 if self._stats is None else 1.0)
        yield up
        stats = self._stats
        if stats is None:
            return
        for name, doc, value in (
            ("outboxer_pending_messages", "Messages waiting in the outbox.", stats.pending),
            ("outboxer_in_flight_messages", "Messages leased by a relay.", stats.in_flight),
            ("outboxer_dead_letters", "Messages in the dead-letter table.", stats.dead_letters),
            (
                "outboxer_oldest_pending_age_seconds",
                "Age of the oldest message in the outbox (0 when it is empty).",
                stats.oldest_pending_age_seconds or 0.0,
            ),
            ("outboxer_live_relays", "Relays with a recent heartbeat.", len(stats.relays)),
        ):
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], float(value))
            yield gauge
        in_flight = GaugeMetricFamily(
            "outboxer_relay_in_flight_messages",
            "Messages each live relay holds.",
            labels=["relay_id"],
        )
        heartbeat = GaugeMetricFamily(
            "outboxer_relay_heartbeat_timestamp_seconds",
            "Last heartbeat of each live relay (Unix time).",
            labels=["relay_id"],
        )
        for relay in stats.relays:
            in_flight.add_metric([relay.relay_id], float(relay.in_flight))
            heartbeat.add_metric([relay.relay_id], relay.heartbeat_at.timestamp())
        yield in_flight
        yield heartbeat
        yield from _optional_figures(stats.to_json())


def _optional_figures(figures: Mapping[str, Any]) -> Iterator[Metric]:
    """Figures not every store reports: read from the JSON shape, so a store that adds them
    (``unowned_in_flight``, the last sweep's report) shows up without a change here."""
    unowned = figures.get("unowned_in_flight")
    if isinstance(unowned, int | float) and not isinstance(unowned, bool):
        gauge = GaugeMetricFamily(
            "outboxer_unowned_in_flight_messages",
            "Messages leased by a relay whose heartbeat stopped (taken back when the lease ends).",
        )
        gauge.add_metric([], float(unowned))
        yield gauge
    failing = figures.get("consume_failures")
    if isinstance(failing, Mapping):
        yield from _consume_failures(failing)
    sweep = figures.get("last_sweep")
    if not isinstance(sweep, Mapping):
        return
    for name, value in sorted(sweep.items()):
        metric = _NAME.sub("_", str(name).lower())
        if _is_number(value):
            gauge = GaugeMetricFamily(
                f"outboxer_last_sweep_{metric}", f"The last sweep's {name.replace('_', ' ')}."
            )
            gauge.add_metric([], float(value))
            yield gauge
        elif isinstance(value, str) and metric.endswith("_at"):
            try:
                moment = dt.datetime.fromisoformat(value)
            except ValueError:
                continue
            gauge = GaugeMetricFamily(
                f"outboxer_last_sweep_{metric[:-3]}_timestamp_seconds",
                f"The last sweep's {name} (Unix time).",
            )
            gauge.add_metric([], moment.timestamp())
            yield gauge


def _consume_failures(failing: Mapping[str, Any]) -> Iterator[Metric]:
    """The inbox's failures by consumer. A consumer that has none has no series (not a 0): the
    set of consumers is not known here, only those the failures table names."""
    counts = GaugeMetricFamily(
        "outboxer_consume_failures",
        "Failed consumptions still to re-drive, by consumer and state (retrying, waiting).",
        labels=["consumer", "state"],
    )
    oldest = GaugeMetricFamily(
        "outboxer_consume_failures_oldest_age_seconds",
        "Age of each consumer's oldest failed consumption still to re-drive.",
        labels=["consumer"],
    )
    for consumer, figures in sorted(failing.items()):
        if not isinstance(figures, Mapping):
            continue
        for state in ("retrying", "waiting"):
            if _is_number(figures.get(state)):
                counts.add_metric([str(consumer), state], float(figures[state]))
        if _is_number(figures.get("oldest_age_seconds")):
            oldest.add_metric([str(consumer)], float(figures["oldest_age_seconds"]))
    yield counts
    yield oldest


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def render_metrics(stats: OutboxStats | None) -> bytes:
    """The Prometheus text exposition of one snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OutboxStatsCollector(stats))
    return generate_latest(registry)
