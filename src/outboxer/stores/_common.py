"""What the SQL stores share: row mapping, cursors, filters, pages, the lifecycle, the inbox
session skeleton and purge loop. Nothing here talks to a driver."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import datetime as dt
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar

from outboxer import ports
from outboxer.config import LIVE_SECONDS
from outboxer.errors import (
    ConfigurationError,
    HandlerEndedTransaction,
    NotFound,
    SchemaError,
    StoreError,
    StoreUnavailable,
    error_summary,
)
from outboxer.message import Message
from outboxer.ports import (
    Claim,
    ConsumerFailures,
    DeadLetter,
    DeadLetterFilter,
    DeadLetterPage,
    InboxHandler,
    MessageFilter,
    MessagePage,
    OutboxMessage,
    OutboxStats,
    PendingFailure,
    RelayInfo,
    SweepReport,
    dead_letter_not_found,
)


class Row(Protocol):
    """A database row readable by column name (asyncpg Record, sqlite3.Row, dict)."""

    def __getitem__(self, key: str, /) -> Any: ...


def decode_headers(raw: str | bytes | Mapping[str, str] | None) -> Mapping[str, str]:
    if not raw or raw == "{}":
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    value = json.loads(raw)
    return value if isinstance(value, dict) else {}


def _envelope(row: Row) -> dict[str, Any]:
    """The envelope columns every stored message has (outbox row or dead letter)."""
    return {
        "id": row["id"],
        "topic": row["topic"],
        "key": row["key"],
        "type": row["type"],
        "payload": bytes(row["payload"]),
        "content_type": row["content_type"],
        "headers": decode_headers(row["headers"]),
        "created_at": to_datetime(row["created_at"]),
    }


def message_from_row(row: Row) -> Message:
    return Message(
        **_envelope(row),
        available_at=to_datetime(row["available_at"]),
        attempts=row["attempts"],
    )


def pending_failure_from_row(row: Row) -> PendingFailure:
    """A row of the ``inbox_failure_lock`` query (the failure's message, its consume attempts
    and whether the message was handled)."""
    return PendingFailure(
        seq=int(row["seq"]),
        message=message_from_row(row),
        attempts=int(row["consume_attempts"]),
        handled=bool(row["handled"]),
    )


def claim_from_rows(token: int, rows: Sequence[Row]) -> Claim:
    """A claim from the rows a claim statement returned (in any order).

    A row with ``lease_expiries`` is a suspect, which the claim statements return alone.
    """
    rows = sorted(rows, key=lambda r: r["seq"])  # RETURNING has no defined order: write order
    messages = [message_from_row(r) for r in rows]
    if len(rows) == 1 and rows[0]["lease_expiries"]:
        return Claim(token, messages, isolated=True, solo_deaths=rows[0]["solo_deaths"])
    return Claim(token, messages)


def dead_letter_from_row(row: Row) -> DeadLetter:
    return DeadLetter(
        **_envelope(row),
        dead_lettered_at=to_datetime(row["dead_lettered_at"]),
        failure_reason=row["failure_reason"],
        attempts=row["attempts"],
        direction=row["direction"],
    )


def outbox_message_from_row(row: Row) -> OutboxMessage:
    """A row of the ``list_messages`` query (outbox columns and the judged ``state``)."""
    in_flight = row["state"] == "in_flight"
    return OutboxMessage(
        **_envelope(row),
        next_attempt_at=to_datetime(row["available_at"]),
        attempts=row["attempts"],
        last_error=row["last_error"],
        state=row["state"],
        relay=row["locked_by"] if in_flight else None,
        lease_expires_at=to_datetime(row["locked_until"]) if in_flight else None,
    )


def message_query(
    template: str,
    flt: MessageFilter,
    message_id: str | None,
    limit: int,
    after: int | None,
    condition: Callable[[int, str], str],
    *,
    budget: int,
) -> tuple[str, list[tuple[str, Any]]]:
    """The ``list_messages`` query of a dialect for these filters, and its parameters in order.

    Only the filters given become conditions (``condition(position, column)`` writes one in the
    dialect's quoting and parameter style, e.g. ``AND o.key = $5``), so each combination gets a
    plan of its own: a key filter can walk the (key, seq) index. Column names come from here,
    values are always parameters: ``after``, ``limit``, ``state``, ``budget`` (the page's
    payload bytes, :data:`outboxer.ports.PAGE_PAYLOAD_BYTES`), then the equalities.
    """
    wanted = (("id", message_id), ("topic", flt.topic), ("key", flt.key), ("type", flt.type))
    equal = [(column, value) for column, value in wanted if value is not None]
    filters = " ".join(condition(n, column) for n, (column, _) in enumerate(equal, 5))
    params = [
        ("after", after or 0),
        ("limit", limit),
        ("state", flt.state),
        ("budget", budget),
        *equal,
    ]
    return template.replace("{filters}", filters), params


class MessageViews:
    """The :class:`~outboxer.ports.MessageReader` port of a SQL store, over the one query its
    dialect runs (``_message_rows``, built with :func:`message_query`)."""

    #: How the dialect writes a filter's condition: ``.format(position, column)``, e.g.
    #: ``AND o.key = $5`` (see :func:`message_query`).
    _CONDITION: ClassVar[str]

    async def _fetch_messages(self, sql: str, params: list[tuple[str, Any]]) -> Sequence[Row]:
        """Run the dialect's ``list_messages`` query with :func:`message_query`'s parameters."""
        raise NotImplementedError

    async def _message_rows(
        self,
        flt: MessageFilter,
        message_id: str | None,
        limit: int,
        after: int | None,
        budget: int,
    ) -> Sequence[Row]:
        """The rows of the dialect's ``list_messages`` query (see :func:`page_rows`)."""
        sql, params = message_query(
            self.q["list_messages"],  # type: ignore[attr-defined]
            flt,
            message_id,
            limit,
            after,
            self._CONDITION.format,
            budget=budget,
        )
        return await self._fetch_messages(sql, params)

    async def list_messages(
        self, flt: MessageFilter, *, limit: int, cursor: str | None
    ) -> MessagePage:
        limit = check_limit(limit)
        rows = await self._message_rows(
            flt, None, limit + 1, parse_cursor(cursor), ports.PAGE_PAYLOAD_BYTES
        )
        page, more = page_rows(rows, limit)
        next_cursor = str(page[-1]["seq"]) if more else None
        return MessagePage([outbox_message_from_row(r) for r in page], next_cursor)

    async def get_message(self, message_id: str) -> OutboxMessage:
        rows = await self._message_rows(
            MessageFilter(), message_id, 1, None, ports.PAGE_PAYLOAD_BYTES
        )
        if not rows:
            raise message_not_found(message_id)
        return outbox_message_from_row(rows[0])


def message_not_found(message_id: str) -> NotFound:
    return NotFound(
        f"no message with id {message_id!r} in the outbox "
        "(published, dead-lettered or never written)"
    )


def sweep_report(row: Row) -> SweepReport:
    return SweepReport(
        started_at=to_datetime(row["started_at"]),
        completed_at=to_datetime(row["completed_at"]),
        swept_by=row["swept_by"],
        publish_retries=row["publish_retries"],
        publish_failures=row["publish_failures"],
        consume_retries=row["consume_retries"],
        consume_failures=row["consume_failures"],
        purged=row["purged"],
    )


def outbox_stats(
    row: Row, relays: Sequence[Row], sweep: Row | None, failures: Sequence[Row]
) -> OutboxStats:
    """The figures from the rows of the ``stats``, ``live_relays``, ``last_sweep`` and
    ``consume_failures`` queries (counts may come back as another numeric type, times as epoch
    seconds: see :func:`to_datetime`)."""
    age = row["oldest_age"]
    return OutboxStats(
        pending=int(row["pending"]),
        in_flight=int(row["in_flight"]),
        dead_letters=int(row["dead_letters"]),
        oldest_pending_age_seconds=float(age) if age is not None else None,
        relays=[_relay_info(r) for r in relays],
        last_sweep=sweep_report(sweep) if sweep is not None else None,
        unowned_in_flight=int(row["unowned"]),
        scheduled=int(row["scheduled"]),
        behind_scheduled=int(row["behind_scheduled"]),
        consume_failures=tuple(
            sorted((_consumer_failures(r) for r in failures), key=lambda c: c.consumer)
        ),
    )


def _consumer_failures(row: Row) -> ConsumerFailures:
    return ConsumerFailures(
        consumer=row["consumer"],
        retrying=int(row["retrying"]),
        waiting=int(row["waiting"]),
        # max: a failure stored by a transaction that began just after this statement read
        # its clock (and committed before its snapshot) would be a few microseconds younger
        oldest_age_seconds=max(0.0, float(row["oldest_age"])),
    )


def _relay_info(row: Row) -> RelayInfo:
    return RelayInfo(
        relay_id=row["relay_id"],
        hostname=row["hostname"],
        pid=int(row["pid"]),
        started_at=to_datetime(row["started_at"]),
        heartbeat_at=to_datetime(row["heartbeat_at"]),
        in_flight=int(row["in_flight"]),
    )


def to_datetime(value: dt.datetime | float | int) -> dt.datetime:
    """SQLite stores epoch seconds; PostgreSQL returns aware datetimes.

    A float has no microseconds left near year 9999: ``datetime.max`` (an ``available_at``
    outboxer accepts) is stored as the first instant of year 10000, read back as the last of
    9999.
    """
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    seconds = float(value)
    if seconds >= _LATEST_SECONDS:
        return _LATEST
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


_LATEST = dt.datetime.max.replace(tzinfo=dt.UTC)
#: ``_LATEST`` as a float of Unix seconds: 253402300800.0, year 10000 to ``fromtimestamp``.
_LATEST_SECONDS = _LATEST.timestamp()


def parse_cursor(cursor: str | None) -> int | None:
    """Cursors are opaque to clients; here they are the last seen dead-letter sequence. An
    empty one is refused (as by the API): a script that lost its cursor (an unset variable)
    started again from the first page, exit 0 (a probe)."""
    if cursor is None:
        return None
    try:
        value = int(cursor)
    except ValueError:
        raise ConfigurationError(f"invalid cursor {cursor!r}") from None
    if not 0 <= value < 2**63:  # (a sequence number is a 64-bit integer in every database)
        raise ConfigurationError(f"invalid cursor {cursor!r}")
    return value


def check_limit(limit: int) -> int:
    if not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise ConfigurationError(f"invalid limit {limit!r}: must be between 1 and 1000")
    return limit


def page_rows(rows: Sequence[Row], limit: int) -> tuple[Sequence[Row], bool]:
    """The page in the rows of a list query, and whether there is a next page.

    The query returns up to ``limit + 1`` rows in page order, each with ``in_page``: true while
    the payloads before the row are under the budget (always for the first row). The rows past
    the page (one more than ``limit``, or the first one past the budget, returned without its
    payload) say there is a next page; nothing else does.
    """
    page = [r for r in rows[:limit] if r["in_page"]]
    return page, len(rows) > len(page)


def dead_letter_page(rows: Sequence[Row], limit: int) -> DeadLetterPage:
    """A page from the rows of a dialect's ``list_dead_letters`` query (newest first, see
    :func:`page_rows`)."""
    page, more = page_rows(rows, limit)
    next_cursor = str(page[-1]["dl_seq"]) if more else None
    return DeadLetterPage([dead_letter_from_row(r) for r in page], next_cursor)


def unique(ids: Iterable[str]) -> list[str]:
    """``ids`` once each, in order: a replay or purge that acted on both dead letters of an id
    (one publish, one consume) reports the id once."""
    return list(dict.fromkeys(ids))


class DeadLetterViews:
    """The reading half of a SQL store's :class:`~outboxer.ports.AdminStore` port (figures,
    dead letters listed and looked up), over the rows its dialect reads (``_stats_rows``,
    ``_dead_letter_rows``)."""

    async def _stats_rows(
        self, live_seconds: float
    ) -> tuple[Row, Sequence[Row], Row | None, Sequence[Row]]:
        """The rows of the ``stats``, ``live_relays``, ``last_sweep`` and ``consume_failures``
        queries (no rows of the last when the inbox's tables are not there)."""
        raise NotImplementedError

    async def _dead_letter_rows(
        self, flt: DeadLetterFilter, after: int | None, limit: int, budget: int
    ) -> Sequence[Row]:
        """Up to ``limit`` dead letters of the filter, newest first, older than ``after``,
        ending early once the payloads before a row reach ``budget`` bytes (the rows of the
        dialect's ``list_dead_letters`` query, see :func:`page_rows`)."""
        raise NotImplementedError

    async def _known_ids(self, query: str, ids: Sequence[str]) -> list[str]:
        """Those of ``ids`` (at most 1,000) that the dialect's ``query`` finds (the
        ``known_dead_letter_ids`` or ``known_message_ids`` of ``sql/queries.sql``)."""
        raise NotImplementedError

    async def stats(self, *, live_seconds: float = LIVE_SECONDS) -> OutboxStats:
        return outbox_stats(*await self._stats_rows(live_seconds))

    async def known_dead_letter_ids(self, ids: Sequence[str]) -> set[str]:
        return await self._known("known_dead_letter_ids", ids)

    async def known_message_ids(self, ids: Sequence[str]) -> set[str]:
        # Here, with the dead letters: what a replay left where it was (an id back in the outbox)
        return await self._known("known_message_ids", ids)

    async def _known(self, query: str, ids: Sequence[str]) -> set[str]:
        wanted = list(dict.fromkeys(ids))
        found: set[str] = set()
        for start in range(0, len(wanted), 1000):
            found.update(await self._known_ids(query, wanted[start : start + 1000]))
        return found

    async def list_dead_letters(
        self, flt: DeadLetterFilter, *, limit: int, cursor: str | None
    ) -> DeadLetterPage:
        limit = check_limit(limit)
        rows = await self._dead_letter_rows(
            flt, parse_cursor(cursor), limit + 1, ports.PAGE_PAYLOAD_BYTES
        )
        return dead_letter_page(rows, limit)

    async def get_dead_letter(
        self, dead_letter_id: str, direction: ports.Direction | None = None
    ) -> DeadLetter:
        flt, cursor = DeadLetterFilter(ids=[dead_letter_id]), None
        while True:  # at most two dead letters, newest first, one a page if they are large
            page = await self.list_dead_letters(flt, limit=2, cursor=cursor)
            for dead in page.items:
                if direction in (None, dead.direction):
                    return dead
            cursor = page.next_cursor
            if cursor is None:
                raise dead_letter_not_found(dead_letter_id, direction)


def check_schema_version(current: int, latest: int, table: str) -> None:
    """Raise ``SchemaError`` unless ``current`` is ``latest``; ``table`` names the outbox."""
    if current == 0:
        raise SchemaError(f"outbox table {table} is missing: run 'outboxer db upgrade'")
    if current != latest:
        raise SchemaError(
            f"outbox schema is at version {current}, this outboxer expects {latest}: "
            "run 'outboxer db upgrade' (or upgrade outboxer)"
        )


class _Openable(Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...


class _WithSeam(Protocol):
    @property
    def db(self) -> _Openable: ...

    async def open(self) -> None: ...

    async def close(self) -> None: ...


_S = TypeVar("_S", bound=_WithSeam)


class StoreLifecycle:
    """Mixin: ``open``/``close`` of the store's connection seam ``db``, and ``async with``."""

    async def __aenter__(self: _S) -> _S:
        await self.open()
        return self

    async def __aexit__(self: _WithSeam, *exc_info: object) -> None:
        await self.close()

    async def open(self: _WithSeam) -> None:
        await self.db.open()

    async def close(self: _WithSeam) -> None:
        await self.db.close()


class _Pool(Protocol):
    def acquire(self) -> contextlib.AbstractAsyncContextManager[Any]: ...


_P = TypeVar("_P", bound=_Pool)
_C = TypeVar("_C")


class PooledDatabase(abc.ABC, Generic[_P, _C]):
    """The part of a store's connection seam that is the same over any driver pool: the pool
    (created by the store or borrowed) and its connections, acquired inside the store's
    translation of driver errors. The store opens and closes the pool, and translates.

    Attributes:
        store_name: The store's class, named in the error of a store used before it is open.
    """

    store_name: ClassVar[str]
    _pool: _P | None

    @property
    def pool(self) -> _P:
        if self._pool is None:
            raise RuntimeError(f"{self.store_name} is not open (use 'async with store:')")
        return self._pool

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[_C]:
        """A pooled connection in autocommit (one statement, one round trip)."""
        acquired = False
        with self.translated_errors():
            try:
                async with contextlib.AsyncExitStack() as stack:
                    async with asyncio.timeout(self.acquire_timeout()):
                        conn = await stack.enter_async_context(self.pool.acquire())
                    acquired = True
                    try:
                        yield conn
                    except asyncio.CancelledError:
                        # mid-statement, perhaps: never handed on. Best effort: a connection
                        # the pool took back already (its close at a stop) has nothing to
                        # discard, and the cancel must go on (it became "store unavailable").
                        with contextlib.suppress(Exception):
                            self.discard(conn)
                        raise
            except TimeoutError as exc:
                # The driver's timeout says nothing (its text is empty): name the bound that
                # ran out, the connect timeout of a new connection or a statement's.
                error = self.no_answer(statement=acquired)
                if error is None:
                    raise
                raise error from exc

    def discard(self, conn: _C) -> None:
        """Close ``conn`` at once, before the pool takes it back (a cancelled block: a stop).
        The default leaves it to the pool's release."""

    def acquire_timeout(self) -> float | None:
        """How long taking a connection from the pool may take now (``None``: the driver's
        own bounds, enough where its connect timeout covers the whole handshake)."""
        return None

    def no_answer(self, *, statement: bool) -> StoreError | None:
        """The error of a driver timeout: the database did not answer within the connect
        timeout (``statement`` False: while a new connection was opened) or the command
        timeout of a statement. ``None``: the driver's error is translated as it is."""
        return None

    @abc.abstractmethod
    def translated_errors(self) -> contextlib.AbstractContextManager[None]:
        """Turn the driver's errors raised in the block into outboxer's."""


async def no_doorbell(timeout: float) -> bool:
    """``wait_for_messages`` of a store that has no doorbell (PostgreSQL since schema 6, SQLite):
    nothing to wait for but the time; the relay's adaptive polling finds new rows."""
    await asyncio.sleep(timeout)
    return False


async def wait_for_doorbell(doorbell: asyncio.Event, timeout: float) -> bool:
    """True (and the doorbell cleared) once it rang, False after ``timeout`` seconds."""
    try:
        async with asyncio.timeout(timeout):
            await doorbell.wait()
    except TimeoutError:
        return False
    doorbell.clear()
    return True


#: The sweep purges expired inbox rows this many at a time, for at most this many seconds.
INBOX_PURGE_BATCH = 5000
_INBOX_PURGE_SECONDS = 10.0


async def purge_inbox(
    purge_batch: Callable[[int], Awaitable[int]],
    forget_dead: Callable[[int], Awaitable[int]],
    log: logging.Logger,
) -> None:
    """The inbox's part of a sweep, run by whichever instance won it: expired inbox rows in
    batches (each its own short statement, for at most ten seconds), then the failure rows of
    purged consume dead letters. A failure is logged; the next sweep continues."""
    purged = forgotten = 0
    deadline = asyncio.get_running_loop().time() + _INBOX_PURGE_SECONDS
    try:
        while True:
            count = await purge_batch(INBOX_PURGE_BATCH)
            purged += count
            if count < INBOX_PURGE_BATCH or asyncio.get_running_loop().time() > deadline:
                break
        forgotten = await forget_dead(INBOX_PURGE_BATCH)
    except StoreError as exc:
        log.warning("inbox purge failed (the next sweep continues): %s", exc)
    if purged or forgotten:
        log.info(
            "sweep purged %d expired inbox rows and %d failure rows of purged dead letters",
            purged,
            forgotten,
        )


class Sweeping:
    """The sweeper's port (:class:`~outboxer.ports.SweeperStore`) of a SQL store: its dialect
    elects one instance and sweeps the outbox (``_sweep_outbox``); the instance that won then
    purges the inbox (:func:`purge_inbox`, over ``_purge_inbox_batch`` and
    ``_forget_dead_failures``).

    Attributes:
        sweep_log: Where the inbox part of the sweep reports (the dialect's store logger).
    """

    sweep_log: logging.Logger

    async def _sweep_outbox(
        self, *, sweeper: str, interval: float, retention_seconds: float, batch_size: int
    ) -> Row | None:
        """The persisted report's row if this instance won and ran the sweep, else ``None``."""
        raise NotImplementedError

    async def _last_sweep_row(self) -> Row | None:
        raise NotImplementedError

    async def _purge_inbox_batch(self, batch: int) -> int:
        """Delete up to ``batch`` expired inbox rows; how many were deleted."""
        raise NotImplementedError

    async def _forget_dead_failures(self, batch: int) -> int:
        """Delete up to ``batch`` failure rows of purged consume dead letters; how many."""
        raise NotImplementedError

    async def sweep(
        self, *, sweeper: str, interval: float, retention_seconds: float, batch_size: int
    ) -> SweepReport | None:
        row = await self._sweep_outbox(
            sweeper=sweeper,
            interval=interval,
            retention_seconds=retention_seconds,
            batch_size=batch_size,
        )
        if row is None:
            return None
        # This instance won the sweep: the inbox part follows.
        await purge_inbox(self._purge_inbox_batch, self._forget_dead_failures, self.sweep_log)
        return sweep_report(row)

    async def last_sweep(self) -> SweepReport | None:
        row = await self._last_sweep_row()
        return sweep_report(row) if row is not None else None


class _Connecting(Protocol):
    def connection(self) -> contextlib.AbstractAsyncContextManager[Any]: ...


_Session_co = TypeVar("_Session_co", bound="SqlInboxSession", covariant=True)


class _WithInboxSeam(Protocol[_Session_co]):
    @property
    def db(self) -> _Connecting: ...

    @property
    def q(self) -> Mapping[str, str]: ...

    @property
    def Session(self) -> type[_Session_co]: ...


class SqlInbox:
    """Mixin: the inbox port (:class:`~outboxer.ports.InboxStore`) of a SQL store, sessions of
    its dialect's ``Session`` (a :class:`SqlInboxSession`) each holding a connection of its
    seam ``db`` for a chunk of deliveries or a round of re-drives."""

    def inbox_session(
        self: _WithInboxSeam[_Session_co],
    ) -> contextlib.AbstractAsyncContextManager[_Session_co]:
        return self.Session.held(self.db.connection(), self.q)


def envelope_of(message: Message | DeadLetter) -> dict[str, Any]:
    """A message's envelope fields by name: what a stored copy of it keeps (a dead letter,
    an operator's view), and what a replayed dead letter is written again with."""
    return {
        "id": message.id,
        "topic": message.topic,
        "key": message.key,
        "type": message.type,
        "payload": message.payload,
        "content_type": message.content_type,
        "headers": message.headers,
        "created_at": message.created_at,
    }


#: The one savepoint name of the inbox: a handler runs inside it (see ``SqlInboxSession``).
HANDLER_SAVEPOINT = "outboxer_handler"


class SqlInboxSession(abc.ABC):
    """The inbox session of an SQL store (:class:`~outboxer.ports.InboxSession`), which is
    also the transaction it opens (:class:`~outboxer.ports.InboxTransaction`): one held
    connection, the transaction and the handler's savepoint written once here. A store adds
    its statements (``receive``, ``record_failure``, ...) and three driver calls; its
    statements go through :meth:`execute` and :meth:`fetch`.

    Savepoints cost a round trip each, so they are spent only on handlers that may write
    (``isolated``) and shared: after a handler succeeds, its savepoint is released and the
    next one opened in one round trip (``RELEASE`` also fails if the handler left the
    transaction aborted, which PostgreSQL would otherwise answer at ``COMMIT`` with a silent
    ``ROLLBACK``). That open savepoint is used by the next isolated handler only if no
    statement ran since, because rolling back to it must undo that handler's writes alone.
    Where the driver counts the statements a connection ran (:meth:`_statements`), a handler
    that took the context but ran none leaves the savepoint open and clean: no round trip.

    A handler that took the context may also end the transaction, which only the inbox may do:
    commit it (the chunk's inbox rows, all recorded by its first statement, would be committed
    with it, and the messages after it never handled), roll it back or close the connection.
    Right after such a handler, before any other statement, the driver's own view of the
    connection (:meth:`_in_transaction`, no round trip) tells, and ``run_handler`` raises
    :class:`~outboxer.errors.HandlerEndedTransaction` instead of sending statements that would
    fail as if the database were down (or, after a commit, run outside any transaction). One
    that then began a transaction of its own is found out by the next savepoint statement,
    which the database refuses for want of the savepoint (:meth:`_savepoint_missing`).
    """

    def __init__(self, connection: Any, queries: Mapping[str, str]) -> None:
        self.connection = connection
        self.q = queries
        self._savepoint_clean = False  # open, and nothing written since it was opened
        self._handler_statements = False  # a handler ran a statement (or may have)

    # -- the driver, per store ------------------------------------------------------------

    @abc.abstractmethod
    def _begin(self) -> contextlib.AbstractAsyncContextManager[object]:
        """Open a transaction on the connection; commit at the end, roll back on an error."""

    @abc.abstractmethod
    async def _run(self, sql: str, args: Any) -> None:
        """Run ``sql`` (several ``;``-separated statements when ``args`` is ``None``) in one
        round trip."""

    @abc.abstractmethod
    async def _rows(self, sql: str, args: Any) -> Sequence[Row]:
        """Run ``sql`` and return the rows of its (last) result."""

    def _statements(self) -> int | None:
        """How many statements the connection has run so far (any count that grows with every
        statement that may write), or ``None`` when the driver does not tell: then a handler
        that takes the context is assumed to have written."""
        return None

    def _in_transaction(self) -> bool | None:
        """Whether the connection is still inside the transaction the session opened, from
        what the driver already knows (the status of the server's last answer: no round trip,
        it runs after every handler that takes the context); ``False`` too once the client
        closed the connection. ``None`` when the driver cannot tell.

        A connection the database dropped must not read ``False`` while its handler may have
        run nothing on it: that is an outage (retried in place), not the handler's doing."""
        return None

    def _connection_closed(self) -> bool:
        """Whether the connection is closed (asked only once :meth:`_in_transaction` said
        ``False``). A handler that raised on a closed connection is taken for one whose
        statement failed because the database went away (drivers close the connection then):
        an outage, as before, rather than a handler that closed it."""
        return False

    # -- what the store's statements go through -------------------------------------------

    async def execute(self, sql: str, args: Any) -> None:
        self._savepoint_clean = False
        await self._run(sql, args)

    async def fetch(self, sql: str, args: Any) -> Sequence[Row]:
        self._savepoint_clean = False
        return await self._rows(sql, args)

    # -- the session and its transaction ---------------------------------------------------

    @classmethod
    @contextlib.asynccontextmanager
    async def held(
        cls, connecting: contextlib.AbstractAsyncContextManager[Any], queries: Mapping[str, str]
    ) -> AsyncIterator[Self]:
        """A session on the connection ``connecting`` yields, for as long as it is held."""
        async with connecting as connection:
            session = cls(connection, queries)
            yield session
            session._returning(untouched=not session._handler_statements)

    def _returning(self, *, untouched: bool) -> None:
        """The session ended without an error and goes back to the pool; ``untouched``: no
        handler ran a statement on it (known from :meth:`_statements`; a driver that cannot
        tell never says so), so its session state is what the inbox's own statements left."""
        return None

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Self]:
        ended: HandlerEndedTransaction | None = None
        try:
            async with self._begin():
                self._savepoint_clean = False
                try:
                    yield self
                except HandlerEndedTransaction as exc:
                    ended = exc
                    raise
        except Exception:
            if ended is None:
                raise
            # The driver's rollback of a transaction the handler ended may fail too (asyncpg on
            # a closed connection, SQLite with no transaction open): the handler's error is the
            # one to report.
            raise ended from None

    async def run_handler(
        self, handler: InboxHandler, message: Message, attempt: int, *, isolated: bool
    ) -> Exception | None:
        if not isolated:  # it cannot reach the connection: nothing to undo
            try:
                await handler(message, self.connection, attempt)
            except Exception as exc:  # noqa: BLE001 - the handler's failure is the message's
                return exc
            return None
        if not self._savepoint_clean:
            await self._run(f"SAVEPOINT {HANDLER_SAVEPOINT}", None)
        self._savepoint_clean = False
        before = self._statements()
        try:
            await handler(message, self.connection, attempt)
        except Exception as exc:
            self._handler_statements = True
            if self._in_transaction() is False and not self._connection_closed():
                if self._rolled_back_by_server(exc):
                    raise self._rolled_back(message, exc) from exc
                raise self._ended(message, closed=False) from exc
            return await self._undo(exc, message)
        # Before any other statement: one that ran outside the transaction could not be undone.
        if self._in_transaction() is False:
            raise self._ended(message, closed=self._connection_closed())
        if before is not None and self._statements() == before:
            # It ran no statement: the savepoint is still clean, the next handler's.
            self._savepoint_clean = True
            return None
        self._handler_statements = True
        try:
            await self._run(
                f"RELEASE SAVEPOINT {HANDLER_SAVEPOINT}; SAVEPOINT {HANDLER_SAVEPOINT}", None
            )
        except Exception as exc:  # it left the transaction aborted: its failure
            if self._savepoint_missing(exc):
                raise await self._began_anew(message) from exc
            return await self._undo(exc, message)
        self._savepoint_clean = True
        return None

    async def _undo(self, error: Exception, message: Message) -> Exception:
        """Roll the failed handler's writes back (to its savepoint); its ``error``."""
        try:
            await self._run(
                f"ROLLBACK TO SAVEPOINT {HANDLER_SAVEPOINT}; RELEASE SAVEPOINT {HANDLER_SAVEPOINT}",
                None,
            )
        except Exception as exc:
            if self._savepoint_missing(exc):
                if self._rolled_back_by_server(error):
                    raise self._rolled_back(message, error) from error
                raise await self._began_anew(message) from error
            raise
        return error

    def _rolled_back(self, message: Message, error: Exception) -> StoreUnavailable:
        """The database rolled the transaction back under the handler of ``message``, with
        ``error``: not the handler's doing. The chunk's transaction is gone (its inbox rows,
        the writes of the handlers before), and the chunk is stored again, whole."""
        return StoreUnavailable(
            f"the database rolled back the transaction under the handler of message "
            f"{message.id!r} ({error_summary(error)}); the chunk is stored again"
        )

    async def _began_anew(self, message: Message) -> HandlerEndedTransaction:
        """The handler's savepoint is gone although the connection is in a transaction: the
        handler ended the inbox's transaction (a commit, or a rollback) and began one of its
        own. That one is rolled back (what the handler wrote after its ``BEGIN``), so that
        the connection is where a handler that only committed leaves it."""
        await self._run("ROLLBACK", None)
        return self._ended(message, closed=False)

    def _savepoint_missing(self, error: Exception) -> bool:
        """Whether ``error`` is the database's "no such savepoint"."""
        return False

    def _rolled_back_by_server(self, error: BaseException) -> bool:
        """Whether ``error`` (or an error it was raised from) is the database rolling the whole
        transaction back by itself: InnoDB's deadlock victim. A handler raising it has not
        ended the transaction: the chunk is retried (it stopped the consumer as the handler's
        fault: a probe)."""
        return False

    def _ended(self, message: Message, *, closed: bool) -> HandlerEndedTransaction:
        return HandlerEndedTransaction(message.id, message.type, message.topic, closed=closed)

    async def forget_received(self, consumer: str, message_ids: Sequence[str]) -> None:
        """See :meth:`~outboxer.ports.InboxTransaction.forget_received`."""
        await self.execute(self.q["inbox_forget"], self._forget_args(consumer, message_ids))

    def _forget_args(self, consumer: str, message_ids: Sequence[str]) -> Any:
        """The parameters of the dialect's ``inbox_forget`` query."""
        raise NotImplementedError
