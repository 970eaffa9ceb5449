"""The PostgreSQL store's connection seam: its URL, its pool, and error translation.

Every part of the store (relay, sweeper, dead letters, schema, inbox) reaches the database
through :meth:`PostgresDatabase.connection` or :meth:`PostgresDatabase.transaction`, where
asyncpg's errors become outboxer's, in this one place:

=====================================================  ======================================
asyncpg / OS error                                     outboxer error
=====================================================  ======================================
``UndefinedTableError``, ``InvalidSchemaNameError``    ``SchemaError`` (run ``db upgrade``)
``DataError``, ``CharacterNotInRepertoireError``       ``ConfigurationError`` (the input)
``InsufficientPrivilegeError``                         ``PermissionDenied``
connection lost / refused, timeouts (``_UNAVAILABLE``)  ``StoreUnavailable`` (retry later)
any other ``PostgresError``                            ``StoreError``
=====================================================  ======================================

Ownership: a store built from a URL creates and closes its pool; a store handed a pool uses it
and never closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, TypeAlias
from urllib.parse import quote, urlencode

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from outboxer import urls
from outboxer.config import TableNames
from outboxer.errors import (
    ConfigurationError,
    PermissionDenied,
    SchemaError,
    StoreError,
    StoreUnavailable,
    error_summary,
)
from outboxer.stores._common import PooledDatabase

__all__ = [
    "URL_SPEC",
    "Conn",
    "CountingConnection",
    "PlanWatch",
    "PostgresDatabase",
    "PostgresPart",
    "normalize_url",
    "skip_reset",
    "statement_counter",
    "statements_run",
]


class _OneLine(logging.Filter):
    """asyncpg's pool logs every failed attempt to restore its connection floor during an
    outage with a whole traceback (~40 lines, again at 1, 2, 4 ... 60 s): one line, naming the
    error, as outboxer's own outage lines (a probe)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            record.msg = f"{record.getMessage()}: {error_summary(record.exc_info[1])}"
            record.args, record.exc_info, record.exc_text = None, None, None
        return True


logging.getLogger("asyncpg.pool").addFilter(_OneLine())

#: What the store's parts work on: a connection borrowed from the pool.
Conn: TypeAlias = "PoolConnectionProxy[asyncpg.Record]"

#: ``postgresql://user:password@host[:port][,host2...]/database?option=value``. The options are
#: those of libpq that asyncpg understands and that users of a relay need; anything else is
#: refused (asyncpg would send an unknown option to the server as a setting, and fail later).
URL_SPEC = urls.UrlSpec(
    what="PostgreSQL URL",
    schemes=("postgresql", "postgres"),
    hosts="many",
    default_port=5432,
    path="optional",
    options=(
        urls.Option(
            "sslmode",
            choices=("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
            help="TLS to the server, as libpq's sslmode.",
        ),
        urls.Option("sslrootcert", help="CA certificate file (verify-ca, verify-full)."),
        urls.Option("sslcert", help="Client certificate file."),
        urls.Option("sslkey", help="Client key file."),
        urls.Option("application_name", help="Shown in pg_stat_activity."),
        urls.Option(
            "host",
            help="A Unix-socket directory to connect through, as libpq's host= "
            "(postgresql://app@/app?host=/var/run/postgresql).",
        ),
        urls.Option(
            "port",
            help="The port with a socket directory (host=): it names the socket file.",
        ),
        urls.Option(
            "target_session_attrs",
            choices=("any", "primary", "standby", "prefer-standby", "read-write", "read-only"),
            help="Which of several hosts to use.",
        ),
        urls.CONNECT_TIMEOUT,
        urls.COMMAND_TIMEOUT,
    ),
    example="postgresql://app@127.0.0.1:5432/app?sslmode=require",
)

#: Connection problems that mean "the database is not reachable right now".
_UNAVAILABLE = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    # the connection died under a running operation (e.g. a database restart)
    asyncpg.InternalClientError,
)


class CountingConnection(asyncpg.Connection):
    """The connections of a pool the store creates: they also count the ``COPY … FROM STDIN``
    they ran, which asyncpg's count of a connection's statements leaves out (see
    :func:`statements_run`), and can hold a transaction's ``BEGIN`` back until its holder sends
    it in front of its first statement (:meth:`defer_begin`)."""

    __slots__ = (
        "begin_deferred",
        "begin_pending",
        "closed_by_client",
        "copies_in",
        "prepared",
        "prepared_epoch",
        "reset_needed",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.copies_in = 0
        #: Whether the pool must reset the session state when the connection comes back.
        self.reset_needed = True
        self.begin_deferred = False
        #: A ``BEGIN`` held back: the holder owes it, in front of its first statement.
        self.begin_pending = False
        #: The names of the server-side prepared statements (``PREPARE``) made on it.
        self.prepared: set[str] = set()
        #: :attr:`PlanWatch.drops` when ``prepared`` was made: behind it, they are made again.
        self.prepared_epoch = PlanWatch.drops
        #: ``close()`` or ``terminate()`` was called: the client closed it (a connection the
        #: server dropped reads closed too, but is no one's doing).
        self.closed_by_client = False

    def defer_begin(self, deferred: bool = True) -> None:
        """Hold back the ``BEGIN`` that the next ``connection.transaction()`` sends: it is
        asyncpg's transaction all the same (a handler's ``transaction()`` nests in it as a
        savepoint), but the holder owes the ``BEGIN`` (``begin_pending``) and sends it in the
        round trip of its first statement; a ``COMMIT`` or ``ROLLBACK`` while it is still owed
        sends nothing. ``defer_begin(False)`` forgets both."""
        self.begin_deferred, self.begin_pending = deferred, False

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        if not args and (self.begin_deferred or self.begin_pending):
            if query == "BEGIN;" and self.begin_deferred:  # as asyncpg sends it
                self.begin_deferred, self.begin_pending = False, True
                return "BEGIN"
            if query in ("COMMIT;", "ROLLBACK;") and self.begin_pending:
                self.begin_pending = False  # the transaction never reached the server
                return query[:-1]
        return await super().execute(query, *args, timeout=timeout)

    async def close(self, *, timeout: float | None = None) -> None:
        self.closed_by_client = True
        await super().close(timeout=timeout)

    def terminate(self) -> None:
        self.closed_by_client = True
        super().terminate()

    async def copy_to_table(self, *args: Any, **kwargs: Any) -> str:
        self.copies_in += 1
        return await super().copy_to_table(*args, **kwargs)

    async def copy_records_to_table(self, *args: Any, **kwargs: Any) -> str:
        self.copies_in += 1
        return await super().copy_records_to_table(*args, **kwargs)


def statements_run(connection: object) -> int | None:
    """How many statements ``connection`` (a pool's proxy or a connection) has run, if it is a
    :class:`CountingConnection` (a borrowed pool's are not): every query path of asyncpg
    (``execute``, ``fetch*``, prepared statements, cursors, ``executemany``) counts in its
    protocol, ``COPY … FROM`` in the connection."""
    con = getattr(connection, "_con", connection)  # behind a pool's PoolConnectionProxy
    if not isinstance(con, CountingConnection):
        return None
    protocol = getattr(con, "_protocol", None)
    count = getattr(protocol, "queries_count", None)
    return None if count is None else count + con.copies_in


def statement_counter(connection: object) -> Callable[[], int] | None:
    """:func:`statements_run` for a connection held a while, resolved once: a function that
    counts, or ``None`` where :func:`statements_run` would say ``None`` (an inbox session asks
    twice per handler; resolving the proxy and the class each time cost ≈ 1.5 µs)."""
    con = getattr(connection, "_con", connection)
    if not isinstance(con, CountingConnection):
        return None
    protocol: Any = getattr(con, "_protocol", None)
    if getattr(protocol, "queries_count", None) is None:
        return None
    counting = con

    def count() -> int:
        return int(protocol.queries_count) + counting.copies_in

    return count


def skip_reset(connection: object) -> None:
    """Spare ``connection`` (a pool's proxy) the pool's reset round trip on its next release:
    only code that ran nothing able to change the session state (no ``SET``, ``LISTEN``,
    advisory lock, cursor left open) may call this. A no-op for a borrowed pool's connections."""
    con = getattr(connection, "_con", connection)
    if isinstance(con, CountingConnection):
        con.reset_needed = False


async def _reset(con: asyncpg.Connection) -> None:
    """The pool's reset on release (after asyncpg rolled back an open transaction): asyncpg's
    own reset query (advisory locks, cursors, ``LISTEN``, settings), unless the connection's
    last user made sure nothing needs it (:func:`skip_reset`)."""
    if isinstance(con, CountingConnection):
        con.defer_begin(False)
        if not con.reset_needed:
            con.reset_needed = True
            return
    query = con.get_reset_query()
    if query:
        await con.execute(query)


#: The URL's options that are arguments of the pool, not server settings.
_POOL_OPTIONS = frozenset({"connect_timeout", "command_timeout"})


def normalize_url(url: str) -> tuple[str, float, float | None]:
    """The DSN asyncpg is given for ``url``, the connect timeout and the command timeout
    (``None``: no limit).

    Accepts ``postgresql://``, ``postgres://`` and SQLAlchemy's ``postgresql+driver://``;
    checks the URL against :data:`URL_SPEC` first (one readable line, no password).
    """
    parsed = urls.parse(url, URL_SPEC)
    rest = url.split("://", 1)[1].partition("?")[0]
    passed = {name: parsed.options[name] for name in sorted(parsed.given - _POOL_OPTIONS)}
    query = f"?{urlencode(passed, quote_via=quote)}" if passed else ""
    command_timeout = float(parsed.options["command_timeout"]) or None
    return f"postgresql://{rest}{query}", float(parsed.options["connect_timeout"]), command_timeout


class PlanWatch:
    """Drops the pool's cached plans when a table they read has grown many times over.

    The store's connections keep one generic plan per statement (``plan_cache_mode`` in
    :data:`_SESSION`), made at its first execution on a connection and kept until a table it
    reads is analyzed or vacuumed (or asyncpg prepares it again, after 5 min). A plan made on an
    empty table (a vacuumed one has 0 pages: a sequential scan costs nothing) scans it
    sequentially, also once per row of another scan: the first ordered claims of 500 after a
    burst of 20,000-50,000 rows took 10-55 s instead of 20-35 ms (benchmarks.claim_stale_plan),
    a batch of 100 deliveries over 20,000 failure rows 0.5 s instead of 4 ms, one purge batch
    of the inbox 10 min instead of 38 ms (a probe, autovacuum off). :meth:`check` reads the
    tables' sizes (``query``: one row of ``pg_relation_size``) and when one has grown
    :data:`GROWTH` times over the smallest size seen since the plans were last dropped (and
    past 1 MB), drops every cached statement of the pool (asyncpg's ``reload_schema_state``;
    the server-side prepared statements of :attr:`CountingConnection.prepared` at their next
    use): they are planned again on the tables as they are. A plan made on a large table stays
    good on a small one, so a watch need not look while its tables are busy (docs/adr/0012).
    """

    #: Growth (times the smallest size seen) that drops the plans.
    GROWTH = 8
    #: 16 pages: below this, a table counts as this big.
    SMALL = 16 * 8192
    #: How many times a watch of this process dropped plans (see ``prepared_epoch``).
    drops = 0

    def __init__(self, query: str) -> None:
        self.query = query
        self._smallest: tuple[int, ...] | None = None
        self._read_at = float("-inf")

    async def check(self, conn: Conn, every: float = 0.0) -> None:
        """Read the sizes (at most every ``every`` seconds) and drop the plans if a table
        grew."""
        now = time.monotonic()
        if now < self._read_at + every:
            return
        self._read_at = now
        row = await conn.fetchrow(self.query)
        assert row is not None  # one row of sizes
        sizes = tuple(int(size) for size in row)
        seen = self._smallest
        if seen is not None and any(
            size >= self.GROWTH * max(small, self.SMALL)
            for size, small in zip(sizes, seen, strict=True)
        ):
            await conn.reload_schema_state()
            PlanWatch.drops += 1
            seen = None
        self._smallest = sizes if seen is None else tuple(map(min, seen, sizes))


#: The session settings of the store's connections. The claim's estimated cost on a deep
#: backlog passes jit_above_cost, and compiling it took 0.7 s of a 15 ms claim (EXPLAIN ANALYZE
#: on 1M rows): the store's short statements never gain from JIT. Generic plans: PostgreSQL
#: planned the ordered claim anew at every execution (its custom plans looked cheaper), 1.7 of
#: the 2.1 ms an empty claim took; the generic plan claims as fast on 20k-1M rows
#: (benchmarks.claim_blocked) and an idle or lightly loaded relay pays 0.45 ms. A generic plan
#: made on an empty table is dropped when the table grows: :class:`PlanWatch`.
_SESSION: dict[str, Any] = {
    "server_settings": {"jit": "off", "plan_cache_mode": "force_generic_plan"}
}


class PostgresDatabase(PooledDatabase[asyncpg.Pool, Conn]):
    """The pool of one store, and the one place its driver errors are translated.

    Args:
        dsn_or_pool: A ``postgresql://`` URL (a pool is created on :meth:`open` and closed on
            :meth:`close`) or an existing asyncpg pool (borrowed, never closed here).
        names: The outbox's table names (named in the ``SchemaError`` of a missing table).
        max_connections: Pool size when the pool is created here.
    """

    store_name = "PostgresStore"

    def __init__(
        self, dsn_or_pool: str | asyncpg.Pool, names: TableNames, *, max_connections: int = 10
    ) -> None:
        self.names = names
        self._dsn: str | None = None
        self._timeout = 10.0
        #: Bound of every statement on the pool created here (``None``: none, as a borrowed
        #: pool's, whose settings are its owner's).
        self.command_timeout: float | None = None
        self._pool: asyncpg.Pool | None = None
        if isinstance(dsn_or_pool, str):
            self._dsn, self._timeout, self.command_timeout = normalize_url(dsn_or_pool)
        else:
            self._pool = dsn_or_pool
        self._owns_pool = self._pool is None
        self._max_connections = max_connections

    async def open(self) -> None:
        if self._pool is not None:
            return
        assert self._dsn is not None
        try:
            self._pool = await asyncpg.create_pool(
                self._dsn,
                min_size=1,
                max_size=self._max_connections,
                timeout=self._timeout,
                # A database that stops answering (a half-open connection after a failover, a
                # hung server) would hold a statement until the kernel gives up on the socket,
                # ~15 min; asyncpg closes a connection whose statement timed out.
                command_timeout=self.command_timeout,
                connection_class=CountingConnection,
                **_SESSION,
                reset=_reset,
            )
        except TimeoutError as exc:  # its text is empty: the line said only "cannot connect:"
            raise StoreUnavailable(
                f"cannot connect to PostgreSQL: no answer within {self._timeout:g} s "
                "(connect_timeout)"
            ) from exc
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {_shown(exc)}") from exc
        except (
            asyncpg.InvalidCatalogNameError,
            asyncpg.InvalidAuthorizationSpecificationError,
        ) as exc:
            raise ConfigurationError(f"PostgreSQL: {_shown(exc)}") from exc

    def discard(self, conn: Conn) -> None:
        # asyncpg's release of a connection whose statement was cancelled waits for the
        # cancel request (a new connection: up to connect_timeout) and a reset (unbounded) on
        # a database that stopped answering: a relay's stop waited for them (a probe).
        conn.terminate()

    async def close(self) -> None:
        if self._owns_pool and self._pool is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._pool.close()
            self._pool = None

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Conn]:
        """A pooled connection inside a transaction, committed when the block ends."""
        async with self.connection() as conn, conn.transaction():
            yield conn

    @contextlib.asynccontextmanager
    async def unbounded_transaction(self) -> AsyncIterator[asyncpg.Connection | Conn]:
        """A transaction whose statements have no command timeout, for schema migrations (an
        index built on a live table may take long): a connection of its own, outside the
        pool, when the store created its pool with a timeout; a borrowed pool's otherwise."""
        if self.command_timeout is None or not self._owns_pool:
            async with self.transaction() as conn:
                yield conn
            return
        assert self._dsn is not None
        with self.translated_errors():
            conn = await asyncpg.connect(
                self._dsn, timeout=self._timeout, command_timeout=None, **_SESSION
            )
            try:
                async with conn.transaction():
                    yield conn
            finally:
                await conn.close(timeout=5)

    def no_answer(self, *, statement: bool) -> StoreError | None:
        if statement and self.command_timeout is None:
            return None  # (a borrowed pool's own timeout, or one passed to a call)
        timeout, name = (
            (self.command_timeout, "command_timeout")
            if statement
            else (
                self._timeout,
                "connect_timeout",
            )
        )
        return StoreUnavailable(f"PostgreSQL unavailable: no answer within {timeout:g} s ({name})")

    @contextlib.contextmanager
    def translated_errors(self) -> Iterator[None]:
        """Turn asyncpg's errors raised in the block into outboxer's (see the module table)."""
        try:
            yield
        except asyncpg.UndefinedTableError as exc:
            raise SchemaError(
                f"outbox table {self.names.qualified()} is missing: run 'outboxer db upgrade'"
            ) from exc
        except asyncpg.InvalidSchemaNameError as exc:
            raise SchemaError(f"{exc}: run 'outboxer db upgrade'") from exc
        except asyncpg.InsufficientPrivilegeError as exc:
            raise PermissionDenied(f"PostgreSQL: {exc}") from exc
        except (asyncpg.DataError, asyncpg.CharacterNotInRepertoireError) as exc:
            # A value PostgreSQL cannot store (NUL in text, an out-of-range number): the
            # caller's input, not the database, is at fault.
            raise ConfigurationError(f"invalid value: {exc}") from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(f"PostgreSQL: {exc}") from exc
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"PostgreSQL unavailable: {_shown(exc)}") from exc


def _shown(exc: BaseException) -> str:
    """A driver's message without any password it may quote from the DSN (its type's name
    when it has none, as a timeout's)."""
    return urls.redact(str(exc)) or type(exc).__name__


class PostgresPart:
    """What each part of the store (relay, sweeper, dead letters, schema, inbox) works on.

    Attributes:
        db: The connection seam.
        names: Table and schema names.
        q: The named queries of ``sql/queries.sql``, rendered for ``names``.
    """

    db: PostgresDatabase
    names: TableNames
    q: Mapping[str, str]

    @functools.cached_property
    def outbox_plans(self) -> PlanWatch:
        """The watch of the outbox's size: checked before a claim that follows a short one."""
        return PlanWatch(self.q["outbox_size"])

    @functools.cached_property
    def inbox_plans(self) -> PlanWatch:
        """The watch of the inbox's tables: checked before a chunk of deliveries (at most once
        a second) and before each purge batch."""
        return PlanWatch(self.q["inbox_sizes"])
