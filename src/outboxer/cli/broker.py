"""``outboxer broker``: set up what the relay publishes to before anything is published."""

from __future__ import annotations

import dataclasses

import click

from outboxer import urls
from outboxer.cli.options import env_option
from outboxer.errors import ConfigurationError


@click.group()
def broker() -> None:
    """Broker-side setup."""


@broker.command("setup")
@env_option(
    "--broker",
    required=True,
    help="amqp://… as given to the relay (the exchange option) and to 'outboxer consume' "
    "(the queue and queue_type options).",
)
@click.option(
    "--queue",
    default=None,
    help="Also declare this durable queue (default: the URL's queue option, if any).",
)
@click.option(
    "--bind",
    "bindings",
    multiple=True,
    help="Bind the queue to the exchange with this routing key (repeatable; orders.*, #).",
)
def broker_setup(broker: str, queue: str | None, bindings: tuple[str, ...]) -> None:
    """Declare the relay's exchange (RabbitMQ: topic, durable) and optionally a queue bound to
    it, so consumers miss nothing published before they first start. Idempotent; an existing
    object with other arguments is reported, never changed."""
    if urls.lookup(broker, "broker").name != "rabbitmq":
        raise ConfigurationError(
            f"broker setup: nothing to set up for {urls.scheme_of(broker)}:// "
            "(amqp:// and amqps:// only)"
        )
    from outboxer.brokers.rabbitmq.settings import (
        CONSUMER_OPTIONS,
        SPEC,
        RabbitMQConsumerSettings,
        RabbitMQSettings,
    )
    from outboxer.brokers.rabbitmq.topology import declare

    connection = RabbitMQSettings.from_url(broker)
    queue = queue or urls.parse(broker, SPEC).values(CONSUMER_OPTIONS)["queue"]
    consumer = None
    if queue is not None:
        if not bindings:
            raise ConfigurationError(f"broker setup: give queue {queue!r} routing keys with --bind")
        consumer = RabbitMQConsumerSettings.from_url(broker, name=queue, topics=bindings)
        consumer = dataclasses.replace(consumer, queue=queue)  # --queue wins over ?queue=
    elif bindings:
        raise ConfigurationError("broker setup: --bind needs --queue (or ?queue= in the URL)")
    for line in declare(connection, consumer):
        click.echo(f"declared {line}")
