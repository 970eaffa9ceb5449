"""The receiving side: handler registry, the idempotent inbox, and running consumers.

- :mod:`outboxer.inbox.registry`: which handler runs for which message, typed payloads;
- :mod:`outboxer.inbox.inbox`: at most one effect per (consumer, message id), retries,
  consume dead letters;
- :mod:`outboxer.inbox.consume`: the consume state machine, written once over the stores' SQL
  primitives (:class:`~outboxer.ports.InboxTransaction`);
- :mod:`outboxer.inbox.consumer`: running a broker adapter (``outboxer.brokers.*.consumer``) into an
  inbox, graceful shutdown;

Nothing here imports a database or broker driver. See docs/inbox.md.
"""

from outboxer.errors import HandlerEndedTransaction
from outboxer.inbox.consume import consume, redrive_consume_failures
from outboxer.inbox.consumer import BrokerConsumer, run_consumer
from outboxer.inbox.inbox import (
    ConsumerStopping,
    Inbox,
    InboxCounters,
    InboxSettings,
    validate_consumer_name,
)
from outboxer.inbox.registry import (
    Handler,
    HandlerContext,
    HandlerRegistry,
    PermanentHandlerError,
    UndecodablePayload,
    load_registry,
)

__all__ = [
    "BrokerConsumer",
    "ConsumerStopping",
    "Handler",
    "HandlerContext",
    "HandlerEndedTransaction",
    "HandlerRegistry",
    "Inbox",
    "InboxCounters",
    "InboxSettings",
    "PermanentHandlerError",
    "UndecodablePayload",
    "consume",
    "load_registry",
    "redrive_consume_failures",
    "run_consumer",
    "validate_consumer_name",
]
