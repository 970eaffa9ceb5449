"""``outboxer relay``: publish the outbox to a broker until stopped."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

import click

from outboxer.cli._common import EXIT_USAGE, fail, open_store, run_async, table_names
from outboxer.cli.options import database_options, env_option
from outboxer.config import Backoff, RelaySettings, TableNames
from outboxer.errors import ConfigurationError


@click.command()
@database_options
@env_option(
    "--broker",
    required=True,
    help="kafka://…, amqp://…, nats://…, redis://…, http(s)://… or inprocess://module:registry",
)
@env_option(
    "--unordered",
    is_flag=True,
    help="Give up per-key ordering for throughput.",
)
@env_option(
    "--batch-size",
    default=500,
    show_default=True,
    type=click.IntRange(1, 10_000),
)
@env_option(
    "--window",
    default=4,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Batches published at once (duplicates after a crash ≤ window × batch size).",
)
@env_option(
    "--max-attempts",
    default=3,
    show_default=True,
    type=click.IntRange(1, 1000),
)
@env_option(
    "--lease-seconds",
    default=30.0,
    show_default=True,
    type=click.FloatRange(1, 3600),
)
@env_option(
    "--retry-base",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.001, 3600),
    help="First per-message retry delay (s); doubles per attempt.",
)
@env_option(
    "--retry-cap",
    default=300.0,
    show_default=True,
    type=click.FloatRange(0.001, 86400),
)
@env_option(
    "--outage-base",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0.001, 3600),
    help="First pause (s) when the broker is down; doubles per failed round.",
)
@env_option(
    "--outage-cap",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0.001, 3600),
)
@env_option(
    "--poll-interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.01, 60),
    help="Longest idle wait between claims without a notification (s).",
)
@env_option(
    "--shutdown-timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0, 3600),
)
@env_option(
    "--relay-id",
    default=None,
    help="Instance name (default host:pid:random).",
)
@env_option(
    "--sweep-interval",
    default=60.0,
    show_default=True,
    type=click.FloatRange(1, 86400),
    help="How often one relay of all runs the sweep (s).",
)
@env_option(
    "--dead-letter-retention",
    default=30 * 86400.0,
    show_default=True,
    type=click.FloatRange(0, None),
    help="Seconds dead letters are kept before the sweeper purges them; 0 keeps them.",
)
@env_option(
    "--hold-keys-after-dead-letter",
    is_flag=True,
    help="Ordered mode: keep a key's later messages back while its dead letter is unresolved.",
)
@env_option(
    "--webhook-secret",
    default=None,
    help="HMAC-SHA256 key signing http(s):// webhook requests.",
)
@env_option(
    "--metrics-port",
    default=0,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Serve Prometheus /metrics of this relay on this port (0: off).",
)
@env_option(
    "--metrics-host",
    default="0.0.0.0",
    show_default=True,
    help="Interface of the /metrics server.",
)
@env_option(
    "--tracing",
    is_flag=True,
    help="OpenTelemetry publish spans continuing the trace stored at enqueue (exporter from "
    "OTEL_* variables). On by itself under opentelemetry-instrument.",
)
def relay(
    database_url: str,
    schema: str | None,
    table: str,
    broker: str,
    unordered: bool,
    batch_size: int,
    window: int,
    max_attempts: int,
    lease_seconds: float,
    retry_base: float,
    retry_cap: float,
    outage_base: float,
    outage_cap: float,
    poll_interval: float,
    shutdown_timeout: float,
    relay_id: str | None,
    sweep_interval: float,
    dead_letter_retention: float,
    hold_keys_after_dead_letter: bool,
    webhook_secret: str | None,
    metrics_port: int,
    metrics_host: str,
    tracing: bool,
) -> None:
    """Publish outbox messages to the broker until SIGTERM/SIGINT (graceful: nothing lost)."""
    try:
        settings = RelaySettings(
            batch_size=batch_size,
            max_in_flight_batches=window,
            ordered=not unordered,
            max_attempts=max_attempts,
            lease_seconds=lease_seconds,
            retry=Backoff(base=retry_base, cap=max(retry_cap, retry_base)),
            outage=Backoff(base=outage_base, cap=max(outage_cap, outage_base)),
            poll_interval=poll_interval,
            min_poll_interval=min(0.05, poll_interval),
            heartbeat_interval=min(5.0, lease_seconds / 3),
            shutdown_timeout=shutdown_timeout,
            relay_id=relay_id,
            sweep_interval=sweep_interval,
            dead_letter_retention=dead_letter_retention,
            hold_keys_after_dead_letter=hold_keys_after_dead_letter,
        )
    except ConfigurationError as exc:
        fail(str(exc), EXIT_USAGE)
    names = table_names(schema, table)
    observer, metrics_server = _relay_metrics(broker, metrics_host, metrics_port)
    stop_tracing = _relay_tracing(tracing)
    try:
        run_async(
            _relay(
                database_url,
                names,
                broker,
                settings,
                webhook_secret,
                observer=observer,
                traced=stop_tracing is not None,
            )
        )
    finally:
        if metrics_server is not None:
            metrics_server.close()
        if stop_tracing is not None:
            stop_tracing()  # flushes the spans still buffered


def _relay_metrics(broker: str, host: str, port: int) -> tuple[Any, Any]:
    """The Prometheus observer and its running /metrics server, or ``(None, None)`` when off.

    The port is bound before the database is contacted: a taken port is one line at once.
    """
    if not port:
        return None, None
    try:
        from outboxer.observability.metrics import PrometheusRelayObserver, serve_metrics
    except ImportError as exc:
        fail(f"--metrics-port needs prometheus-client: pip install 'outboxer[metrics]' ({exc})")
    # The label is the URL's scheme only: the rest of a broker URL may hold a password.
    observer = PrometheusRelayObserver(broker.partition("://")[0].lower() or "unknown")
    try:
        server = serve_metrics(observer.registry, host, port)
    except OSError as exc:
        fail(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}")
    logging.getLogger("outboxer.relay").info(
        "relay metrics on http://%s:%d/metrics", host, server.port
    )
    return observer, server


def _relay_tracing(requested: bool) -> Callable[[], None] | None:
    """Turn publish spans on when asked, or when an OpenTelemetry SDK is already configured
    in this process (``opentelemetry-instrument``); returns the tracing shutdown, or ``None``
    when tracing is off (then OpenTelemetry is not even imported)."""
    if not requested and "opentelemetry.trace" not in sys.modules:
        return None
    try:
        from outboxer.observability.tracing import configure_tracing, sdk_configured
    except ImportError as exc:
        fail(f"--tracing needs OpenTelemetry: pip install 'outboxer[tracing]' ({exc})")
    if not requested and not sdk_configured():
        return None
    try:
        return configure_tracing()
    except ConfigurationError as exc:
        fail(str(exc), EXIT_USAGE)


async def _relay(
    url: str,
    names: TableNames,
    broker: str,
    settings: RelaySettings,
    secret: str | None,
    *,
    observer: Any = None,
    traced: bool = False,
) -> None:
    from outboxer.brokers import publisher_from_url
    from outboxer.relay import Relay

    publisher = publisher_from_url(broker, webhook_secret=secret)
    if traced:
        from outboxer.observability.tracing import TracingPublisher, messaging_system

        publisher = TracingPublisher(publisher, system=messaging_system(broker))
    async with open_store(url, names) as store, publisher:
        relay = Relay(store, publisher, settings, observer=observer)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, relay.stop)
        await relay.run()
