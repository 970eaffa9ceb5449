"""In-process publisher: "publishing" a message means running its handlers in the relay.

A message is acknowledged when every handler returned. A handler that raises counts a failed
attempt (retried later, dead-lettered after ``max_attempts``); raising
:class:`~outboxer.errors.PermanentPublishError` dead-letters at once. A message with no handler
is a permanent failure: silently dropping it would hide a wiring mistake.

Handlers are called through :meth:`HandlerRegistry.call`, like the broker consumers call them:
typed payload decoding, and a :class:`~outboxer.inbox.registry.HandlerContext` (without a
database connection here: there is no inbox transaction). A payload that does not decode into
the annotated type (:class:`~outboxer.inbox.registry.PermanentHandlerError`) is dead-lettered at
once.

Plain (sync) handlers of a batch run one after the other in one worker thread, so a slow handler
never blocks the relay's event loop; async handlers run concurrently on the loop. Within a batch
the relay never puts two messages of the same key (ordered mode), so concurrency keeps order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from outboxer.brokers.inprocess.settings import registry_reference
from outboxer.errors import (
    BrokerUnavailable,
    PermanentPublishError,
    PublishError,
    RetryablePublishError,
    error_summary,
)
from outboxer.inbox.registry import (
    Handler,
    HandlerContext,
    HandlerRegistry,
    PermanentHandlerError,
    cancelled_itself,
    exited,
    load_registry,
)
from outboxer.message import Message

__all__ = ["InProcessPublisher"]


def _as_publish_error(exc: BaseException) -> PublishError:
    if isinstance(exc, PermanentPublishError | BrokerUnavailable | RetryablePublishError):
        return exc
    text = f"handler raised {error_summary(exc)}"
    if isinstance(exc, PermanentHandlerError):  # e.g. a payload that does not decode
        return PermanentPublishError(text)
    return RetryablePublishError(text)


class InProcessPublisher:
    """Runs the handlers of a :class:`HandlerRegistry` for each message."""

    def __init__(self, registry: HandlerRegistry) -> None:
        self.registry = registry

    @classmethod
    def from_url(cls, url: str) -> InProcessPublisher:
        """``inprocess://package.module:registry``."""
        return cls(load_registry(registry_reference(url)))

    async def __aenter__(self) -> InProcessPublisher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
        results: list[PublishError | None] = [None] * len(messages)
        threaded: list[tuple[int, list[Handler]]] = []
        looped: list[Any] = []
        for index, message in enumerate(messages):
            handlers = self.registry.handlers_for(message)
            if not handlers:
                results[index] = PermanentPublishError(
                    f"no handler for type {message.type!r} or topic {message.topic!r}"
                )
            elif any(self.registry.is_async(h) for h in handlers):
                looped.append(self._run_async(results, index, message))
            else:
                threaded.append((index, handlers))
        if threaded:
            await asyncio.to_thread(self._run_sync, self.registry, results, messages, threaded)
        if looped:
            await asyncio.gather(*looped)
        return results

    @staticmethod
    def _run_sync(
        registry: HandlerRegistry,
        results: list[PublishError | None],
        messages: Sequence[Message],
        work: list[tuple[int, list[Handler]]],
    ) -> None:
        for index, handlers in work:
            message = messages[index]
            context = _context(message)
            try:
                for handler in handlers:
                    registry.call(handler, message, context)
            except Exception as exc:  # noqa: BLE001 - a handler's failure is the message's
                results[index] = _as_publish_error(exc)
            except BaseException as exc:  # noqa: BLE001 - SystemExit, a handler's own, ...
                results[index] = _as_publish_error(exited(exc))

    async def _run_async(
        self,
        results: list[PublishError | None],
        index: int,
        message: Message,
    ) -> None:
        route = self.registry.route(message)
        try:
            if route is not None:
                # no inbox here: no connection; the attempt is the publish attempt
                await route.start(message, attempt=message.attempts + 1)
        except Exception as exc:  # noqa: BLE001 - a handler's failure is the message's
            results[index] = _as_publish_error(exc)
        except asyncio.CancelledError as exc:
            failure = cancelled_itself(exc)
            if failure is None:
                raise  # the relay is stopping
            results[index] = _as_publish_error(failure)
        except BaseException as exc:  # noqa: BLE001 - SystemExit, a handler's own, ...
            results[index] = _as_publish_error(exited(exc))


def _context(message: Message) -> HandlerContext:
    """No inbox here: no connection; the attempt is the publish attempt."""
    return HandlerContext(message=message, attempt=message.attempts + 1)
