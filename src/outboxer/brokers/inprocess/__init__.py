"""In-process handlers: the publisher that calls local functions (no wire, no consumer)."""

from outboxer.brokers.inprocess.publisher import InProcessPublisher

__all__ = ["InProcessPublisher", "publisher_from_url"]

#: Used by :func:`outboxer.brokers.publisher_from_url`.
publisher_from_url = InProcessPublisher.from_url
