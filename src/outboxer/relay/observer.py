"""What a relay reports while it works: the seam for metrics, without a metrics library.

The relay calls a :class:`RelayObserver` at a handful of points (a claim, a publish call, an
outage, a heartbeat). The core defines only this Protocol and a no-op; the Prometheus
implementation lives in :mod:`outboxer.observability.metrics` (an adapter), so the relay never
imports a metrics client.

Every method is called on the relay's event loop and must return quickly without blocking or
awaiting: count, observe, set a gauge. Calls are per claim or per publish call, never per
message, so an observer costs a few microseconds per batch. An observer that raises does not
disturb the relay: :class:`GuardedObserver` logs the error (once per method) and carries on.

:data:`current_relay_id` holds the id of the relay whose task is running, for log records (the
JSON log formatter adds it as ``relay_id``): every task a relay starts inherits it.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Sequence
from typing import Literal, Protocol

from outboxer.message import Message
from outboxer.ports import RelayInfo

__all__ = [
    "GuardedObserver",
    "NoopObserver",
    "PublishOutcome",
    "RelayObserver",
    "current_relay_id",
]

log = logging.getLogger("outboxer.relay")

#: What became of one message in one publish call:
#:
#: - ``published``: the broker acknowledged it;
#: - ``retry``: it failed and will be tried again later (one attempt counted);
#: - ``dead_letter``: it failed for good (permanent failure, or ``max_attempts`` reached);
#: - ``broker_unavailable``: the broker was unreachable; handed back, no attempt counted.
PublishOutcome = Literal["published", "retry", "dead_letter", "broker_unavailable"]

#: The id of the relay running the current task (``None`` outside a relay).
current_relay_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "outboxer_relay_id", default=None
)


class RelayObserver(Protocol):
    """Receives what a :class:`~outboxer.relay.Relay` does; implement any subset by
    subclassing :class:`NoopObserver`."""

    def relay_started(self, info: RelayInfo) -> None:
        """The relay starts its loop."""

    def relay_stopped(self, info: RelayInfo) -> None:
        """The relay has stopped (in-flight batches settled or released)."""

    def heartbeat(self, ok: bool) -> None:
        """A heartbeat was written to the store (``ok``) or failed."""

    def claimed(self, count: int, seconds: float) -> None:
        """A claim statement returned ``count`` messages (possibly 0) after ``seconds``."""

    def in_flight(self, batches: int) -> None:
        """The number of batches being published changed to ``batches``."""

    def published(
        self, messages: Sequence[Message], outcomes: Sequence[PublishOutcome], seconds: float
    ) -> None:
        """One publish call returned: ``outcomes[i]`` is the fate of ``messages[i]``;
        ``seconds`` is how long the broker call took."""

    def outage(self, failures: int, pause: float) -> None:
        """The broker was unavailable for the ``failures``-th round in a row and claiming
        pauses ``pause`` seconds; ``failures == 0`` reports that the broker is back."""

    def store_unavailable(self, operation: str) -> None:
        """A store operation (``claim``, ``settle``, ``extend_lease``, ``heartbeat``, ``sweep``)
        failed."""


class NoopObserver:
    """An observer that does nothing: the relay's default, and a base class for partial ones."""

    def relay_started(self, info: RelayInfo) -> None:
        return None

    def relay_stopped(self, info: RelayInfo) -> None:
        return None

    def heartbeat(self, ok: bool) -> None:
        return None

    def claimed(self, count: int, seconds: float) -> None:
        return None

    def in_flight(self, batches: int) -> None:
        return None

    def published(
        self, messages: Sequence[Message], outcomes: Sequence[PublishOutcome], seconds: float
    ) -> None:
        return None

    def outage(self, failures: int, pause: float) -> None:
        return None

    def store_unavailable(self, operation: str) -> None:
        return None


class GuardedObserver:
    """Wraps an observer so that its failures are logged, never raised into the relay.

    A raising observer inside a delivery task would otherwise abandon the batch unsettled (its
    lease would expire and the messages be published again).
    """

    def __init__(self, inner: RelayObserver) -> None:
        self.inner = inner
        self._failed: set[str] = set()

    def _failure(self, method: str, exc: Exception) -> None:
        if method not in self._failed:  # once per method: a broken observer must not flood
            self._failed.add(method)
            log.error("relay observer %r failed in %s()", self.inner, method, exc_info=exc)

    def relay_started(self, info: RelayInfo) -> None:
        try:
            self.inner.relay_started(info)
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            self._failure("relay_started", exc)

    def relay_stopped(self, info: RelayInfo) -> None:
        try:
            self.inner.relay_stopped(info)
        except Exception as exc:  # noqa: BLE001
            self._failure("relay_stopped", exc)

    def heartbeat(self, ok: bool) -> None:
        try:
            self.inner.heartbeat(ok)
        except Exception as exc:  # noqa: BLE001
            self._failure("heartbeat", exc)

    def claimed(self, count: int, seconds: float) -> None:
        try:
            self.inner.claimed(count, seconds)
        except Exception as exc:  # noqa: BLE001
            self._failure("claimed", exc)

    def in_flight(self, batches: int) -> None:
        try:
            self.inner.in_flight(batches)
        except Exception as exc:  # noqa: BLE001
            self._failure("in_flight", exc)

    def published(
        self, messages: Sequence[Message], outcomes: Sequence[PublishOutcome], seconds: float
    ) -> None:
        try:
            self.inner.published(messages, outcomes, seconds)
        except Exception as exc:  # noqa: BLE001
            self._failure("published", exc)

    def outage(self, failures: int, pause: float) -> None:
        try:
            self.inner.outage(failures, pause)
        except Exception as exc:  # noqa: BLE001
            self._failure("outage", exc)

    def store_unavailable(self, operation: str) -> None:
        try:
            self.inner.store_unavailable(operation)
        except Exception as exc:  # noqa: BLE001
            self._failure("store_unavailable", exc)
