"""Publisher adapters. ``publisher_from_url`` picks one by broker URL and imports it lazily.

Every adapter module defines one publisher class with a ``from_url(url)`` classmethod, so the
core never imports a broker client it does not use.
"""

from __future__ import annotations

import importlib

from outboxer.errors import ConfigurationError
from outboxer.ports import Publisher

__all__ = ["publisher_from_url"]

#: URL scheme → (module, class, pip extra that installs its client)
_ADAPTERS = {
    "inprocess": ("outboxer.publishers.inprocess", "InProcessPublisher", None),
    "kafka": ("outboxer.publishers.kafka", "KafkaPublisher", "kafka"),
    "amqp": ("outboxer.publishers.rabbitmq", "RabbitMQPublisher", "rabbitmq"),
    "amqps": ("outboxer.publishers.rabbitmq", "RabbitMQPublisher", "rabbitmq"),
    "nats": ("outboxer.publishers.nats", "NatsPublisher", "nats"),
    "redis": ("outboxer.publishers.redis", "RedisPublisher", "redis"),
    "rediss": ("outboxer.publishers.redis", "RedisPublisher", "redis"),
    "http": ("outboxer.publishers.http", "HttpPublisher", "http"),
    "https": ("outboxer.publishers.http", "HttpPublisher", "http"),
}


def publisher_from_url(url: str, *, webhook_secret: str | None = None) -> Publisher:
    """A (not yet entered) publisher for a broker URL, e.g. ``kafka://127.0.0.1:9092``.

    ``webhook_secret`` signs HTTP webhook requests (never taken from the URL, which gets logged).
    """
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in _ADAPTERS:
        raise ConfigurationError(
            f"unsupported broker URL scheme {scheme + '://' if scheme else repr(url)}: use one "
            "of " + ", ".join(f"{s}://" for s in _ADAPTERS)
        )
    module_name, class_name, extra = _ADAPTERS[scheme]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f" (pip install 'outboxer[{extra}]')" if extra else ""
        raise ConfigurationError(
            f"the {scheme}:// publisher is not available: {exc}{hint}"
        ) from exc
    factory = getattr(module, class_name).from_url
    if scheme in ("http", "https"):
        publisher: Publisher = factory(url, secret=webhook_secret)
    else:
        if webhook_secret is not None:
            raise ConfigurationError("a webhook secret only applies to http(s):// brokers")
        publisher = factory(url)
    return publisher
