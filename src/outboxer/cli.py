"""The ``outboxer`` command.

This is the composition point: it reads options and ``OUTBOXER_*`` environment variables, builds
the store and publisher from their URLs and hands them to the relay. Every failure the user can
cause ends in one readable line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from outboxer.config import Backoff, RelaySettings, TableNames
from outboxer.errors import ConfigurationError, NotFound, OutboxerError
from outboxer.ports import DeadLetter, DeadLetterFilter, Store

if TYPE_CHECKING:
    from outboxer.inbox import HandlerRegistry, InboxSettings
    from outboxer.stores.sqlite import SqliteStore

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

EXIT_USAGE = 2
EXIT_FAILURE = 1


def env_option(*declarations: str, **attributes: Any) -> Callable[[F], F]:
    """``click.option`` that also reads ``OUTBOXER_<NAME>`` and shows it in ``--help``."""
    name = declarations[0].lstrip("-").replace("-", "_").upper()
    attributes.setdefault("envvar", f"OUTBOXER_{name}")
    attributes.setdefault("show_envvar", True)
    decorator: Callable[[F], F] = click.option(*declarations, **attributes)
    return decorator


def _fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    click.echo(f"outboxer: error: {message}", err=True)
    sys.exit(code)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine, turning outboxer errors into one line and an exit code."""
    try:
        return asyncio.run(coro)
    except ConfigurationError as exc:
        _fail(str(exc), EXIT_USAGE)
    except NotFound as exc:
        _fail(str(exc))
    except OutboxerError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        _fail("interrupted", 130)


def _names(schema: str | None, table: str) -> TableNames:
    try:
        return TableNames(table=table, schema=schema)
    except ConfigurationError as exc:
        _fail(str(exc), EXIT_USAGE)


def database_options(function: F) -> F:
    """``--database-url``, ``--schema``, ``--table``, shared by every command that needs a DB."""
    options = [
        env_option(
            "--database-url",
            required=True,
            help="postgresql://user@host/db or sqlite:///path.db",
        ),
        env_option(
            "--schema",
            default=None,
            help="Schema of the outbox tables (PostgreSQL). Default: the connection's.",
        ),
        env_option(
            "--table",
            default="outbox",
            show_default=True,
            help="Outbox table name; the other tables are named after it.",
        ),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def json_option(function: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(function)


@contextlib.asynccontextmanager
async def _open_store(url: str, names: TableNames, *, check: bool = True) -> Any:
    from outboxer.stores import store_from_url

    store = store_from_url(url, names)
    async with store:
        if check:
            await store.check_schema()
        yield store


def _with_store(action: Callable[[Store], Awaitable[T]], url: str, names: TableNames) -> T:
    async def main() -> T:
        async with _open_store(url, names) as store:
            return await action(store)

    return _run(main())


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="outboxer")
@env_option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@env_option(
    "--log-format",
    default="text",
    show_default=True,
    type=click.Choice(["text", "json"], case_sensitive=False),
    help="json: one JSON object per line (time, level, logger, message, extra fields).",
)
def main(log_level: str, log_format: str) -> None:
    """outboxer: a transactional outbox. Every option can also be set by the OUTBOXER_*
    environment variable shown beside it."""
    from outboxer.observability.logging import configure_logging

    # Both formats redact passwords in URLs and tokens (docs/observability.md).
    configure_logging(log_level, log_format.lower())
    # pika logs several ERROR lines per failed connection attempt; the RabbitMQ publisher
    # reports each outage in one line of its own.
    logging.getLogger("pika").setLevel(logging.CRITICAL)


# -- db ----------------------------------------------------------------------------------------


@main.group()
def db() -> None:
    """Schema management."""


@db.command("upgrade")
@database_options
def db_upgrade(database_url: str, schema: str | None, table: str) -> None:
    """Create or migrate the outbox schema (idempotent)."""
    names = _names(schema, table)

    async def upgrade() -> list[int]:
        async with _open_store(database_url, names, check=False) as store:
            applied: list[int] = await store.migrate()
            return applied

    applied = _run(upgrade())
    if applied:
        click.echo(f"outbox schema upgraded to version {applied[-1]} (applied {applied})")
    else:
        click.echo("outbox schema is up to date")


# -- relay -------------------------------------------------------------------------------------


@main.command()
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
        _fail(str(exc), EXIT_USAGE)
    names = _names(schema, table)
    observer, metrics_server = _relay_metrics(broker, metrics_host, metrics_port)
    stop_tracing = _relay_tracing(tracing)
    try:
        _run(
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
        _fail(f"--metrics-port needs prometheus-client: pip install 'outboxer[metrics]' ({exc})")
    # The label is the URL's scheme only: the rest of a broker URL may hold a password.
    observer = PrometheusRelayObserver(broker.partition("://")[0].lower() or "unknown")
    try:
        server = serve_metrics(observer.registry, host, port)
    except OSError as exc:
        _fail(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}")
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
        _fail(f"--tracing needs OpenTelemetry: pip install 'outboxer[tracing]' ({exc})")
    if not requested and not sdk_configured():
        return None
    try:
        return configure_tracing()
    except ConfigurationError as exc:
        _fail(str(exc), EXIT_USAGE)


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
    from outboxer.publishers import publisher_from_url
    from outboxer.relay import Relay

    publisher = publisher_from_url(broker, webhook_secret=secret)
    if traced:
        from outboxer.observability.tracing import TracingPublisher, messaging_system

        publisher = TracingPublisher(publisher, system=messaging_system(broker))
    async with _open_store(url, names) as store, publisher:
        relay = Relay(store, publisher, settings, observer=observer)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, relay.stop)
        await relay.run()


# -- stats -------------------------------------------------------------------------------------


@main.command()
@database_options
@json_option
def stats(database_url: str, schema: str | None, table: str, as_json: bool) -> None:
    """Pending, in flight, dead letters, oldest pending age, live relays."""

    async def read(store: Store) -> dict[str, Any]:
        result: dict[str, Any] = (await store.stats()).to_json()
        return result

    figures = _with_store(read, database_url, _names(schema, table))
    if as_json:
        click.echo(json.dumps(figures, indent=2))
        return
    age = figures["oldest_pending_age_seconds"]
    click.echo(f"pending             {figures['pending']}")
    click.echo(f"in flight           {figures['in_flight']}")
    click.echo(f"dead letters        {figures['dead_letters']}")
    click.echo(f"oldest pending age  {'-' if age is None else f'{age:.1f}s'}")
    click.echo(f"live relays         {len(figures['relays'])}")
    for r in figures["relays"]:
        click.echo(f"  {r['relay_id']}  in flight {r['in_flight']}  heartbeat {r['heartbeat_at']}")
    sweep = figures["last_sweep"]
    click.echo(f"last sweep          {'-' if sweep is None else json.dumps(sweep)}")


# -- dlq ---------------------------------------------------------------------------------------


@main.group()
def dlq() -> None:
    """Inspect, replay and purge dead letters."""


def filter_options(function: F) -> F:
    for option in reversed(
        [
            click.option("--topic", default=None, help="Only this topic."),
            click.option("--type", "type_", default=None, help="Only this message type."),
            click.option("--key", default=None, help="Only this key."),
        ]
    ):
        function = option(function)
    return function


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _print_dead_letters(items: list[DeadLetter]) -> None:
    header = f"{'ID':36}  {'TOPIC':16} {'TYPE':18} {'KEY':12} {'ATT':>3}  REASON"
    click.echo(header)
    for d in items:
        click.echo(
            f"{d.id:36}  {_short(d.topic, 16):16} {_short(d.type or '-', 18):18} "
            f"{_short(d.key or '-', 12):12} {d.attempts:>3}  {_short(d.failure_reason, 60)}"
        )


@dlq.command("list")
@database_options
@filter_options
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@click.option("--cursor", default=None, help="next_cursor of the previous page.")
@json_option
def dlq_list(
    database_url: str,
    schema: str | None,
    table: str,
    topic: str | None,
    type_: str | None,
    key: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """List dead letters, newest first."""
    flt = DeadLetterFilter(topic=topic, type=type_, key=key)

    async def read(store: Store) -> Any:
        return await store.list_dead_letters(flt, limit=limit, cursor=cursor)

    page = _with_store(read, database_url, _names(schema, table))
    if as_json:
        body = {"items": [d.to_json() for d in page.items], "next_cursor": page.next_cursor}
        click.echo(json.dumps(body, indent=2))
        return
    _print_dead_letters(list(page.items))
    if page.next_cursor:
        click.echo(f"more: --cursor {page.next_cursor}")


@dlq.command("show")
@database_options
@click.argument("dead_letter_id")
@json_option
def dlq_show(
    database_url: str, schema: str | None, table: str, dead_letter_id: str, as_json: bool
) -> None:
    """One dead letter with payload, reason and attempts."""

    async def read(store: Store) -> DeadLetter:
        return await store.get_dead_letter(dead_letter_id)

    body = _with_store(read, database_url, _names(schema, table)).to_json()
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    for name, value in body.items():
        shown = json.dumps(value) if isinstance(value, dict | list) else value
        click.echo(f"{name:17} {shown}")


def _bulk_filter(
    ids: tuple[str, ...], all_: bool, topic: str | None, type_: str | None, key: str | None
) -> DeadLetterFilter:
    chosen = bool(ids) + all_ + any(v is not None for v in (topic, type_, key))
    if chosen != 1:
        _fail("give dead-letter IDs, or --all, or a filter (--topic/--type/--key)", EXIT_USAGE)
    return DeadLetterFilter(topic=topic, type=type_, key=key, ids=list(ids) if ids else None)


def _bulk(
    verb: str,
    action: Callable[[Store, DeadLetterFilter], Awaitable[list[str]]],
    database_url: str,
    names: TableNames,
    flt: DeadLetterFilter,
    as_json: bool,
) -> None:
    progress = not as_json and sys.stderr.isatty()

    async def run(store: Store) -> list[str]:
        if progress:
            return await _bulk_in_chunks(store, verb, action, flt)
        return await action(store, flt)

    done = _with_store(run, database_url, names)
    missing = sorted(set(flt.ids or ()) - set(done))
    if as_json:
        click.echo(json.dumps({verb: done, "count": len(done), "not_found": missing}, indent=2))
    else:
        click.echo(f"{verb} {len(done)} dead letter(s)")
        for i in done:
            click.echo(f"  {i}")
    if missing:
        _fail(f"no dead letter with id {', '.join(missing)}")


#: Dead letters per statement when bulk replay/purge shows a progress bar.
BULK_CHUNK = 500


async def _bulk_in_chunks(
    store: Store,
    verb: str,
    action: Callable[[Store, DeadLetterFilter], Awaitable[list[str]]],
    flt: DeadLetterFilter,
) -> list[str]:
    """Bulk replay/purge with a progress bar on stderr (a terminal, no ``--json``).

    The store acts on a filter in one statement, which cannot report progress; so the matching
    ids are listed first and acted on in chunks of :data:`BULK_CHUNK`, each chunk in one
    statement (all or nothing). Dead letters added after the listing are left for the next
    run. If a chunk fails, the error says how many were done before it; running the command
    again finishes the rest (replayed/purged ones no longer match).
    """
    if flt.ids is not None:
        ids = list(dict.fromkeys(flt.ids))
    else:
        ids, cursor = [], None
        while True:
            page = await store.list_dead_letters(flt, limit=1000, cursor=cursor)
            ids.extend(d.id for d in page.items)
            cursor = page.next_cursor
            if cursor is None:
                break
    label = {"replayed": "replaying", "purged": "purging"}.get(verb, verb)
    done: list[str] = []
    with click.progressbar(
        length=len(ids), label=label, file=sys.stderr, show_pos=True, show_percent=True
    ) as bar:
        for start in range(0, len(ids), BULK_CHUNK):
            chunk = ids[start : start + BULK_CHUNK]
            try:
                done.extend(await action(store, DeadLetterFilter(ids=chunk)))
            except OutboxerError as exc:
                raise OutboxerError(
                    f"{exc} ({verb} {len(done)} of {len(ids)} before this failure; run the "
                    "command again to finish)"
                ) from exc
            bar.update(len(chunk))
    return done


@dlq.command("replay")
@database_options
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every dead letter.")
@filter_options
@json_option
def dlq_replay(
    database_url: str,
    schema: str | None,
    table: str,
    ids: tuple[str, ...],
    all_: bool,
    topic: str | None,
    type_: str | None,
    key: str | None,
    as_json: bool,
) -> None:
    """Move dead letters back to the outbox (same id, attempts reset)."""
    flt = _bulk_filter(ids, all_, topic, type_, key)
    names = _names(schema, table)
    _bulk("replayed", lambda s, f: s.replay_dead_letters(f), database_url, names, flt, as_json)


@dlq.command("purge")
@database_options
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every dead letter.")
@filter_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def dlq_purge(
    database_url: str,
    schema: str | None,
    table: str,
    ids: tuple[str, ...],
    all_: bool,
    topic: str | None,
    type_: str | None,
    key: str | None,
    yes: bool,
    as_json: bool,
) -> None:
    """Delete dead letters for good."""
    flt = _bulk_filter(ids, all_, topic, type_, key)
    if not yes and not click.confirm("Delete the matching dead letters for good?", err=True):
        _fail("nothing deleted")
    names = _names(schema, table)
    _bulk("purged", lambda s, f: s.purge_dead_letters(f), database_url, names, flt, as_json)


# -- demo --------------------------------------------------------------------------------------


@main.command()
@click.option(
    "--database",
    "database",
    default=None,
    type=click.Path(dir_okay=False),
    help="SQLite file to use (default: a fresh temporary file).",
)
def demo(database: str | None) -> None:
    """The order pipeline and welcome e-mails on SQLite with in-process handlers."""
    from outboxer import demo as demo_module

    logging.getLogger("outboxer").setLevel(logging.ERROR)  # the demo narrates itself
    _run(demo_module.run(database))


# -- consume -----------------------------------------------------------------------------------


def _default_consumer_name(handlers: str) -> str:
    """``examples.user_registration.handlers:registry`` → ``examples.user_registration.handlers``
    (a stable name per handler module; the inbox, group and queue are keyed by it)."""
    return "".join(c if c.isalnum() or c in "_.-" else "-" for c in handlers.partition(":")[0])


@main.command()
@database_options
@env_option(
    "--broker",
    required=True,
    help="kafka://…, amqp://…, nats://… or redis://… plus the broker's consumer options "
    "(see docs/inbox.md).",
)
@env_option(
    "--handlers",
    required=True,
    help="The HandlerRegistry to run, as package.module:attribute.",
)
@env_option(
    "--consumer-name",
    default=None,
    help="Inbox name; also the Kafka group, RabbitMQ queue, NATS durable prefix and Redis "
    "group. Default: the handlers module.",
)
@click.option(
    "--topic",
    "topics",
    envvar="OUTBOXER_TOPICS",
    show_envvar=True,
    multiple=True,
    help="Topic / binding key / subject / stream to consume (repeatable; the environment "
    "variable takes a space-separated list). Default: the topics the handlers registered.",
)
@click.option(
    "--batch-size",
    envvar="OUTBOXER_CONSUME_BATCH_SIZE",
    show_envvar=True,
    default=100,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Messages fetched, stored and acknowledged together.",
)
@click.option(
    "--concurrency",
    envvar="OUTBOXER_CONSUME_CONCURRENCY",
    show_envvar=True,
    default=8,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Messages of different keys handled at once (one key: one at a time, in order).",
)
@env_option(
    "--batch-transactions",
    is_flag=True,
    help="One inbox transaction per batch chunk instead of per message: 2-3x the throughput, "
    "but a crash repeats the external side effects of the whole chunk (see docs/inbox.md).",
)
@click.option(
    "--max-attempts",
    envvar="OUTBOXER_CONSUME_MAX_ATTEMPTS",
    show_envvar=True,
    default=5,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="Failed attempts after which a message becomes a consume dead letter.",
)
@click.option(
    "--retry-base",
    envvar="OUTBOXER_CONSUME_RETRY_BASE",
    show_envvar=True,
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.001, 3600),
    help="First retry delay of a failed consumption (s); doubles per attempt.",
)
@click.option(
    "--retry-cap",
    envvar="OUTBOXER_CONSUME_RETRY_CAP",
    show_envvar=True,
    default=300.0,
    show_default=True,
    type=click.FloatRange(0.001, 86400),
)
@click.option(
    "--retry-interval",
    envvar="OUTBOXER_CONSUME_RETRY_INTERVAL",
    show_envvar=True,
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.01, 3600),
    help="How often due failed consumptions are re-driven (s).",
)
@env_option(
    "--inbox-retention",
    default=7 * 86400.0,
    show_default=True,
    type=click.FloatRange(1, None),
    help="Seconds an inbox row is kept; must exceed the broker's redelivery horizon.",
)
@env_option(
    "--sweep-interval",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0, 86400),
    help="How often this consumer offers to run the shared sweep (s); 0: leave it to others.",
)
@env_option(
    "--shutdown-timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0, 3600),
    help="How long the batch in progress may take after SIGTERM/SIGINT.",
)
@env_option(
    "--app-dir",
    default=".",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Directory put first on the import path before --handlers is imported.",
)
def consume(
    database_url: str,
    schema: str | None,
    table: str,
    broker: str,
    handlers: str,
    consumer_name: str | None,
    topics: tuple[str, ...],
    batch_size: int,
    concurrency: int,
    batch_transactions: bool,
    max_attempts: int,
    retry_base: float,
    retry_cap: float,
    retry_interval: float,
    inbox_retention: float,
    sweep_interval: float,
    shutdown_timeout: float,
    app_dir: str,
) -> None:
    """Run handlers for the messages of a broker, exactly once in effect (the inbox), until
    SIGTERM/SIGINT."""
    import os

    from outboxer.inbox import InboxSettings, load_registry

    names = _names(schema, table)
    sys.path.insert(0, os.path.abspath(app_dir))
    try:
        registry = load_registry(handlers)
        settings = InboxSettings(
            consumer=consumer_name or _default_consumer_name(handlers),
            max_attempts=max_attempts,
            retry=Backoff(base=retry_base, cap=max(retry_cap, retry_base)),
            retention=inbox_retention,
            concurrency=concurrency,
            batch_transactions=batch_transactions,
            redrive_interval=retry_interval,
            sweep_interval=sweep_interval,
        )
    except ConfigurationError as exc:
        _fail(str(exc), EXIT_USAGE)
    chosen = [t for entry in topics for t in entry.split()] or registry.topics
    if not chosen:
        _fail("give the topics to consume with --topic (the handlers register none)", EXIT_USAGE)
    _run(
        _consume(
            database_url, names, broker, registry, settings, chosen, batch_size, shutdown_timeout
        )
    )


async def _consume(
    url: str,
    names: TableNames,
    broker: str,
    registry: HandlerRegistry,
    settings: InboxSettings,
    topics: list[str],
    batch_size: int,
    shutdown_timeout: float,
) -> None:
    from outboxer.consumers import consumer_from_url
    from outboxer.inbox import Inbox, run_consumer
    from outboxer.stores import store_from_url

    adapter = consumer_from_url(
        broker, name=settings.consumer, topics=topics, batch_size=batch_size
    )
    scheme = url.partition("://")[0].split("+")[0].lower()
    if scheme in ("postgresql", "postgres"):
        from outboxer.stores.postgres import PostgresStore

        # A connection per message handled at once, plus the re-drive loop and the sweep.
        store: PostgresStore | SqliteStore = PostgresStore(
            url, names, max_connections=max(10, settings.concurrency + 2)
        )
    else:
        store = store_from_url(url, names)
    async with store:
        await store.check_schema()
        inbox = Inbox(store, registry, settings)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, inbox.stop)
        await run_consumer(inbox, adapter, sweeper=store, shutdown_timeout=shutdown_timeout)


# -- serve -------------------------------------------------------------------------------------


@main.command()
@database_options
@env_option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Interface to listen on (0.0.0.0 for every interface).",
)
@env_option(
    "--port",
    default=8080,
    show_default=True,
    type=click.IntRange(0, 65535),
)
@env_option(
    "--admin-token",
    default=None,
    help="Bearer token required on /api/; without it reads are open and replay/delete refused.",
)
@env_option(
    "--ready-max-age",
    default=300.0,
    show_default=True,
    type=click.FloatRange(0.001, None),
    help="/readyz fails when the oldest pending message is older (seconds).",
)
@env_option(
    "--ready-min-relays",
    default=1,
    show_default=True,
    type=click.IntRange(0, None),
    help="/readyz fails with fewer live relays (0: do not check).",
)
def serve(
    database_url: str,
    schema: str | None,
    table: str,
    host: str,
    port: int,
    admin_token: str | None,
    ready_max_age: float,
    ready_min_relays: int,
) -> None:
    """Admin HTTP API, Prometheus /metrics and the dashboard at /."""
    try:
        from outboxer.admin import create_app
        from outboxer.admin.server import listen, serve_app
    except ImportError as exc:
        _fail(f"the admin server needs its extra: pip install 'outboxer[admin]' ({exc})")
    names = _names(schema, table)
    try:
        listener = listen(host, port)  # before the database: a taken port is one line too
    except OSError as exc:
        _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")

    async def main() -> None:
        async with _open_store(database_url, names) as store:
            app = create_app(
                store,
                token=admin_token,
                ready_max_age=ready_max_age,
                ready_min_relays=ready_min_relays,
            )
            await serve_app(app, listener)

    try:
        _run(main())
    finally:
        listener.close()


def run() -> None:
    """Console entry point: usage errors become one line too (click prints three)."""
    try:
        code = main.main(standalone_mode=False)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "outboxer"
        _fail(f"{exc.format_message()} (see '{where} --help')", EXIT_USAGE)
    except click.Abort:
        _fail("aborted", EXIT_FAILURE)
    except click.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    run()
