"""The RabbitMQ broker: settings, wire format (:mod:`.wire`), publisher and consumer."""

from typing import Any

from outboxer.brokers.rabbitmq.consumer import RabbitMQConsumer
from outboxer.brokers.rabbitmq.publisher import RabbitMQPublisher
from outboxer.brokers.rabbitmq.settings import RabbitMQConsumerSettings, RabbitMQSettings

__all__ = ["RabbitMQConsumer", "RabbitMQConsumerSettings", "RabbitMQPublisher", "RabbitMQSettings"]

# What outboxer.brokers loads by URL scheme.
publisher_from_url = RabbitMQPublisher.from_url


def consumer_from_url(url: str, **options: Any) -> RabbitMQConsumer:
    return RabbitMQConsumer(RabbitMQConsumerSettings.from_url(url, **options))
