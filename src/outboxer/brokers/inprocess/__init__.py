"""In-process handlers: the publisher that calls local functions (no wire, no consumer)."""

from outboxer.brokers.inprocess.publisher import InProcessPublisher

__all__ = ["InProcessPublisher"]

# What outboxer.brokers loads by URL scheme.
publisher_from_url = InProcessPublisher.from_url
