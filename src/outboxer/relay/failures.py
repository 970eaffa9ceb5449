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

    def _text(self, failure: FailedPublish) -> tuple[int, str]:
        """The level and the line of one failed message."""
        if failure.retry_in is None:
            return logging.ERROR, (
                f"{_describe(failure)} moved to dead letter after {failure.attempts} attempts: "
                f"{failure.reason}"
            )
        return logging.WARNING, (
            f"{_describe(failure)} failed, attempt {failure.attempts} of {self._max_attempts}; "
            f"retrying in {failure.retry_in:.1f}s: {failure.reason}"
        )

    def _one(self, failure: FailedPublish) -> None:
        level, text = self._text(failure)
        self._log.log(level, "%s", text, extra={"message_ids": [failure.message.id]})

    def _summary(self, failures: Sequence[FailedPublish]) -> None:
        level, first = self._text(failures[0])
        dead = failures[0].retry_in is None
        self._log.log(
            level,
            "%d messages of one batch %s: %s; the first: %s",
            len(failures),
            "moved to dead letter" if dead else "failed and will be retried",
            _ids(failures),
            first,
            extra={"message_ids": [f.message.id for f in failures]},
        )
