"""The Kafka broker: settings, wire format (:mod:`.wire`), publisher and consumer."""

from typing import Any

from outboxer.brokers.kafka.consumer import KafkaConsumer
from outboxer.brokers.kafka.publisher import KafkaPublisher
from outboxer.brokers.kafka.settings import KafkaConsumerSettings, KafkaSettings

__all__ = [
    "KafkaConsumer",
    "KafkaConsumerSettings",
    "KafkaPublisher",
    "KafkaSettings",
    "consumer_from_url",
    "publisher_from_url",
]

#: Used by :func:`outboxer.brokers.publisher_from_url`.
publisher_from_url = KafkaPublisher.from_url


def consumer_from_url(url: str, **options: Any) -> KafkaConsumer:
    """Used by :func:`outboxer.brokers.consumer_from_url` (``name``, ``topics``, ``batch_size``)."""
    return KafkaConsumer(KafkaConsumerSettings.from_url(url, **options))
