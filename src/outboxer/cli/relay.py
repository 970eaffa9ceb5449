"""``outboxer relay``: publish the outbox to a broker until stopped."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any

import click

from outboxer.cli._common import fail, open_store, stop_on_signals
from outboxer.cli.options import (
    app_dir_option,
    build_settings,
    checked,
    database_options,
    env_option,
    host_option,
    port_option,
    settings_options,
)
from outboxer.config import RelaySettings, Setting, TableNames
from outboxer.errors import StoreUnavailable


@click.command()
@database_options
@env_option(
    "--broker",
    required=True,
    help="kafka://…, amqp://…, nats://…, redis://…, http(s)://… or inprocess://module:registry",
)
@settings_options(RelaySettings)
@env_option("--webhook-secret", default=None, help="HMAC-SHA256 key of http(s):// webhooks.")
@port_option("--metrics-port", 0, "Serve Prometheus /metrics of this relay on this port (0: off).")
@host_option("--metrics-host", "Interface of the /metrics server")
@env_option(
    "--drain",
    is_flag=True,
    help="Publish until nothing is left to publish now, then exit 0 (jobs, tests, migrations); "
    "messages scheduled for later stay. Exit 1 after --drain-timeout.",
)
@env_option(
    "--drain-timeout",
    default=300.0,
    show_default=True,
    type=click.FLOAT,
    # not FloatRange: it lets nan through (see consume's --shutdown-timeout)
    callback=checked(Setting("", minimum=0, maximum=86400, above_minimum=True)),
    help="With --drain: seconds before giving up (broker down, retries not done) with exit 1.",
)
@env_option(
    "--tracing",
    is_flag=True,
    help="OpenTelemetry publish spans continuing the trace stored at enqueue (exporter from "
    "OTEL_* variables). On by itself under opentelemetry-instrument.",
)
@app_dir_option
def relay(
    database_url: str,
    schema: str | None,
    table: str,
    broker: str,
    webhook_secret: str | None,
    metrics_port: int,
    metrics_host: str,
    tracing: bool,
    drain: bool,
    drain_timeout: float,
    **values: Any,
) -> None:
    """Publish outbox messages to the broker until SIGTERM/SIGINT (graceful: nothing lost),
    or with --drain until nothing is left to publish now."""
    settings = build_settings(RelaySettings, values)
    names = TableNames(table=table, schema=schema)
    observer, metrics_server = _relay_metrics(broker, metrics_host, metrics_port)
    stop_tracing = _relay_tracing(tracing)
    try:
        asyncio.run(
            _relay(
                database_url,
                names,
                broker,
                settings,
                webhook_secret,
                observer=observer,
                traced=stop_tracing is not None,
                drain_timeout=drain_timeout if drain else None,
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
    return configure_tracing()


#: How long a relay may take to stop beyond ``--shutdown-timeout`` before it exits by force
#: (an ``inprocess://`` handler that swallows its cancellation would keep it alive for good).
RELAY_STOP_GRACE = 60.0


async def _relay(
    url: str,
    names: TableNames,
    broker: str,
    settings: RelaySettings,
    secret: str | None,
    *,
    observer: Any = None,
    traced: bool = False,
    drain_timeout: float | None = None,
) -> None:
    from outboxer.brokers import publisher_from_url
    from outboxer.relay import Relay

    publisher = publisher_from_url(broker, webhook_secret=secret)
    if traced:
        from outboxer.observability.tracing import TracingPublisher, messaging_system

        publisher = TracingPublisher(publisher, system=messaging_system(broker))
    async with open_store(url, names) as store, publisher:
        relay = Relay(store, publisher, settings, observer=observer)
        # Past its shutdown timeout a stopping relay still hands back what it holds and
        # unregisters (statements bounded by the URL's command_timeout, 60 s by default).
        deadline = settings.shutdown_timeout + RELAY_STOP_GRACE
        stop_on_signals(relay.stop, deadline, "the relay")
        if drain_timeout is None:
            await relay.run()
            return
        await _drain(relay, store, drain_timeout)


async def _drain(relay: Any, store: Any, timeout: float) -> None:
    """``--drain``: one summary line on stdout and exit 0 when done; one line and exit 1 when
    the timeout (or a signal) ended it first, saying what is left and the last broker error."""
    try:
        counters = await relay.drain(timeout)
    except TimeoutError:
        counters = None
    try:
        stats = await store.stats()
    except StoreUnavailable as exc:
        if counters is not None:
            raise
        # The database went away during the drain (the usual reason it timed out): say that
        # the drain did not finish, not only the driver's error.
        fail(f"drain did not finish within {timeout:g} s; what is left is unknown: {exc}")
    later = stats.left_for_later(ordered=relay.settings.ordered)
    left = stats.pending - later + stats.in_flight
    if counters is None or left:
        why = f"did not finish within {timeout:g} s" if counters is None else "was stopped"
        outage = f"; broker unavailable for {relay.outage_failures} rounds: {relay.outage_reason}"
        fail(
            f"drain {why}: {left} messages still to publish"
            + (outage if relay.outage_failures else "")
        )
    click.echo(
        f"drained: {counters.published} published, {counters.dead_lettered} dead-lettered, "
        f"{later} scheduled for later"
    )
