"""The RabbitMQ broker: settings, wire format (:mod:`.wire`), publisher and consumer."""

from typing import Any

from outboxer.brokers.rabbitmq.consumer import RabbitMQConsumer
from outboxer.brokers.rabbitmq.publisher import RabbitMQPublisher
from outboxer.brokers.rabbitmq.settings import RabbitMQConsumerSettings, RabbitMQSettings

__all__ = [
    "RabbitMQConsumer",
    "RabbitMQConsumerSettings",
    "RabbitMQPublisher",
    "RabbitMQSettings",
    "consumer_from_url",
    "publisher_from_url",
]

#: Used by :func:`outboxer.brokers.publisher_from_url`.
publisher_from_url = RabbitMQPublisher.from_url


def consumer_from_url(url: str, **options: Any) -> RabbitMQConsumer:
    """Used by :func:`outboxer.brokers.consumer_from_url` (``name``, ``topics``, ``batch_size``)."""
    return RabbitMQConsumer(RabbitMQConsumerSettings.from_url(url, **options))
