"""The NATS JetStream broker: settings, wire format (:mod:`.wire`), publisher and consumer."""

from typing import Any

from outboxer.brokers.nats.consumer import NatsConsumer
from outboxer.brokers.nats.publisher import NatsPublisher
from outboxer.brokers.nats.settings import NatsConsumerSettings, NatsSettings

__all__ = ["NatsConsumer", "NatsConsumerSettings", "NatsPublisher", "NatsSettings"]

# What outboxer.brokers loads by URL scheme.
publisher_from_url = NatsPublisher.from_url


def consumer_from_url(url: str, **options: Any) -> NatsConsumer:
    return NatsConsumer(NatsConsumerSettings.from_url(url, **options))
