"""Broker adapters, one package per broker: its settings, wire format, publisher and consumer.

``publisher_from_url`` and ``consumer_from_url`` pick the package by the URL's scheme through
the scheme registry (:mod:`outboxer.urls`) and import it only then, so the core never imports a
broker client it does not use. Every broker package has ``publisher_from_url(url)`` and,
when the broker can be consumed from, ``consumer_from_url(url, *, name, topics, batch_size)``.
The packages never import each other; what they share is in :mod:`outboxer.brokers.cloudevents`
(CloudEvents attribute names and time format) and :mod:`outboxer.brokers.subscription` (the
consumer settings' checks and reconnect pause).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from outboxer import urls
from outboxer.errors import ConfigurationError

if TYPE_CHECKING:
    from outboxer.inbox.consumer import BrokerConsumer
    from outboxer.ports import Publisher

__all__ = ["consumer_from_url", "publisher_from_url"]


def publisher_from_url(url: str, *, webhook_secret: str | None = None) -> Publisher:
    """A (not yet entered) publisher for a broker URL, e.g. ``kafka://127.0.0.1:9092``.

    ``webhook_secret`` signs HTTP webhook requests (never taken from the URL, which gets logged).
    """
    load = urls.loader(url, "broker")
    if webhook_secret is not None and urls.lookup(url, "broker").name != "http":
        raise ConfigurationError("a webhook secret only applies to http(s):// brokers")
    module = load()
    if webhook_secret is None:
        publisher: Publisher = module.publisher_from_url(url)
    else:
        publisher = module.publisher_from_url(url, secret=webhook_secret)
    return publisher


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
    module = urls.loader(url, "broker")()
    factory = getattr(module, "consumer_from_url", None)
    if factory is None:
        raise ConfigurationError(
            f"unsupported broker URL {urls.scheme_of(url)}:// for consuming: use one of "
            + ", ".join(f"{s}://" for s in _CONSUMABLE)
        )
    if not topics:
        raise ConfigurationError("a consumer needs at least one topic")
    if batch_size < 1:
        raise ConfigurationError(f"invalid batch size {batch_size}")
    consumer: BrokerConsumer = factory(url, name=name, topics=list(topics), batch_size=batch_size)
    return consumer


#: Schemes whose broker package has a consumer (for the error message above).
_CONSUMABLE = ("kafka", "amqp", "amqps", "nats", "redis", "rediss")
