"""The Redis Streams broker: settings, wire format (:mod:`.wire`), publisher and consumer."""

from typing import Any

from outboxer.brokers.redis.consumer import RedisConsumer
from outboxer.brokers.redis.publisher import RedisPublisher
from outboxer.brokers.redis.settings import RedisConsumerSettings, RedisSettings

__all__ = [
    "RedisConsumer",
    "RedisConsumerSettings",
    "RedisPublisher",
    "RedisSettings",
    "consumer_from_url",
    "publisher_from_url",
]

#: Used by :func:`outboxer.brokers.publisher_from_url`.
publisher_from_url = RedisPublisher.from_url


def consumer_from_url(url: str, **options: Any) -> RedisConsumer:
    """Used by :func:`outboxer.brokers.consumer_from_url` (``name``, ``topics``, ``batch_size``)."""
    return RedisConsumer(RedisConsumerSettings.from_url(url, **options))
