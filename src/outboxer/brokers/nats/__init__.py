"""The NATS JetStream broker: settings, wire format (:mod:`.wire`), publisher and consumer."""

from typing import Any

from outboxer.brokers.nats.consumer import NatsConsumer
from outboxer.brokers.nats.publisher import NatsPublisher
from outboxer.brokers.nats.settings import NatsConsumerSettings, NatsSettings

__all__ = [
    "NatsConsumer",
    "NatsConsumerSettings",
    "NatsPublisher",
    "NatsSettings",
    "consumer_from_url",
    "publisher_from_url",
]

#: Used by :func:`outboxer.brokers.publisher_from_url`.
publisher_from_url = NatsPublisher.from_url


def consumer_from_url(url: str, **options: Any) -> NatsConsumer:
    """Used by :func:`outboxer.brokers.consumer_from_url` (``name``, ``topics``, ``batch_size``)."""
    return NatsConsumer(NatsConsumerSettings.from_url(url, **options))
