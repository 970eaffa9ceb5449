"""outboxer: a transactional outbox for Python.

Write messages in the same transaction as your business rows with :func:`enqueue` /
:func:`enqueue_async`; run ``outboxer relay`` to publish them, acknowledged, to your broker.
"""

from outboxer.config import Backoff, RelaySettings, TableNames
from outboxer.errors import (
    BrokerUnavailable,
    ConfigurationError,
    NotFound,
    OutboxerError,
    PermanentPublishError,
    PublishError,
    RetryablePublishError,
    SchemaError,
    StoreError,
    StoreUnavailable,
)
from outboxer.inbox.registry import HandlerRegistry
from outboxer.message import Message
from outboxer.outbox import Outbox, enqueue, enqueue_async
from outboxer.ports import Publisher, Store
from outboxer.relay import Relay

__all__ = [
    "Backoff",
    "BrokerUnavailable",
    "ConfigurationError",
    "HandlerRegistry",
    "Message",
    "NotFound",
    "Outbox",
    "OutboxerError",
    "PermanentPublishError",
    "PublishError",
    "Publisher",
    "Relay",
    "RelaySettings",
    "RetryablePublishError",
    "SchemaError",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "TableNames",
    "enqueue",
    "enqueue_async",
]

__version__ = "0.1.0"
