"""Broker consumer adapters. ``consumer_from_url`` picks one by broker URL, importing it lazily.

Each adapter reads what the publisher of the same broker writes (the wire formats are decoded by
:mod:`outboxer.inbox.wire`) and follows :class:`~outboxer.inbox.consumer.BrokerConsumer`: a batch
is acknowledged only after the inbox committed the outcome of each of its messages.

The consumer name is the broker-side identity too: Kafka consumer group, RabbitMQ queue, NATS
durable consumer (one per subject), Redis consumer group.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from urllib.parse import unquote

from outboxer.errors import ConfigurationError
from outboxer.inbox.consumer import BrokerConsumer

__all__ = ["consumer_from_url", "split_options"]

#: URL scheme → (module, class, pip extra that installs its client)
_ADAPTERS = {
    "kafka": ("outboxer.consumers.kafka", "KafkaConsumer", "kafka"),
    "amqp": ("outboxer.consumers.rabbitmq", "RabbitMQConsumer", "rabbitmq"),
    "amqps": ("outboxer.consumers.rabbitmq", "RabbitMQConsumer", "rabbitmq"),
    "nats": ("outboxer.consumers.nats", "NatsConsumer", "nats"),
    "redis": ("outboxer.consumers.redis", "RedisConsumer", "redis"),
    "rediss": ("outboxer.consumers.redis", "RedisConsumer", "redis"),
}


def consumer_from_url(
    url: str, *, name: str, topics: Sequence[str], batch_size: int = 100
) -> BrokerConsumer:
    """A (not yet entered) consumer adapter for a broker URL.

    Args:
        url: The broker URL, as given to the relay, plus the consumer options of that broker
            (see each adapter's docstring), e.g. ``kafka://127.0.0.1:9092?session_timeout_ms=6000``.
        name: The consumer (inbox) name; also the broker-side group/queue/durable name.
        topics: Kafka topics, AMQP binding keys, NATS subjects or Redis streams.
        batch_size: Messages fetched and committed together.
    """
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in _ADAPTERS:
        raise ConfigurationError(
            f"unsupported broker URL scheme {scheme + '://' if scheme else repr(url)} for "
            "consuming: use one of " + ", ".join(f"{s}://" for s in _ADAPTERS)
        )
    if not topics:
        raise ConfigurationError("a consumer needs at least one topic")
    if batch_size < 1:
        raise ConfigurationError(f"invalid batch size {batch_size}")
    module_name, class_name, extra = _ADAPTERS[scheme]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"the {scheme}:// consumer is not available: {exc} (pip install 'outboxer[{extra}]')"
        ) from exc
    consumer: BrokerConsumer = getattr(module, class_name).from_url(
        url, name=name, topics=list(topics), batch_size=batch_size
    )
    return consumer


def split_options(url: str, names: Sequence[str]) -> tuple[str, dict[str, str]]:
    """Take the consumer-only query options ``names`` out of ``url``.

    Returns the URL without them (for the publisher's settings parser, which knows the
    connection options and refuses unknown ones) and the options found.

    Raises:
        ConfigurationError: an option is given twice.
    """
    base, sep, query = url.partition("?")
    if not sep:
        return url, {}
    query, hash_, fragment = query.partition("#")
    kept: list[str] = []
    found: dict[str, str] = {}
    for part in query.split("&"):
        if not part:
            continue
        key, _, value = part.partition("=")
        if key in names:
            if key in found:
                raise ConfigurationError(f"broker URL option {key!r} is given more than once")
            found[key] = unquote(value)
        else:
            kept.append(part)
    rebuilt = base + ("?" + "&".join(kept) if kept else "") + (hash_ + fragment)
    return rebuilt, found
