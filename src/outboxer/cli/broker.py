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
    "(the queue and queue_type options), or kafka://….",
)
@click.option(
    "--queue",
    default=None,
    help="RabbitMQ: also declare this durable queue (default: the URL's queue option, if any).",
)
@click.option(
    "--bind",
    "bindings",
    multiple=True,
    help="RabbitMQ: bind the queue to the exchange with this routing key (repeatable; "
    "orders.*, #).",
)
@click.option("--topic", "topics", multiple=True, help="Kafka: create this topic (repeatable).")
@click.option(
    "--partitions",
    default=3,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Kafka: partitions of each topic created.",
)
def broker_setup(
    broker: str,
    queue: str | None,
    bindings: tuple[str, ...],
    topics: tuple[str, ...],
    partitions: int,
) -> None:
    """Declare what the relay publishes to, so consumers miss nothing published before they
    first start: RabbitMQ's exchange (topic, durable) and optionally a queue bound to it;
    Kafka's topics. Idempotent; an existing object with other arguments is reported, never
    changed."""
    kind = urls.lookup(broker, "broker").name
    if kind == "kafka":
        if queue or bindings or not topics:
            raise ConfigurationError("broker setup: for Kafka give the topics with --topic")
        from outboxer.brokers.kafka.settings import KafkaSettings
        from outboxer.brokers.kafka.topology import create_topics

        done = create_topics(KafkaSettings.from_url(broker), topics, partitions)
    elif kind == "rabbitmq":
        if topics:
            raise ConfigurationError("broker setup: --topic is for Kafka; RabbitMQ takes --bind")
        done = _rabbitmq(broker, queue, bindings)
    else:
        raise ConfigurationError(
            f"broker setup: nothing to set up for {urls.scheme_of(broker)}:// "
            "(amqp://, amqps:// and kafka:// only)"
        )
    for line in done:
        click.echo(f"declared {line}")


def _rabbitmq(broker: str, queue: str | None, bindings: tuple[str, ...]) -> list[str]:
    from outboxer.brokers.rabbitmq.settings import (
        CONSUMER_OPTIONS,
        SPEC,
        RabbitMQConsumerSettings,
        RabbitMQSettings,
    )
    from outboxer.brokers.rabbitmq.topology import declare

    connection = RabbitMQSettings.from_url(broker)
    if queue is None:
        queue = urls.parse(broker, SPEC).values(CONSUMER_OPTIONS)["queue"]
    consumer = None
    if queue is not None:
        if not bindings:
            raise ConfigurationError(f"broker setup: give queue {queue!r} routing keys with --bind")
        consumer = RabbitMQConsumerSettings.from_url(broker, name=queue, topics=bindings)
        consumer = dataclasses.replace(consumer, queue=queue)  # --queue wins over ?queue=
    elif bindings:
        raise ConfigurationError("broker setup: --bind needs --queue (or ?queue= in the URL)")
    return declare(connection, consumer)
