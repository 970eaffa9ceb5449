"""RabbitMQ topology: the exchange the relay publishes to, and consumer queues bound to it.

The publisher declares its exchange on every connect and the consumer declares its queue and
bindings, so a deployment works without any setup. But a topic exchange drops messages no queue
is bound for yet, and with ``?unroutable=dead-letter`` the relay dead-letters them: a consumer
that starts after the first publish misses them. :func:`declare` (``outboxer broker setup``)
creates the topology ahead of both, with exactly the arguments the publisher and consumer use
(:func:`exchange_declaration`, :func:`queue_declaration`), so their own declarations later find
it equivalent and change nothing.

Declaring is idempotent. RabbitMQ refuses to redeclare an object with other arguments (an
exchange of another type or durability, a queue of another type) with ``406
PRECONDITION_FAILED``: that is a :class:`~outboxer.errors.ConfigurationError` naming the object
and RabbitMQ's reason; nothing existing is changed or deleted. A broker that cannot be reached
(or refuses the login or vhost) is :class:`~outboxer.errors.BrokerUnavailable`.
"""

from __future__ import annotations

import ssl
from typing import Any

import pika  # type: ignore[import-untyped]
import pika.exceptions  # type: ignore[import-untyped]

from outboxer.brokers.rabbitmq._pika import describe
from outboxer.brokers.rabbitmq.settings import RabbitMQConsumerSettings, RabbitMQSettings
from outboxer.errors import BrokerUnavailable, ConfigurationError

__all__ = ["EXCHANGE_TYPE", "declare", "exchange_declaration", "queue_declaration"]

#: Every message goes to one exchange of this type, with the topic as routing key, so consumers
#: bind with patterns (``orders.*``, ``#``).
EXCHANGE_TYPE = "topic"

_PRECONDITION_FAILED = 406


def exchange_declaration(settings: RabbitMQSettings) -> dict[str, Any]:
    """The keyword arguments of ``exchange_declare`` for the relay's exchange: durable, so it
    survives a broker restart with its bindings (the publisher and consumer declare the same)."""
    return {"exchange": settings.exchange, "exchange_type": EXCHANGE_TYPE, "durable": True}


def queue_declaration(settings: RabbitMQConsumerSettings) -> dict[str, Any]:
    """The keyword arguments of ``queue_declare`` for a consumer's queue: durable, of the URL's
    ``queue_type`` (a queue's type is fixed when it is first declared)."""
    return {
        "queue": settings.queue,
        "durable": True,
        "arguments": {"x-queue-type": settings.queue_type},
    }


def declare(
    connection: RabbitMQSettings,
    queue: RabbitMQConsumerSettings | None = None,
    *,
    ssl_context: ssl.SSLContext | None = None,
) -> list[str]:
    """Declare the exchange of ``connection`` and, with ``queue``, that queue and its bindings.

    One short blocking connection: this runs from the command line or a deployment script,
    before the relay and consumers start.

    Returns:
        One line per object declared, for the operator.

    Raises:
        ConfigurationError: An object exists with other arguments (RabbitMQ's reason quoted).
        BrokerUnavailable: RabbitMQ cannot be reached, or refuses the login, vhost or access.
    """
    where = connection.safe_url()
    try:
        link = pika.BlockingConnection(connection.connection_parameters(ssl_context))
    except pika.exceptions.AMQPError as exc:
        raise BrokerUnavailable(f"{where}: {describe(exc)}") from exc
    done: list[str] = []
    what = f"exchange {connection.exchange!r}"
    try:
        channel = link.channel()
        channel.exchange_declare(**exchange_declaration(connection))
        done.append(f"{what}: type {EXCHANGE_TYPE}, durable")
        if queue is not None:
            what = f"queue {queue.queue!r}"
            channel.queue_declare(**queue_declaration(queue))
            done.append(f"{what}: {queue.queue_type}, durable")
            for key in queue.topics:
                what = f"binding {key!r} of queue {queue.queue!r}"
                channel.queue_bind(queue.queue, connection.exchange, routing_key=key)
                done.append(f"{what} on exchange {connection.exchange!r}")
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == _PRECONDITION_FAILED:
            raise ConfigurationError(
                f"{where}: {what} exists with other arguments ({describe(exc)}); "
                "use another name or delete the existing one"
            ) from exc
        raise BrokerUnavailable(f"{where}: declaring {what}: {describe(exc)}") from exc
    except pika.exceptions.AMQPError as exc:
        raise BrokerUnavailable(f"{where}: declaring {what}: {describe(exc)}") from exc
    finally:
        if link.is_open:
            link.close()
    return done
