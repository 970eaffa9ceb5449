"""Log lines an operator can act on, for each failed publish, at a bounded rate.

A retry logs its message's id, key and type, the attempt ("attempt 2 of 3") and the reason; a
dead letter logs "moved to dead letter after N attempts" with the same fields. The ids are also
in the record's ``message_ids`` (the JSON log format prints it), so a log search finds them.

Cheap at full speed: one line per failed message costs nothing while failures are rare, but a
poisoned topic at 10,000 messages a second must not write 10,000 lines a second. So each relay
writes at most ``lines_per_second`` lines (default 20) in a second of its clock:

1. while the second's budget covers a batch, one line per failed message;
2. past it, one line per batch and kind (retries, dead letters) with the count, the first
   message's fields and reason, and up to 20 ids (all of them in ``message_ids``);
3. once the budget is spent, nothing, until the next line says how many failures went unlogged
   ("… not logged one by one"); ``outboxer messages list`` and ``outboxer dlq list`` show them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from outboxer.message import Message

__all__ = ["FailedPublish", "FailureLog"]

_SHOWN_IDS = 20


@dataclass(frozen=True, slots=True)
class FailedPublish:
    """One message whose publish failed: ``attempts`` counts this one; ``retry_in`` is the delay
    before the next attempt, ``None`` for a dead letter."""

    message: Message
    attempts: int
    reason: str
    retry_in: float | None = None


def _describe(failure: FailedPublish) -> str:
    m = failure.message
    return f"message {m.id} (key {m.key!r}, type {m.type!r})"


def _ids(failures: Sequence[FailedPublish]) -> str:
    ids = [f.message.id for f in failures[:_SHOWN_IDS]]
    more = len(failures) - len(ids)
    return ", ".join(ids) + (f" (+{more} more)" if more else "")


class FailureLog:
    """Writes the retry and dead-letter lines of one relay (see the module docstring).

    Args:
        log: The relay's logger.
        max_attempts: For "attempt n of max".
        clock: Seconds of a monotonic clock (the relay passes its event loop's).
        lines_per_second: The budget of lines in one second.
    """

    def __init__(
        self,
        log: logging.Logger,
        max_attempts: int,
        clock: Callable[[], float],
        lines_per_second: int = 20,
    ) -> None:
        self._log = log
        self._max_attempts = max_attempts
        self._clock = clock
        self._per_second = lines_per_second
        self._window_start = float("-inf")
        self._budget = 0
        self._unlogged_retries = 0
        self._unlogged_dead = 0

    def batch(self, failures: Sequence[FailedPublish]) -> None:
        """Log the failed messages of one publish call."""
        if not failures:
            return
        now = self._clock()
        if now - self._window_start >= 1.0:
            self._window_start, self._budget = now, self._per_second
            self.flush()
        retries = [f for f in failures if f.retry_in is not None]
        dead = [f for f in failures if f.retry_in is None]
        if len(failures) <= self._budget:
            self._budget -= len(failures)
            for failure in failures:
                self._one(failure)
        else:
            for kind in (retries, dead):
                if kind and self._budget > 0:
                    self._budget -= 1
                    self._summary(kind)
                elif kind is retries:
                    self._unlogged_retries += len(kind)
                else:
                    self._unlogged_dead += len(kind)

    def flush(self) -> None:
        """Say how many failures went unlogged since the budget ran out (and forget them)."""
        if self._unlogged_retries or self._unlogged_dead:
            self._log.warning(
                "%d publish retries and %d dead letters were not logged one by one (more than "
                "%d failure lines a second); see `outboxer messages list` and `outboxer dlq list`",
                self._unlogged_retries,
                self._unlogged_dead,
                self._per_second,
            )
            self._unlogged_retries = self._unlogged_dead = 0

    def _one(self, failure: FailedPublish) -> None:
        ids = {"message_ids": [failure.message.id]}
        if failure.retry_in is None:
            self._log.error(
                "%s moved to dead letter after %d attempts: %s",
                _describe(failure),
                failure.attempts,
                failure.reason,
                extra=ids,
            )
        else:
            self._log.warning(
                "%s failed, attempt %d of %d; retrying in %.1fs: %s",
                _describe(failure),
                failure.attempts,
                self._max_attempts,
                failure.retry_in,
                failure.reason,
                extra=ids,
            )

    def _summary(self, failures: Sequence[FailedPublish]) -> None:
        first = failures[0]
        ids = {"message_ids": [f.message.id for f in failures]}
        if first.retry_in is None:
            self._log.error(
                "%d messages moved to dead letter in one batch: %s; the first, %s, after %d "
                "attempts: %s",
                len(failures),
                _ids(failures),
                _describe(first),
                first.attempts,
                first.reason,
                extra=ids,
            )
        else:
            self._log.warning(
                "%d messages of one batch failed and will be retried: %s; the first, %s, "
                "attempt %d of %d: %s",
                len(failures),
                _ids(failures),
                _describe(first),
                first.attempts,
                self._max_attempts,
                first.reason,
                extra=ids,
            )
