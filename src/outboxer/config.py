"""Typed, frozen settings.

Nothing here reads the environment: the CLI maps ``OUTBOXER_*`` variables and options onto these
objects, and library users construct them directly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from outboxer.errors import ConfigurationError

__all__ = ["Backoff", "RelaySettings", "TableNames", "validate_identifier"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# PostgreSQL's identifier limit (NAMEDATALEN - 1 bytes). A longer name is not refused but
# silently truncated, so two derived names can collide or a LISTEN miss its NOTIFY.
MAX_IDENTIFIER = 63
# Every table, index and trigger of an outbox is named after its table; the longest derived
# name is "<table>_inbox_failures_dead" (20 more characters; tests/unit/test_table_names.py
# checks every name in the SQL files against this).
MAX_TABLE_NAME = MAX_IDENTIFIER - len("_inbox_failures_dead")


def validate_identifier(name: str, what: str = "identifier") -> str:
    """Return ``name`` if it is a plain SQL identifier, else raise ``ConfigurationError``.

    Table and schema names are the only values outboxer places into SQL text rather than
    passing as parameters, so they are restricted to ``[A-Za-z_][A-Za-z0-9_]*`` (max 63, the
    PostgreSQL limit): a hostile name is refused, never interpolated.
    """
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ConfigurationError(
            f"invalid {what} {name!r}: use letters, digits and underscores (max 63), "
            "not starting with a digit"
        )
    return name


@dataclass(frozen=True, slots=True)
class TableNames:
    """Where the outbox lives. Every other table is named after ``table``.

    Attributes:
        table: The outbox table (default ``outbox``).
        schema: PostgreSQL/MySQL schema; ``None`` means the connection's default.
    """

    table: str = "outbox"
    schema: str | None = None

    def __post_init__(self) -> None:
        # Checked where the name is accepted: a name whose derived names do not fit would let
        # `db upgrade` succeed and every later enqueue or relay fail.
        validate_identifier(self.table, "table name")
        if len(self.table) > MAX_TABLE_NAME:
            raise ConfigurationError(
                f"invalid table name {self.table!r}: at most {MAX_TABLE_NAME} characters, so "
                f"that the names derived from it (such as {self.table}_inbox_failures_dead) "
                f"fit PostgreSQL's {MAX_IDENTIFIER}"
            )
        if self.schema is not None:
            validate_identifier(self.schema, "schema name")
        if len(self.channel) > MAX_IDENTIFIER:  # (only with a schema: "public" is short)
            raise ConfigurationError(
                f"invalid schema and table names {self.schema!r}, {self.table!r}: together at "
                f"most {MAX_IDENTIFIER - len('outboxer..')} characters, so that the "
                f"notification channel {self.channel!r} fits PostgreSQL's {MAX_IDENTIFIER}"
            )

    def qualified(self, suffix: str = "", quote: str = '"') -> str:
        """The quoted, schema-qualified name of the outbox table or a sibling table."""
        name = f"{quote}{self.table}{suffix}{quote}"
        return f"{quote}{self.schema}{quote}.{name}" if self.schema else name

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel: one per outbox, so two outboxes never wake each other."""
        return f"outboxer.{self.schema or 'public'}.{self.table}"


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff: ``base``, ``base*factor``, ... capped at ``cap`` seconds."""

    base: float = 5.0
    factor: float = 2.0
    cap: float = 60.0

    def __post_init__(self) -> None:
        if self.base <= 0 or self.factor < 1 or self.cap < self.base:
            raise ConfigurationError(
                f"invalid backoff base={self.base} factor={self.factor} cap={self.cap}"
            )

    def delay(self, failures: int) -> float:
        """Delay after ``failures`` consecutive failures (1 → ``base``)."""
        return float(min(self.cap, self.base * self.factor ** max(0, failures - 1)))


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """How a relay claims, publishes and retries.

    Attributes:
        batch_size: Messages claimed per statement.
        max_in_flight_batches: Batches being published at once (the pipelining window); the
            duplicate bound after a crash is ``batch_size * max_in_flight_batches``.
        ordered: Per-key ordering (only the head of each key is claimable).
        max_attempts: Failed attempts after which a message is dead-lettered.
        lease_seconds: How long a claim is owned before another relay may take it over.
        retry: Per-message retry delays (attempt-based).
        outage: Relay-wide backoff while the broker is unavailable.
        poll_interval: Longest idle wait between claims when no notification arrives.
        min_poll_interval: First idle wait; doubles up to ``poll_interval``.
        heartbeat_interval: How often the relay refreshes its registry row and reaps leases.
        shutdown_timeout: On stop, how long in-flight batches may take before being released.
        sweep_interval: How often one of the relays sweeps (DESIGN: every minute).
        sweep_batch_size: Rows a sweep handles per kind (DESIGN: batches of 50).
        dead_letter_retention: Dead letters older than this many seconds are purged by the
            sweeper; 0 keeps them forever.
        hold_keys_after_dead_letter: Ordered mode: when a keyed message is dead-lettered, hold
            its key's later messages until an operator replays or purges it (default: the key
            continues with its next message).
        relay_id: Name of this instance; defaults to ``hostname:pid:random``.
        max_task_restarts: A background task (heartbeat, sweeper) that dies is restarted after
            the ``retry`` backoff; after this many deaths in a row the relay stops and raises
            ``RelayFailed`` (a bug that restarting does not cure must not run on silently).
    """

    batch_size: int = 500
    max_in_flight_batches: int = 4
    ordered: bool = True
    max_attempts: int = 3
    lease_seconds: float = 30.0
    retry: Backoff = field(default_factory=lambda: Backoff(base=1.0, factor=2.0, cap=300.0))
    outage: Backoff = field(default_factory=Backoff)
    poll_interval: float = 1.0
    min_poll_interval: float = 0.05
    heartbeat_interval: float = 5.0
    shutdown_timeout: float = 30.0
    sweep_interval: float = 60.0
    sweep_batch_size: int = 50
    dead_letter_retention: float = 30 * 86400.0
    hold_keys_after_dead_letter: bool = False
    relay_id: str | None = None
    max_task_restarts: int = 5

    def __post_init__(self) -> None:
        checks = {
            "batch_size": self.batch_size >= 1,
            "max_in_flight_batches": self.max_in_flight_batches >= 1,
            "max_attempts": self.max_attempts >= 1,
            "lease_seconds": self.lease_seconds > 0,
            "poll_interval": self.poll_interval > 0,
            "min_poll_interval": 0 < self.min_poll_interval <= self.poll_interval,
            "heartbeat_interval": 0 < self.heartbeat_interval < self.lease_seconds,
            "shutdown_timeout": self.shutdown_timeout >= 0,
            "sweep_interval": self.sweep_interval > 0,
            "sweep_batch_size": self.sweep_batch_size >= 1,
            "dead_letter_retention": self.dead_letter_retention >= 0,
            "max_task_restarts": self.max_task_restarts >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ConfigurationError(f"invalid relay setting {name}={getattr(self, name)!r}")
