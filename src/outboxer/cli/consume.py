"""``outboxer consume``: run handlers for a broker's messages through the inbox."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from outboxer.cli._common import EXIT_USAGE, STOP_GRACE, fail, open_store, stop_on_signals
from outboxer.cli.options import (
    app_dir_option,
    build_settings,
    checked,
    database_options,
    env_option,
    settings_options,
)
from outboxer.config import Setting, TableNames
from outboxer.inbox import HandlerRegistry, InboxSettings, load_registry
from outboxer.inbox.registry import registry_spec


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
@settings_options(InboxSettings)
@env_option(
    "--shutdown-timeout",
    default=30.0,
    show_default=True,
    type=click.FLOAT,
    callback=checked(Setting("", minimum=0, maximum=3600)),  # FloatRange lets nan through
    help="How long the batch in progress may take after SIGTERM/SIGINT (s).",
)
@app_dir_option
def consume(
    database_url: str,
    schema: str | None,
    table: str,
    broker: str,
    handlers: str,
    topics: tuple[str, ...],
    batch_size: int,
    shutdown_timeout: float,
    **values: Any,
) -> None:
    """Run handlers for the messages of a broker, exactly once in effect (the inbox), until
    SIGTERM/SIGINT."""
    names = TableNames(table=table, schema=schema)
    registry_spec(handlers)  # before a consumer name is made of it
    settings = build_settings(
        InboxSettings, values, consumer=values["consumer"] or _default_consumer_name(handlers)
    )
    registry = load_registry(handlers)
    chosen = [t for entry in topics for t in entry.split()] or registry.topics
    if not chosen:
        fail("give the topics to consume with --topic (the handlers register none)", EXIT_USAGE)
    asyncio.run(
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

    adapter = consumer_from_url(
        broker, name=settings.consumer, topics=topics, batch_size=batch_size
    )

    # A connection per message handled at once, plus the re-drive loop and the sweep.
    connections = max(10, settings.concurrency + 2)
    async with open_store(url, names, connections=connections) as store:
        inbox = Inbox(store, registry, settings)
        stop_on_signals(inbox.stop, shutdown_timeout + STOP_GRACE, "the consumer")
        await run_consumer(inbox, adapter, sweeper=store, shutdown_timeout=shutdown_timeout)
