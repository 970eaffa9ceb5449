"""What the consumer settings of every broker share. Each broker package keeps its own class,
with the broker's words for the consumer's name (group, queue, durable) and its topics (topics,
binding keys, subjects, streams); here is what they do alike: the subscription checked, the
pause between connection attempts. No broker client is imported here: every broker package may
use it.
"""

from __future__ import annotations

from collections.abc import Sequence

from outboxer.config import Backoff
from outboxer.errors import ConfigurationError
from outboxer.inbox.inbox import validate_consumer_name

__all__ = ["check_subscription", "reconnect_backoff"]


def check_subscription(broker: str, name: str, topics: Sequence[str], topic: str) -> None:
    """Refuse a name the inbox cannot take for a consumer, and an empty subscription.

    Args:
        broker: How the error names the consumer's broker (``kafka``, ``NATS`` ...).
        name: The consumer name (the broker-side group, queue or durable name).
        topics: What it subscribes to.
        topic: The broker's word for one of them (topic, subject, stream).
    """
    validate_consumer_name(name)
    if not topics:
        raise ConfigurationError(f"{broker} consumer: at least one {topic} is required")


def reconnect_backoff() -> Backoff:
    """The pause between connection attempts while the broker is unreachable: 1 s, doubling,
    at most 30 s."""
    return Backoff(base=1.0, factor=2.0, cap=30.0)
