"""``outboxer consume``: run handlers for a broker's messages through the inbox."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import TYPE_CHECKING

import click

from outboxer.cli._common import EXIT_USAGE, fail, run_async, table_names
from outboxer.cli.options import database_options, env_option
from outboxer.config import Backoff, TableNames
from outboxer.errors import ConfigurationError

if TYPE_CHECKING:
    from outboxer.inbox import HandlerRegistry, InboxSettings
    from outboxer.ports import DatabaseStore


def _default_consumer_name(handlers: str) -> str:
    """``examples.user_registration.handlers:registry`` → ``examples.user_registration.handlers``
    (a stable name per handler module; the inbox, group and queue are keyed by it)."""
    return "".join(c if c.isalnum() or c in "_.-" else "-" for c in handlers.partition(":")[0])


@click.command()
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

    names = table_names(schema, table)
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
        fail(str(exc), EXIT_USAGE)
    chosen = [t for entry in topics for t in entry.split()] or registry.topics
    if not chosen:
        fail("give the topics to consume with --topic (the handlers register none)", EXIT_USAGE)
    run_async(
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
    from outboxer.brokers import consumer_from_url
    from outboxer.inbox import Inbox, run_consumer
    from outboxer.stores import store_from_url

    adapter = consumer_from_url(
        broker, name=settings.consumer, topics=topics, batch_size=batch_size
    )
    scheme = url.partition("://")[0].split("+")[0].lower()
    if scheme in ("postgresql", "postgres"):
        from outboxer.stores.postgres import PostgresStore

        # A connection per message handled at once, plus the re-drive loop and the sweep.
        store: DatabaseStore = PostgresStore(
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
