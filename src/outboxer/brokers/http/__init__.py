"""HTTP webhooks: settings, wire format (:mod:`.wire`) and publisher (no consumer)."""

from outboxer.brokers.http.publisher import HttpPublisher
from outboxer.brokers.http.settings import HttpSettings

__all__ = ["HttpPublisher", "HttpSettings"]

# What outboxer.brokers loads by URL scheme.
publisher_from_url = HttpPublisher.from_url
