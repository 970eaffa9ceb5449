"""outboxer: a transactional outbox for Python.

Write messages in the same transaction as your business rows with :func:`enqueue` /
:func:`enqueue_async` (many at once: :func:`enqueue_many` / :func:`enqueue_many_async`); run
``outboxer relay`` to publish them, acknowledged, to your broker.
"""

from outboxer.config import Backoff, RelaySettings, TableNames
from outboxer.errors import (
    BrokerUnavailable,
    ConfigurationError,
    HandlerEndedTransaction,
    NotFound,
    OutboxerError,
    PermanentHandlerError,
    PermanentPublishError,
    PermissionDenied,
    PublishError,
    RelayFailed,
    RetryablePublishError,
    SchemaError,
    StoreError,
    StoreUnavailable,
    UndecodablePayload,
)
from outboxer.inbox.registry import HandlerContext, HandlerRegistry
from outboxer.message import Message
from outboxer.outbox import (
    Outbox,
    Returned,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
    with_message,
)
from outboxer.ports import Publisher, Store
from outboxer.relay import Relay

__all__ = [
    "Backoff",
    "BrokerUnavailable",
    "ConfigurationError",
    "HandlerContext",
    "HandlerEndedTransaction",
    "HandlerRegistry",
    "Message",
    "NotFound",
    "Outbox",
    "OutboxerError",
    "PermanentHandlerError",
    "PermanentPublishError",
    "PermissionDenied",
    "PublishError",
    "Publisher",
    "Relay",
    "RelayFailed",
    "RelaySettings",
    "RetryablePublishError",
    "Returned",
    "SchemaError",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "TableNames",
    "UndecodablePayload",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "with_message",
]

__version__ = "0.1.0"
