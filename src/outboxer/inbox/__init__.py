"""The receiving side: handler registry (and, later, the idempotent inbox and consumers)."""

from outboxer.inbox.registry import Handler, HandlerRegistry, load_registry

__all__ = ["Handler", "HandlerRegistry", "load_registry"]
