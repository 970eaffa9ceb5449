"""The Kafka broker: settings, wire format (:mod:`.wire`), publisher and consumer."""

from typing import Any

from outboxer.brokers.kafka.consumer import KafkaConsumer
from outboxer.brokers.kafka.publisher import KafkaPublisher
from outboxer.brokers.kafka.settings import KafkaConsumerSettings, KafkaSettings

__all__ = ["KafkaConsumer", "KafkaConsumerSettings", "KafkaPublisher", "KafkaSettings"]

# What outboxer.brokers loads by URL scheme.
publisher_from_url = KafkaPublisher.from_url


def consumer_from_url(url: str, **options: Any) -> KafkaConsumer:
    return KafkaConsumer(KafkaConsumerSettings.from_url(url, **options))
