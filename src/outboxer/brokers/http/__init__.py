"""HTTP webhooks: settings, wire format (:mod:`.wire`) and publisher (no consumer)."""

from outboxer.brokers.http.publisher import HttpPublisher
from outboxer.brokers.http.settings import HttpSettings

__all__ = ["HttpPublisher", "HttpSettings", "publisher_from_url"]

#: Used by :func:`outboxer.brokers.publisher_from_url` (which passes ``secret=``).
publisher_from_url = HttpPublisher.from_url
