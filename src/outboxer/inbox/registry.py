"""Handler registry: which functions react to which messages.

One registry serves the in-process publisher (``inprocess://module:registry``) and, later, the
broker consumers. A handler is chosen by the message ``type`` (``UserRegistered``) or, for
messages without a matching type handler, by ``topic``. Handlers may be plain or ``async``
functions taking the :class:`~outboxer.message.Message`; delivery is at-least-once, so handlers
must be idempotent.
"""

from __future__ import annotations

import importlib
import inspect
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from outboxer.errors import ConfigurationError
from outboxer.message import Message

__all__ = ["Handler", "HandlerRegistry", "load_registry"]

Handler = Callable[[Message], Any] | Callable[[Message], Awaitable[Any]]


class HandlerRegistry:
    """Maps message types and topics to handler functions.

    Example::

        handlers = HandlerRegistry()

        @handlers.handler("UserRegistered")
        def send_welcome_email(message: Message) -> None: ...
    """

    def __init__(self) -> None:
        self._by_type: dict[str, list[Handler]] = defaultdict(list)
        self._by_topic: dict[str, list[Handler]] = defaultdict(list)

    def register(
        self,
        function: Handler,
        type: str | None = None,  # noqa: A002 - the contract's word
        *,
        topic: str | None = None,
    ) -> Handler:
        """Register ``function`` for a message type and/or a topic."""
        if type is None and topic is None:
            raise ConfigurationError("a handler needs a message type or a topic")
        if not callable(function):
            raise ConfigurationError(f"handler {function!r} is not callable")
        if type is not None:
            self._by_type[type].append(function)
        if topic is not None:
            self._by_topic[topic].append(function)
        return function

    def handler(
        self,
        type: str | None = None,  # noqa: A002 - the contract's word
        *,
        topic: str | None = None,
    ) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`register`."""

        def decorate(function: Handler) -> Handler:
            return self.register(function, type, topic=topic)

        return decorate

    def handlers_for(self, message: Message) -> list[Handler]:
        """Type handlers when the type has any, else topic handlers."""
        if message.type is not None and message.type in self._by_type:
            return self._by_type[message.type]
        return self._by_topic.get(message.topic, [])

    @staticmethod
    def is_async(function: Handler) -> bool:
        return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
            getattr(function, "__call__", None)  # noqa: B004 - async callable objects
        )


def load_registry(spec: str) -> HandlerRegistry:
    """Import ``package.module:attribute`` and return the registry it names."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(
            f"handlers must be given as 'package.module:registry', not {spec!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import handler module {module_name!r}: {exc}") from exc
    registry = getattr(module, attribute, None)
    if not isinstance(registry, HandlerRegistry):
        raise ConfigurationError(f"{spec!r} is not a HandlerRegistry")
    return registry
