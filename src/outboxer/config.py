"""Typed, frozen settings.

Nothing here reads the environment: the CLI maps ``OUTBOXER_*`` variables and options onto these
objects, and library users construct them directly.

Each field of a settings class is declared once, with :func:`setting`: its default, a line of
help, its accepted range and (where it differs from the field name) its command-line name. The
class's ``__post_init__`` checks every field against that declaration (:func:`check_fields`:
finite numbers within range), and ``outboxer.cli.options`` generates the command's options,
``OUTBOXER_*`` variables and ``--help`` from it, so the CLI cannot drift from the library.
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from outboxer.errors import ConfigurationError

__all__ = [
    "AdminSettings",
    "Backoff",
    "RelaySettings",
    "Setting",
    "TableNames",
    "check_fields",
    "count",
    "duration",
    "setting",
    "validate_identifier",
]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# PostgreSQL's identifier limit (NAMEDATALEN - 1 bytes). A longer name is not refused but
# silently truncated, so two derived names can collide or a LISTEN miss its NOTIFY.
MAX_IDENTIFIER = 63
# MySQL's and MariaDB's identifier limit (64 characters): a longer name is refused, half-way
# through `db upgrade` (found by a probe: a table name of 42-43 characters).
MAX_MYSQL_IDENTIFIER = 64
# Every table, index and trigger of an outbox is named after its table; the longest derived
# names are "<table>_inbox_failures_dead" on PostgreSQL (20 more characters) and
# "<table>_inbox_failures_message" on MySQL (23; tests/unit/test_table_names.py checks every
# name in the SQL files against these).
MAX_TABLE_NAME = min(
    MAX_IDENTIFIER - len("_inbox_failures_dead"),
    MAX_MYSQL_IDENTIFIER - len("_inbox_failures_message"),
)


def validate_identifier(name: str, what: str = "identifier", longest: int = 63) -> str:
    """Return ``name`` if it is a plain SQL identifier, else raise ``ConfigurationError``.

    Table and schema names are the only values outboxer places into SQL text rather than
    passing as parameters, so they are restricted to ``[A-Za-z_][A-Za-z0-9_]*`` (max 63, the
    PostgreSQL limit; ``longest`` is the limit the error names, where the caller has a lower
    one): a hostile name is refused, never interpolated.
    """
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ConfigurationError(
            f"invalid {what} {name!r}: use letters, digits and underscores (max {longest}), "
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
        validate_identifier(self.table, "table name", MAX_TABLE_NAME)
        if len(self.table) > MAX_TABLE_NAME:
            raise ConfigurationError(
                f"invalid table name {self.table!r}: at most {MAX_TABLE_NAME} characters, so "
                f"that the names derived from it (such as {self.table}_inbox_failures_message) "
                f"fit PostgreSQL's {MAX_IDENTIFIER} and MySQL's {MAX_MYSQL_IDENTIFIER}"
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
        """The NOTIFY channel of schema versions 1-5 (whose first migration still creates the
        trigger that version 6 drops): one per outbox, so two outboxes never woke each other."""
        return f"outboxer.{self.schema or 'public'}.{self.table}"


#: Field metadata key under which :func:`setting` stores a field's :class:`Setting`.
SETTING = "outboxer.setting"

#: The longest duration a setting accepts (100 years, in seconds): far beyond any sane
#: retention, and far inside what a PostgreSQL ``interval`` or a ``timedelta`` can hold, so a
#: value such as ``1e300`` is refused at start instead of failing in the sweeper later.
MAX_SECONDS = 100 * 365.25 * 86400
DAY = 86400.0


@dataclass(frozen=True, slots=True)
class Setting:
    """How one settings field is documented, checked and offered on the command line.

    Attributes:
        help: One line for ``--help`` and docs/configuration.md.
        minimum: Smallest accepted number (``None``: no lower bound).
        maximum: Largest accepted number (``None``: no upper bound; every number must still be
            finite).
        above_minimum: ``minimum`` itself is refused (``> minimum`` rather than ``>=``).
        option: The command-line option when it is not ``--<field-name>`` (for nested settings
            such as a :class:`Backoff`: the prefix of its options, ``--retry`` →
            ``--retry-base``).
        env: The environment variable when it is not ``OUTBOXER_<OPTION>`` (nested: the prefix).
        negate: A boolean offered as the flag that turns it off (``ordered`` → ``--unordered``).
        secret: A credential: never shown as a default.
    """

    help: str
    minimum: float | None = None
    maximum: float | None = None
    above_minimum: bool = False
    option: str | None = None
    env: str | None = None
    negate: bool = False
    secret: bool = False

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is refused, or ``None``. Only numbers with a declared range are checked
        here (``None`` means "not set" and is left to the class)."""
        if value is None or (self.minimum is None and self.maximum is None):
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, not {value!r}"
        if not math.isfinite(value):
            return f"must be a finite number, not {value}"
        low_ok = self.minimum is None or (
            value > self.minimum if self.above_minimum else value >= self.minimum
        )
        if low_ok and (self.maximum is None or value <= self.maximum):
            return None
        return f"must be {self.range()}, not {value}"

    def range(self) -> str:
        """The accepted range in words, e.g. ``> 0 and ≤ 3600``."""
        parts = []
        if self.minimum is not None:
            parts.append(f"{'>' if self.above_minimum else '≥'} {_number(self.minimum)}")
        if self.maximum is not None:
            parts.append(f"≤ {_number(self.maximum)}")
        return " and ".join(parts)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def setting(
    default: Any = MISSING,
    *,
    help: str,  # noqa: A002 - the word every CLI library uses for it
    default_factory: Any = MISSING,
    minimum: float | None = None,
    maximum: float | None = None,
    above_minimum: bool = False,
    option: str | None = None,
    env: str | None = None,
    negate: bool = False,
    secret: bool = False,
) -> Any:
    """A dataclass field declared with its :class:`Setting` (see the module docstring)."""
    meta = Setting(help, minimum, maximum, above_minimum, option, env, negate, secret)
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata={SETTING: meta})
    return field(default=default, metadata={SETTING: meta})


def duration(default: float, *, maximum: float = DAY, zero: bool = False, **more: Any) -> Any:
    """A :func:`setting` in seconds: above 0 (from 0 with ``zero``) and at most ``maximum``."""
    return setting(default, minimum=0, above_minimum=not zero, maximum=maximum, **more)


def count(default: int, *, minimum: int = 1, maximum: int = 10_000, **more: Any) -> Any:
    """A whole-number :func:`setting` from ``minimum`` to ``maximum``."""
    return setting(default, minimum=minimum, maximum=maximum, **more)


def check_fields(settings: Any, what: str) -> None:
    """Check every declared field of the dataclass ``settings`` against its :class:`Setting`.

    Raises:
        ConfigurationError: ``invalid <what> setting <name>=<value>: <why>``.
    """
    for f in fields(settings):
        declared = f.metadata.get(SETTING)
        value = getattr(settings, f.name)
        problem = declared.problem(value) if declared is not None else None
        if problem is not None:
            raise ConfigurationError(f"invalid {what} setting {f.name}={value!r}: {problem}")


#: An ``allowed_hosts`` entry: ``*``, or a host name (a leading dot: the domain and its
#: subdomains), or an IP literal (the address the server listens on).
_ALLOWED_HOST = re.compile(
    r"\*|\.?[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*"
)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff: ``base``, ``base*factor``, ... capped at ``cap`` seconds."""

    base: float = duration(5.0, help="first delay (s)")
    factor: float = setting(2.0, help="growth per failure", minimum=1, maximum=100)
    cap: float = duration(60.0, help="longest delay (s)")

    def __post_init__(self) -> None:
        check_fields(self, "backoff")
        if self.cap < self.base:
            raise ConfigurationError(
                f"invalid backoff: cap {self.cap:g} s is below base {self.base:g} s"
            )

    def delay(self, failures: int) -> float:
        """Delay after ``failures`` consecutive failures (1 → ``base``), for any count.

        Past the exponent at which it reaches the cap the delay is the cap, without computing
        ``factor ** exponent``: 2.0 ** 1024 overflows (a broker down for some 17 hours at the
        default 60 s cap), and an int factor would grow an ever larger int.
        """
        base, factor, cap = float(self.base), float(self.factor), float(self.cap)
        exponent = max(0, failures - 1)
        if factor > 1 and exponent > math.log(cap / base, factor):
            return cap
        return min(cap, base * factor**exponent)


#: A relay is live (``stats``, ``/readyz``, the metrics) while its heartbeat is younger than
#: this; so a relay beats at least three times as often.
LIVE_SECONDS = 15.0


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
        poll_interval: Longest idle wait between claims: an idle relay sees a new message at
            most this late (there is no NOTIFY, see docs/adr/0007-polling-wakeup.md).
        min_poll_interval: The idle wait after a claim that found work; doubles while claims
            come back empty, up to ``poll_interval`` (and is at most that).
        heartbeat_interval: How often the relay refreshes its registry row and reaps leases;
            at most a third of ``lease_seconds``, so a short lease is renewed in time, and of
            :data:`LIVE_SECONDS`, so the relay is listed live between its heartbeats.
        shutdown_timeout: On stop, how long in-flight batches may take before being released.
        sweep_interval: How often one of the relays sweeps (every minute by default).
        sweep_batch_size: Rows a sweep handles per kind (50 by default).
        dead_letter_retention: Dead letters older than this many seconds are purged by the
            sweeper; 0 keeps them forever.
        hold_keys_after_dead_letter: Ordered mode: when a keyed message is dead-lettered, hold
            its key's later messages until an operator replays or purges it (default: the key
            continues with its next message).
        relay_id: Name of this instance; defaults to ``hostname:pid:random``.
        max_task_restarts: A background task (heartbeat, sweeper) that dies is restarted after
            the ``retry`` backoff; after this many deaths in a row the relay stops and raises
            ``RelayFailed`` (a bug that restarting does not cure must not run on silently).
        max_solo_deaths: Crash isolation: a message whose lease expired is published alone;
            after a relay died this many times holding it alone, it is dead-lettered instead
            (its publish kills the relay: a segfault, OOM or ``os._exit``).
    """

    batch_size: int = count(500, help="Messages claimed per statement.")
    max_in_flight_batches: int = count(
        4,
        help="Batches published at once (duplicates after a crash ≤ window × batch size).",
        option="--window",
        maximum=64,
    )
    ordered: bool = setting(
        True, help="Give up per-key ordering for throughput.", option="--unordered", negate=True
    )
    max_attempts: int = count(
        3, help="Failed attempts before a message is dead-lettered.", maximum=1000
    )
    lease_seconds: float = setting(
        30.0,
        help="How long a claim is owned before another relay may take it over (s).",
        # Shorter, a lease ran out while its own relay was publishing it, and messages were
        # dead-lettered as killers of the relays that took them back (a probe, 0.003 s).
        minimum=0.1,
        maximum=3600,
    )
    retry: Backoff = setting(
        default_factory=lambda: Backoff(base=1.0, factor=2.0, cap=300.0),
        help="Per-message retry delay, by attempts",
    )
    outage: Backoff = setting(
        default_factory=Backoff, help="Relay-wide pause while the broker is down, by failed rounds"
    )
    poll_interval: float = duration(
        0.05,
        help="Longest idle wait between claims: how late an idle relay sees a new message (s).",
        maximum=60,
    )
    min_poll_interval: float = duration(
        0.002,
        help="Idle wait after a claim that found work, doubling up to --poll-interval (s).",
        maximum=60,
    )
    heartbeat_interval: float = duration(
        5.0,
        help="How often the relay refreshes its registry row and reaps expired leases (s); "
        "at most a third of the lease, and 5 s.",
        maximum=3600,
    )
    shutdown_timeout: float = duration(
        30.0,
        help="On SIGTERM/SIGINT, how long in-flight batches may finish (s).",
        zero=True,
        maximum=3600,
    )
    sweep_interval: float = duration(60.0, help="How often one relay of all runs the sweep (s).")
    sweep_batch_size: int = count(50, help="Rows a sweep handles per kind.")
    dead_letter_retention: float = duration(
        30 * DAY,
        help="Seconds dead letters are kept before the sweeper purges them; 0 keeps them.",
        zero=True,
        maximum=MAX_SECONDS,
    )
    hold_keys_after_dead_letter: bool = setting(
        False,
        help="Ordered mode: keep a key's later messages back while its dead letter is unresolved.",
    )
    relay_id: str | None = setting(None, help="Instance name (default host:pid:random).")
    max_task_restarts: int = count(
        5,
        help="Deaths in a row of a background task (heartbeat, sweeper) before the relay stops.",
        minimum=0,
        maximum=1000,
    )
    max_solo_deaths: int = count(
        3,
        help="Relay deaths while publishing one message alone before it is dead-lettered.",
        maximum=1000,
    )

    def __post_init__(self) -> None:
        check_fields(self, "relay")
        if self.relay_id is not None:
            _check_relay_id(self.relay_id)
        # Derived, not refused: the first idle wait never exceeds the longest, and the heartbeat
        # renews and reaps well within a lease (a lease of 3 s beats every second).
        object.__setattr__(
            self, "min_poll_interval", min(self.min_poll_interval, self.poll_interval)
        )
        # It also stays within a third of LIVE_SECONDS: a relay beating less often vanished
        # from stats, /readyz and the metrics between its heartbeats (a probe).
        object.__setattr__(
            self,
            "heartbeat_interval",
            min(self.heartbeat_interval, self.lease_seconds / 3, LIVE_SECONDS / 3),
        )


#: Longest ``relay_id``: the MySQL/MariaDB registry and lease columns are ``VARCHAR(255)``.
MAX_RELAY_ID = 255


def _check_relay_id(relay_id: str) -> None:
    """Refuse a relay id a store could not keep. The relay writes it in its registry row and in
    every lease only once it runs: refused there, the heartbeat died and restarted in a loop
    (MariaDB: ``Data too long for column 'relay_id'``) and claims failed the same way."""
    problem = None
    if len(relay_id) > MAX_RELAY_ID:
        problem = f"must be at most {MAX_RELAY_ID} characters, not {len(relay_id)}"
    elif "\x00" in relay_id:
        problem = "must be free of NUL characters (PostgreSQL cannot store them in text)"
    elif not relay_id.isascii():
        try:
            relay_id.encode()
        except UnicodeEncodeError:
            problem = "must be valid Unicode (it holds a lone surrogate)"
    if problem is not None:
        shown = repr(relay_id[:40]) + ("…" if len(relay_id) > 40 else "")
        raise ConfigurationError(f"invalid relay setting relay_id={shown}: {problem}")


#: Largest admin request body (a bulk body of 1000 ids of 1000 characters fits).
MAX_BODY_BYTES = 1024 * 1024
#: Longest time the admin server waits for a request body (s).
BODY_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class AdminSettings:
    """How the admin app authorizes, whom it answers and how it judges readiness.

    Attributes:
        token: Bearer token required on every ``/api/`` request; ``None`` (or empty) leaves
            reads open and refuses replay/delete.
        ready_max_age: ``/readyz`` fails when the oldest outbox message is older (seconds).
        ready_min_relays: ``/readyz`` fails with fewer live relays (0 disables the check, for
            deployments where relays are watched elsewhere).
        stats_timeout: Longest wait for the database in ``/readyz`` and ``/metrics`` (seconds).
        allowed_hosts: Host names requests may be addressed to, besides IP literals (see
            :class:`~outboxer.admin.guards.HostCheck`); ``"*"`` accepts any.
        max_body_bytes: Largest request body accepted (413 above).
        body_timeout: Longest time to receive a request body (408 after), in seconds.
    """

    token: str | None = setting(
        None,
        help="Bearer token required on /api/; without it reads are open and replay/delete refused.",
        option="--admin-token",
        secret=True,
    )
    ready_max_age: float = duration(
        300.0,
        help="/readyz fails when the oldest pending message is older (s).",
        maximum=MAX_SECONDS,
    )
    ready_min_relays: int = count(
        1, help="/readyz fails with fewer live relays (0: do not check).", minimum=0
    )
    stats_timeout: float = duration(
        5.0, help="Longest wait for the database in /readyz and /metrics (s).", maximum=3600
    )
    allowed_hosts: frozenset[str] = setting(
        frozenset(),
        help="A name the server is reached by, besides this machine's names and IP addresses "
        "(requests to other Host names are refused against DNS rebinding); repeatable; "
        "'.example.com' for a domain, '*' for any.",
        option="--allowed-host",
        env="OUTBOXER_ALLOWED_HOSTS",
    )
    max_body_bytes: int = count(
        MAX_BODY_BYTES,
        help="Largest request body accepted (413 above).",
        minimum=0,
        maximum=1024**3,
    )
    body_timeout: float = duration(
        BODY_TIMEOUT,
        help="Longest time to receive a request body (408 after), in seconds.",
        maximum=3600,
    )

    def __post_init__(self) -> None:
        check_fields(self, "admin")
        for name in self.allowed_hosts:
            if not isinstance(name, str) or not _ALLOWED_HOST.fullmatch(name):
                raise ConfigurationError(
                    f"invalid admin setting allowed_hosts: {name!r} is not a host name (a name "
                    "such as 'admin.example.com', '.example.com' for a domain, '*' for any)"
                )
        # Refused rather than stripped: a token is a secret copied between systems, and the
        # client that holds it presumably has the same stray character, so stripping it here
        # would only move the mismatch. HTTP itself trims header values, so it could never match.
        if self.token is not None and self.token != self.token.strip():
            raise ConfigurationError(
                "the admin token starts or ends with whitespace, which no request can send "
                "(HTTP trims header values): remove it"
            )
        if self.token is not None and not all(" " <= ch <= "~" for ch in self.token):
            raise ConfigurationError(
                "the admin token has a control or non-ASCII character, which no request can "
                "send in a header: use printable ASCII (e.g. 'openssl rand -hex 32')"
            )
