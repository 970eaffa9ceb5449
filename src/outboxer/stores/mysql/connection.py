"""The connection seam of the MySQL/MariaDB store: the asyncmy pool, sessions, driver errors.

Every other module of the store runs its SQL through :class:`MysqlDatabase`, which owns the one
place where asyncmy exceptions become outboxer's (see the table below) and where a connection is
prepared for outboxer's SQL.

Sessions: UTC (``time_zone = '+00:00'``), ``READ COMMITTED`` (InnoDB's default, ``REPEATABLE
READ``, would lock gaps in claims and freeze snapshots in long transactions), and a fixed
``sql_mode`` (strict, and without ``NO_BACKSLASH_ESCAPES``, which the driver's escaping needs).
The ordered claim lowers its own transaction to ``READ UNCOMMITTED`` (docs/adr/0003).

Driver errors:

=========================================================  =========================
asyncmy error (MySQL code)                                 outboxer error
=========================================================  =========================
no connection: 2002, 2003, 2006, 2013, 1040, 1053, 1927;   ``StoreUnavailable``
``OSError``, ``TimeoutError``, a closed connection
deadlock victim 1213, lock wait timeout 1205               ``StoreUnavailable`` (InnoDB
                                                           rolled back: try again)
unknown table 1146, unknown column 1054                    ``SchemaError``
no privilege: 1044, 1142, 1143, 1227                       ``PermissionDenied``
wrong password 1045; unknown database 1049                 ``ConfigurationError``
a value the column refuses: 1366, 1406, 1264, 3140         ``ConfigurationError``
anything else                                              ``StoreError``
=========================================================  =========================

Ownership: a store built from a URL creates and closes its pool; a store handed an asyncmy pool
uses it and never closes it (its connections must be in autocommit mode, as asyncmy's are
unless told otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
from asyncio import CancelledError
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

import asyncmy
from asyncmy import errors as mysql_errors
from asyncmy.cursors import DictCursor

from outboxer.config import TableNames
from outboxer.errors import (
    ConfigurationError,
    PermissionDenied,
    SchemaError,
    StoreError,
    StoreUnavailable,
)
from outboxer.stores._common import PooledDatabase
from outboxer.urls import COMMAND_TIMEOUT, CONNECT_TIMEOUT, Option, ParsedUrl, UrlSpec, parse

__all__ = ["URL_SPEC", "Conn", "MysqlDatabase", "MysqlPart", "connect_options", "transaction_on"]

log = logging.getLogger("outboxer.store.mysql")
#: What operations receive: a connection borrowed from the pool.
Conn = asyncmy.Connection

URL_SPEC = UrlSpec(
    what="MySQL URL",
    schemes=("mysql", "mariadb"),
    default_port=3306,
    path="optional",
    options=(
        CONNECT_TIMEOUT,
        COMMAND_TIMEOUT,
        Option(
            "unix_socket",
            help="A Unix socket to connect through (mysql://app@/app?unix_socket=/run/mysqld/"
            "mysqld.sock): the host and port are then not used.",
        ),
        Option(
            "max_connections",
            "int",
            default=10,
            minimum=1,
            maximum=1000,
            help="size of the store's connection pool",
        ),
    ),
    example="mysql://user:password@127.0.0.1:3306/app",
)

#: Applied to every connection the store opens (see the module docstring).
_SESSION = (
    "SET time_zone = '+00:00', sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'; "
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
)

#: The command timeout of the statements run through this module's helpers (``execute``,
#: ``fetch_*``), set while a store's connection is borrowed. A server that stops answering (a
#: half-open connection after a failover, a hung server) would otherwise hold a statement until
#: the kernel gives up on the socket, ~15 min. Not asyncmy's ``read_timeout``: that wraps every
#: read in ``asyncio.wait_for``, which on Python 3.11 loses a cancellation that arrives with the
#: server's bytes (a stopping relay then waited a whole sweep interval); and it bounds each
#: read, where PostgreSQL's ``command_timeout`` bounds the statement, as this does.
_COMMAND_TIMEOUT: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "outboxer_mysql_command_timeout", default=None
)
_UNAVAILABLE_CODES = frozenset({1040, 1053, 1927, 2002, 2003, 2006, 2013, 2055})
_LOCK_CODES = frozenset({1205, 1213})
_SCHEMA_CODES = frozenset({1146, 1054})
_CONFIG_CODES = frozenset({1045, 1049})
#: access denied to a database, a table, a column; a privilege such as RELOAD missing
_PRIVILEGE_CODES = frozenset({1044, 1142, 1143, 1227})
_VALUE_CODES = frozenset({1264, 1366, 1406, 3140})


def connect_options(url: ParsedUrl) -> dict[str, Any]:
    """asyncmy ``connect``/``create_pool`` arguments for a parsed ``mysql://`` URL."""
    return {
        "host": url.host,
        "port": url.port or 3306,
        "user": url.username or "root",
        "password": url.password or "",
        "database": url.path or None,
        "connect_timeout": url.options["connect_timeout"],
        "unix_socket": url.options["unix_socket"],
        "charset": "utf8mb4",
        "autocommit": True,
        "init_command": _SESSION,
    }


_T = TypeVar("_T")
#: A transaction chosen as a deadlock victim is run again at once, this many times in all.
_DEADLOCK_ATTEMPTS = 3
_DEADLOCK = 1213


async def retried_on_deadlock(transaction: Callable[[], Awaitable[_T]]) -> _T:
    """``await transaction()``, run again at once when InnoDB chose it as a deadlock victim
    (it was rolled back whole, so nothing of it stays), rather than failing as an outage."""
    attempt = 1
    while True:
        try:
            return await transaction()
        except StoreUnavailable as exc:
            cause = exc.__cause__
            if cause is None or error_code(cause) != _DEADLOCK or attempt == _DEADLOCK_ATTEMPTS:
                raise
            attempt += 1


def error_code(exc: BaseException) -> int | None:
    """The MySQL error number of a driver exception (``None`` for other exceptions)."""
    if isinstance(exc, mysql_errors.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


def translate(exc: BaseException, names: TableNames) -> Exception | None:
    """The outboxer exception for a driver exception, or ``None`` if it is none of ours."""
    code = error_code(exc)
    if isinstance(exc, OSError | TimeoutError) or code in _UNAVAILABLE_CODES:
        return StoreUnavailable(f"MySQL unavailable: {exc}")
    if code in _LOCK_CODES:
        return StoreUnavailable(f"MySQL: {exc}")
    if code in _SCHEMA_CODES:
        return SchemaError(
            f"outbox table {names.qualified(quote='`')} is missing or outdated ({exc}): "
            "run 'outboxer db upgrade'"
        )
    if code in _PRIVILEGE_CODES:
        return PermissionDenied(f"MySQL: {exc}")
    if code in _CONFIG_CODES:
        return ConfigurationError(f"MySQL: {exc}")
    if code in _VALUE_CODES:
        # A value the column cannot store: the caller's input, not the database, is at fault.
        return ConfigurationError(f"invalid value: {exc}")
    if isinstance(exc, mysql_errors.InterfaceError):
        return StoreUnavailable(f"MySQL connection lost: {exc}")
    if isinstance(exc, mysql_errors.MySQLError):
        return StoreError(f"MySQL: {exc}")
    return None


class MysqlDatabase(PooledDatabase[asyncmy.Pool, Conn]):
    """The pool of one store, and the one place its driver errors are translated.

    Args:
        url_or_pool: A ``mysql://`` or ``mariadb://`` URL (the store creates and closes its
            pool) or an asyncmy pool (borrowed, never closed here).
        names: Table names; ``names.schema`` is a database name (default: the URL's).
    """

    store_name = "MysqlStore"

    def __init__(
        self,
        url_or_pool: str | asyncmy.Pool,
        names: TableNames,
        *,
        max_connections: int | None = None,
    ) -> None:
        self.names = names
        self._options: dict[str, Any] | None = None
        self._max_connections = 10
        self._pool: asyncmy.Pool | None = None
        #: Bounds each statement (a borrowed pool: none, as the application configured it).
        self.command_timeout: float | None = None
        if isinstance(url_or_pool, str):
            url = parse(url_or_pool, URL_SPEC)
            if not url.path and names.schema is None:
                raise ConfigurationError(
                    f"{URL_SPEC.what}: name the database, e.g. {URL_SPEC.example}"
                )
            self._options = connect_options(url)
            self._max_connections = max_connections or url.options["max_connections"]
            self.command_timeout = url.options["command_timeout"] or None
        else:
            self._pool = url_or_pool
        self._owns_pool = self._pool is None
        self.database = names.schema or (self._options or {}).get("database") or ""

    async def open(self) -> None:
        if self._pool is not None:
            if not self.database:
                async with self.connection() as conn:
                    self.database = str(await fetch_value(conn, "SELECT DATABASE()") or "")
            return
        assert self._options is not None
        timeout = self._options["connect_timeout"]
        with self.translated_errors():
            try:
                # asyncmy's connect_timeout bounds the TCP connect only: a server that accepts
                # the connection and never sends its greeting (a hung server, a proxy or load
                # balancer without a backend) would hold every command here forever.
                async with asyncio.timeout(timeout):
                    self._pool = await asyncmy.create_pool(
                        minsize=1, maxsize=self._max_connections, pool_recycle=3600, **self._options
                    )
            except TimeoutError:
                where = f"{self._options['host']}:{self._options['port']}"
                raise StoreUnavailable(
                    f"MySQL unavailable: no answer from {where} within {timeout:g} s "
                    "(connect_timeout)"
                ) from None

    async def close(self) -> None:
        if self._owns_pool and self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()
            try:
                async with asyncio.timeout(5):
                    await pool.wait_closed()
            except Exception:  # noqa: BLE001 - closing: what is still borrowed is cut
                pool.terminate()

    def lock_name(self, purpose: str, *, per_table: bool = True) -> str:
        """A server-wide ``GET_LOCK`` name for this outbox (or, without ``per_table``, for every
        outbox in its database): named locks are not per database and are at most 64
        characters, so the database and table are hashed into it."""
        owner = (f"{self.database}.{self.names.table}" if per_table else self.database).encode()
        return f"outboxer:{purpose}:{hashlib.sha1(owner, usedforsecurity=False).hexdigest()}"

    @contextlib.asynccontextmanager
    async def transaction(self, begin: str = "START TRANSACTION") -> AsyncIterator[Conn]:
        """A pooled connection inside a transaction, committed when the block ends.

        ``begin`` may set the transaction's isolation first (``SET TRANSACTION ...; START
        TRANSACTION``): one round trip. On an error the transaction is rolled back; a
        connection whose rollback fails is closed (and the pool discards a connection given
        back inside a transaction).
        """
        async with self.connection() as conn, transaction_on(conn, begin):
            yield conn

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        """A pooled connection in autocommit; the statements run on it through this module's
        helpers are bounded by the command timeout."""
        task = asyncio.current_task()
        cancels = task.cancelling() if task is not None else 0
        outer = _COMMAND_TIMEOUT.get()  # (set back, not reset: a generator holding the
        _COMMAND_TIMEOUT.set(self.command_timeout)  # connection may be closed in another context)
        try:
            async with super().connection() as conn:
                if task is not None and task.cancelling() > cancels:
                    # asyncmy opens a connection under asyncio.wait_for, which on Python 3.11
                    # returns it and drops a cancellation that arrived meanwhile (gh-86296).
                    raise CancelledError
                yield conn
        finally:
            _COMMAND_TIMEOUT.set(outer)

    @contextlib.asynccontextmanager
    async def unbounded_connection(self) -> AsyncIterator[Conn]:
        """A pooled connection whose statements have no command timeout, for schema migrations
        (an index built on a live table may take long)."""
        async with self.connection() as conn:
            _COMMAND_TIMEOUT.set(None)
            yield conn

    def acquire_timeout(self) -> float | None:
        # asyncmy's connect_timeout bounds the TCP connect only: a server (or a proxy) that
        # accepts and never sends its greeting held every new connection, so the relay froze
        # in silence and could not stop (a probe). Bounded when the pool will open one;
        # waiting for a busy connection to come back is bounded by that connection's work.
        pool = self.pool
        if pool.freesize == 0 and pool.size >= pool.maxsize:
            return None
        assert self._options is not None
        return float(self._options["connect_timeout"])

    def no_answer(self, *, statement: bool) -> StoreError | None:
        if not statement:  # no greeting from a new connection (acquire_timeout)
            assert self._options is not None
            return StoreUnavailable(
                f"MySQL unavailable: no answer from {self._options['host']}:"
                f"{self._options['port']} within {self._options['connect_timeout']:g} s "
                "(connect_timeout)"
            )
        if self.command_timeout is None:
            return None
        return StoreUnavailable(
            f"MySQL unavailable: no answer within {self.command_timeout:g} s (command_timeout)"
        )

    @contextlib.contextmanager
    def translated_errors(self) -> Iterator[None]:
        """Turn asyncmy's errors raised in the block into outboxer's (see the module table)."""
        try:
            yield
        except BaseException as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling() and not isinstance(exc, CancelledError):
                # asyncmy closes a connection whose statement was cancelled, and a cleanup
                # statement on it then fails: the cancellation is what happened.
                raise CancelledError from exc
            error = translate(exc, self.names)
            if error is None:
                raise
            raise error from exc


class MysqlPart:
    """What each part of the store (relay, sweeper, dead letters, schema, inbox) works on.

    Attributes:
        db: The connection seam.
        names: Table names.
        q: The named queries of ``sql/queries.sql``, rendered for ``names``.
    """

    db: MysqlDatabase
    names: TableNames
    q: Mapping[str, str]


@contextlib.asynccontextmanager
async def transaction_on(conn: Conn, begin: str = "START TRANSACTION") -> AsyncIterator[None]:
    """A transaction on a connection the caller holds (see :meth:`MysqlDatabase.transaction`)."""
    await execute(conn, begin)
    try:
        yield
    except BaseException:
        try:
            await execute(conn, "ROLLBACK")
        except Exception:  # noqa: BLE001 - the first error is the one to report
            conn.close()
        raise
    await execute(conn, "COMMIT")


async def execute(conn: Conn, sql: str, args: Mapping[str, Any] | None = None) -> int:
    """Run one statement; return the rows it changed."""
    async with asyncio.timeout(_COMMAND_TIMEOUT.get()), conn.cursor() as cur:
        return int(await cur.execute(sql, args))


async def fetch_all(
    conn: Conn, sql: str, args: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Rows of the last result of ``sql`` (which may be several statements) as dicts."""
    async with asyncio.timeout(_COMMAND_TIMEOUT.get()), conn.cursor(DictCursor) as cur:
        await cur.execute(sql, args)
        rows = list(await cur.fetchall())
        while await cur.nextset():
            rows = list(await cur.fetchall())
        return rows


async def fetch_one(
    conn: Conn, sql: str, args: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    rows = await fetch_all(conn, sql, args)
    return rows[0] if rows else None


async def fetch_value(conn: Conn, sql: str, args: Mapping[str, Any] | None = None) -> Any:
    async with asyncio.timeout(_COMMAND_TIMEOUT.get()), conn.cursor() as cur:
        await cur.execute(sql, args)
        row = await cur.fetchone()
        return row[0] if row else None


async def release_lock(conn: Conn, name: str) -> None:
    """``RELEASE_LOCK``, unless the connection is gone: a named lock dies with its connection."""
    with contextlib.suppress(mysql_errors.InterfaceError, mysql_errors.OperationalError):
        await fetch_value(conn, "SELECT RELEASE_LOCK(%(name)s)", {"name": name})
