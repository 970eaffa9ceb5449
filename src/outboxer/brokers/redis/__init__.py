"""The Redis Streams broker: settings, wire format (:mod:`.wire`), publisher and consumer."""

from typing import Any

from outboxer.brokers.redis.consumer import RedisConsumer
from outboxer.brokers.redis.publisher import RedisPublisher
from outboxer.brokers.redis.settings import RedisConsumerSettings, RedisSettings

__all__ = ["RedisConsumer", "RedisConsumerSettings", "RedisPublisher", "RedisSettings"]

# What outboxer.brokers loads by URL scheme.
publisher_from_url = RedisPublisher.from_url


def consumer_from_url(url: str, **options: Any) -> RedisConsumer:
    return RedisConsumer(RedisConsumerSettings.from_url(url, **options))
