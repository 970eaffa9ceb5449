"""PostgreSQL store, on asyncpg.

Claims use ``FOR UPDATE SKIP LOCKED`` so any number of relays claim disjoint batches; every settle
statement is fenced by the claim token; acknowledged rows are deleted in one statement per batch.
A statement-level trigger sends a NOTIFY at commit (the doorbell) and this store LISTENs on a
dedicated connection; polling remains the fallback.

Ownership: a store built from a URL creates and closes its pool; a store handed a pool uses it
and never closes it (while a relay waits it holds one of the pool's connections for LISTEN).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias, TypeVar

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from outboxer.config import TableNames
from outboxer.errors import (
    ConfigurationError,
    NotFound,
    SchemaError,
    StoreError,
    StoreUnavailable,
)
from outboxer.message import Message, encode_headers
from outboxer.ports import (
    Claim,
    ConsumeFailure,
    ConsumeOutcome,
    DeadLetter,
    DeadLetterFilter,
    DeadLetterPage,
    FailurePolicy,
    InboxHandler,
    MessageFilter,
    MessagePage,
    OutboxMessage,
    OutboxStats,
    RelayInfo,
    Settlement,
    SweepReport,
)
from outboxer.stores import _sql
from outboxer.stores._common import (
    check_limit,
    dead_letter_from_row,
    message_conditions,
    message_from_row,
    message_not_found,
    message_page,
    parse_cursor,
    sweep_report,
)
from outboxer.stores._inbox import InboxSteps

__all__ = ["PostgresStore"]

log = logging.getLogger("outboxer.store.postgres")
T = TypeVar("T")
#: What operations receive: a connection borrowed from the pool.
Conn: TypeAlias = "PoolConnectionProxy[asyncpg.Record]"

#: The sweep purges expired inbox rows this many at a time, for at most this many seconds.
_INBOX_PURGE_BATCH = 5000
_INBOX_PURGE_SECONDS = 10.0

#: Releases the savepoint of one message and opens the next one's, in one round trip.
_RENEW_SAVEPOINT = "RELEASE SAVEPOINT outboxer_message; SAVEPOINT outboxer_message"

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


def normalize_url(url: str) -> str:
    """Accept ``postgresql://``, ``postgres://`` and SQLAlchemy's ``postgresql+driver://``."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+")[0] not in ("postgresql", "postgres"):
        raise ConfigurationError(f"not a PostgreSQL URL: {scheme}://…")
    return f"postgresql://{rest}"


class PostgresStore(InboxSteps):
    """The outbox in PostgreSQL.

    Args:
        dsn_or_pool: A ``postgresql://`` URL (the store owns a pool it creates) or an existing
            asyncpg pool (borrowed, never closed here).
        names: Table and schema names.
        max_connections: Pool size when the store creates the pool.
    """

    dialect = "postgres"

    def __init__(
        self,
        dsn_or_pool: str | asyncpg.Pool,
        names: TableNames | None = None,
        *,
        max_connections: int = 10,
    ) -> None:
        self.names = names or TableNames()
        self._q = _sql.queries("postgres", self.names)
        self._dsn: str | None = None
        self._pool: asyncpg.Pool | None = None
        if isinstance(dsn_or_pool, str):
            self._dsn = normalize_url(dsn_or_pool)
        else:
            self._pool = dsn_or_pool
        self._owns_pool = self._pool is None
        self._max_connections = max_connections
        self._listener: Conn | None = None
        self._doorbell = asyncio.Event()

    # -- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> PostgresStore:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def open(self) -> None:
        if self._pool is None:
            assert self._dsn is not None
            try:
                self._pool = await asyncpg.create_pool(
                    self._dsn, min_size=1, max_size=self._max_connections, timeout=10
                )
            except _UNAVAILABLE as exc:
                raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc
            except asyncpg.InvalidCatalogNameError as exc:
                raise ConfigurationError(f"PostgreSQL: {exc}") from exc
            except asyncpg.InvalidAuthorizationSpecificationError as exc:
                raise ConfigurationError(f"PostgreSQL: {exc}") from exc

    async def close(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.remove_listener(self.names.channel, self._ring)
                await self.pool.release(self._listener, timeout=2)
            self._listener = None
        if self._owns_pool and self._pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pool.close(), 5)
            self._pool = None

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("PostgresStore is not open (use 'async with store:')")
        return self._pool

    async def _run(self, operation: Callable[[Conn], Awaitable[T]]) -> T:
        """Run ``operation`` on a pooled connection, translating driver errors."""
        try:
            async with self.pool.acquire() as conn:
                return await operation(conn)
        except asyncpg.UndefinedTableError as exc:
            raise SchemaError(
                f"outbox table {self.names.qualified()} is missing: run 'outboxer db upgrade'"
            ) from exc
        except asyncpg.InvalidSchemaNameError as exc:
            raise SchemaError(f"{exc}: run 'outboxer db upgrade'") from exc
        except (asyncpg.DataError, asyncpg.CharacterNotInRepertoireError) as exc:
            # A value PostgreSQL cannot store (NUL in text, an out-of-range number): the
            # caller's input, not the database, is at fault.
            raise ConfigurationError(f"invalid value: {exc}") from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(f"PostgreSQL: {exc}") from exc
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"PostgreSQL unavailable: {exc}") from exc

    # -- schema --------------------------------------------------------------------------------

    async def migrate(self, target: int | None = None) -> list[int]:
        """Create or upgrade the schema; returns the versions applied (empty when current).

        ``target`` stops at that version (tests of the upgrade path). Runs in one transaction
        under an advisory lock, so concurrent upgrades are safe and a failed upgrade leaves
        nothing behind.
        """

        async def upgrade(conn: Conn) -> list[int]:
            version_table = _sql.render("{schema_version}", self.names)
            applied: list[int] = []
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", self.names.channel)
                if self.names.schema:
                    await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.names.schema}"')
                await conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {version_table} ("
                    "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
                )
                current = await conn.fetchval(f"SELECT max(version) FROM {version_table}") or 0
                for migration in _sql.migrations("postgres"):
                    if migration.version <= current or (
                        target is not None and migration.version > target
                    ):
                        continue
                    for statement in _sql.split_statements(migration.sql):
                        await conn.execute(_sql.render(statement, self.names))
                    await conn.execute(
                        f"INSERT INTO {version_table} (version) VALUES ($1)", migration.version
                    )
                    applied.append(migration.version)
            return applied

        return await self._run(upgrade)

    async def schema_version(self) -> int:
        """The installed schema version, 0 when outboxer's tables do not exist."""

        async def read(conn: Conn) -> int:
            exists = await conn.fetchval(
                "SELECT to_regclass($1) IS NOT NULL", _sql.render("{schema_version}", self.names)
            )
            if not exists:
                return 0
            value = await conn.fetchval(
                _sql.render("SELECT max(version) FROM {schema_version}", self.names)
            )
            return int(value or 0)

        return await self._run(read)

    async def check_schema(self) -> None:
        """Raise ``SchemaError`` unless the schema is exactly at this version of outboxer."""
        latest = _sql.migrations("postgres")[-1].version
        current = await self.schema_version()
        if current == 0:
            raise SchemaError(
                f"outbox table {self.names.qualified()} is missing: run 'outboxer db upgrade'"
            )
        if current != latest:
            raise SchemaError(
                f"outbox schema is at version {current}, this outboxer expects {latest}: "
                "run 'outboxer db upgrade' (or upgrade outboxer)"
            )

    # -- relay ---------------------------------------------------------------------------------

    async def claim_batch(
        self,
        *,
        limit: int,
        lease_seconds: float,
        ordered: bool,
        relay_id: str,
        hold_dead_keys: bool = False,
    ) -> Claim:
        token = int.from_bytes(os.urandom(8), "big") >> 1  # positive bigint
        query = self._q["claim_ordered" if ordered else "claim_unordered"]

        args: tuple[Any, ...] = (limit, token, relay_id, float(lease_seconds))
        if ordered:
            args += (hold_dead_keys,)

        async def claim(conn: Conn) -> list[asyncpg.Record]:
            return list(await conn.fetch(query, *args))

        rows = await self._run(claim)
        # RETURNING has no defined order: restore write order for the publisher.
        rows.sort(key=lambda r: r["seq"])
        return Claim(token=token, messages=[message_from_row(r) for r in rows])

    async def settle(self, claim: Claim, settlement: Settlement) -> None:
        statements: list[tuple[str, tuple[Any, ...]]] = []
        if settlement.published:
            statements.append((self._q["ack"], (settlement.published, claim.token)))
        if settlement.retries:
            r = settlement.retries
            statements.append(
                (
                    self._q["retry"],
                    ([x.id for x in r], [x.delay for x in r], [x.reason for x in r], claim.token),
                )
            )
        if settlement.dead:
            ids, reasons = zip(*settlement.dead, strict=True)
            statements.append((self._q["dead_letter"], (list(ids), list(reasons), claim.token)))
        if settlement.released:
            statements.append((self._q["release"], (settlement.released, claim.token)))
        if not statements:
            return

        async def apply(conn: Conn) -> None:
            if len(statements) == 1:  # the common case: one statement, one round trip
                sql, args = statements[0]
                await conn.execute(sql, *args)
                return
            async with conn.transaction():
                for sql, args in statements:
                    await conn.execute(sql, *args)

        await self._run(apply)

    async def release_expired_leases(self) -> int:
        async def release(conn: Conn) -> int:
            return int(await conn.fetchval(self._q["release_expired"]))

        return await self._run(release)

    async def sweep(
        self, *, sweeper: str, interval: float, retention_seconds: float, batch_size: int
    ) -> SweepReport | None:
        async def sweep(conn: Conn) -> SweepReport | None:
            async with conn.transaction():
                lock = f"{self.names.channel}:sweep"
                if not await conn.fetchval(self._q["sweep_lock"], lock, float(interval)):
                    return None
                row = await conn.fetchrow(
                    self._q["sweep"], sweeper, float(retention_seconds), batch_size
                )
            return sweep_report(row) if row is not None else None

        report = await self._run(sweep)
        if report is not None:  # this instance won the sweep: the inbox part follows
            await self._sweep_inbox()
        return report

    async def last_sweep(self) -> SweepReport | None:
        async def read(conn: Conn) -> SweepReport | None:
            row = await conn.fetchrow(self._q["last_sweep"])
            return sweep_report(row) if row is not None else None

        return await self._run(read)

    async def wait_for_messages(self, timeout: float) -> bool:
        if not self._listening():
            await self._listen()
        try:
            await asyncio.wait_for(self._doorbell.wait(), timeout)
        except TimeoutError:
            return False
        self._doorbell.clear()
        return True

    def _listening(self) -> bool:
        if self._listener is None:
            return False
        try:
            return not self._listener.is_closed()
        except asyncpg.InterfaceError:  # the pool took the broken connection back (restart)
            return False

    async def _listen(self) -> None:
        """Hold one pooled connection for LISTEN; on failure polling carries on alone."""
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self.pool.release(self._listener, timeout=2)
        self._listener = None
        try:
            conn = await self.pool.acquire()
        except Exception as exc:  # noqa: BLE001 - polling is the documented fallback
            log.warning("LISTEN unavailable, polling only: %s", exc)
            return
        try:
            await conn.add_listener(self.names.channel, self._ring)
        except BaseException as exc:
            # Failed, or cancelled (the relay stops waiting whenever a batch finishes): the
            # connection goes back to the pool, or each database restart would eat one.
            with contextlib.suppress(Exception):
                await self.pool.release(conn, timeout=2)
            if not isinstance(exc, Exception):
                raise
            log.warning("LISTEN unavailable, polling only: %s", exc)
            return
        self._listener = conn

    def _ring(self, *_: object) -> None:
        self._doorbell.set()

    async def heartbeat(self, relay: RelayInfo) -> None:
        async def beat(conn: Conn) -> None:
            await conn.execute(
                self._q["heartbeat"], relay.relay_id, relay.hostname, relay.pid, relay.started_at
            )

        await self._run(beat)

    async def unregister(self, relay_id: str) -> None:
        async def remove(conn: Conn) -> None:
            await conn.execute(self._q["unregister"], relay_id)

        await self._run(remove)

    # -- operators -----------------------------------------------------------------------------

    async def stats(self, *, live_seconds: float = 15.0) -> OutboxStats:
        async def read(conn: Conn) -> OutboxStats:
            row = await conn.fetchrow(self._q["stats"], float(live_seconds))
            assert row is not None  # an aggregate query always returns one row
            relays = await conn.fetch(self._q["live_relays"], float(live_seconds))
            sweep = await conn.fetchrow(self._q["last_sweep"])
            return OutboxStats(
                pending=row["pending"],
                in_flight=row["in_flight"],
                dead_letters=row["dead_letters"],
                oldest_pending_age_seconds=row["oldest_age"],
                relays=[RelayInfo(**dict(r)) for r in relays],
                last_sweep=sweep_report(sweep) if sweep is not None else None,
                unowned_in_flight=row["unowned"],
            )

        return await self._run(read)

    def _filter_args(self, flt: DeadLetterFilter) -> tuple[Any, ...]:
        ids = list(flt.ids) if flt.ids is not None else None
        return (flt.topic, flt.type, flt.key, ids)

    async def list_dead_letters(
        self, flt: DeadLetterFilter, *, limit: int, cursor: str | None
    ) -> DeadLetterPage:
        limit = check_limit(limit)
        after = parse_cursor(cursor)

        async def read(conn: Conn) -> list[asyncpg.Record]:
            args = (*self._filter_args(flt), after, limit + 1)
            return list(await conn.fetch(self._q["list_dead_letters"], *args))

        rows = await self._run(read)
        more = len(rows) > limit
        rows = rows[:limit]
        next_cursor = str(rows[-1]["dl_seq"]) if more else None
        return DeadLetterPage([dead_letter_from_row(r) for r in rows], next_cursor)

    async def get_dead_letter(self, dead_letter_id: str) -> DeadLetter:
        page = await self.list_dead_letters(
            DeadLetterFilter(ids=[dead_letter_id]), limit=1, cursor=None
        )
        if not page.items:
            raise NotFound(f"no dead letter with id {dead_letter_id!r}")
        return page.items[0]

    async def _bulk(self, queries: Sequence[str], flt: DeadLetterFilter) -> list[str]:
        """Run ``queries`` in one transaction; the ids they return, in order."""

        async def run(conn: Conn) -> list[str]:
            ids: list[str] = []
            async with conn.transaction():
                for query in queries:
                    rows = await conn.fetch(self._q[query], *self._filter_args(flt))
                    ids.extend(r["id"] for r in rows)
            return ids

        return await self._run(run)

    async def replay_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        # Consume dead letters are re-driven to their consumer instead (see docs/inbox.md); both
        # kinds in one transaction, so a replay is all or nothing.
        return await self._bulk(("replay_dead_letters", "replay_consume_dead_letters"), flt)

    async def purge_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        return await self._bulk(("purge_dead_letters",), flt)

    # -- messages not yet published (operators, read-only) ---------------------------------------

    async def list_messages(
        self, flt: MessageFilter, *, limit: int, cursor: str | None
    ) -> MessagePage:
        limit = check_limit(limit)
        rows = await self._message_rows(flt, None, limit + 1, parse_cursor(cursor))
        return message_page(rows, limit)

    async def get_message(self, message_id: str) -> OutboxMessage:
        page = message_page(await self._message_rows(MessageFilter(), message_id, 1, None), 1)
        if not page.items:
            raise message_not_found(message_id)
        return page.items[0]

    async def _message_rows(
        self, flt: MessageFilter, message_id: str | None, limit: int, after: int | None
    ) -> list[asyncpg.Record]:
        equal = message_conditions(flt, message_id)
        filters = " ".join(f"AND o.{column} = ${n}" for n, (column, _) in enumerate(equal, 4))
        sql = self._q["list_messages"].replace("{filters}", filters)
        args = (after or 0, limit, flt.state, *(value for _, value in equal))

        async def read(conn: Conn) -> list[asyncpg.Record]:
            return list(await conn.fetch(sql, *args))

        return await self._run(read)

    async def execute(self, sql: str, *args: Any) -> Sequence[asyncpg.Record]:
        """Run SQL with the outbox placeholders rendered (tests and benchmarks)."""

        async def run(conn: Conn) -> Sequence[asyncpg.Record]:
            return list(await conn.fetch(_sql.render(sql, self.names), *args))

        return await self._run(run)

    # -- inbox (consumers) ---------------------------------------------------------------------

    async def consume(
        self,
        consumer: str,
        messages: Sequence[Message],
        handler: InboxHandler,
        *,
        on_failure: FailurePolicy,
        retention_seconds: float,
        single_transaction: bool = False,
    ) -> list[ConsumeOutcome]:
        """Run ``handler`` once per (consumer, message id), in order, on one pooled connection
        that the handler gets (see :class:`~outboxer.ports.InboxStore`): each message in its
        own transaction with its inbox row, or all of them in one (``single_transaction``)."""
        retention = float(retention_seconds)

        async def run(conn: Conn) -> list[ConsumeOutcome]:
            if single_transaction:
                async with conn.transaction():
                    return await self._consume_in_one_transaction(
                        conn, consumer, messages, handler, on_failure, retention
                    )
            return [
                await self._consume_one(conn, consumer, message, handler, on_failure, retention)
                for message in messages
            ]

        return await self._run(run)

    async def _consume_in_one_transaction(
        self,
        conn: Conn,
        consumer: str,
        messages: Sequence[Message],
        handler: InboxHandler,
        on_failure: FailurePolicy,
        retention: float,
    ) -> list[ConsumeOutcome]:
        """All messages in the caller's transaction, two round trips per handled message.

        A savepoint is open before each message's inbox insert; after the handler it is
        released and the next one opened in one simple-protocol round trip (RELEASE also fails
        if the handler left the transaction aborted). A failing handler is rolled back to the
        savepoint, which undoes its inbox row too, so the failure path inserts the row again.
        """
        outcomes: list[ConsumeOutcome] = []
        await conn.execute("SAVEPOINT outboxer_message")
        for message in messages:
            row = await conn.fetchrow(
                self._q["inbox_receive"], consumer, message.id, message.key, retention
            )
            assert row is not None  # a SELECT of two expressions always returns a row
            if not row["fresh"]:
                outcomes.append("duplicate")
                continue
            if row["blocked"]:
                reason = f"waiting behind an earlier failed message of key {message.key!r}"
                await self._insert_consume_failure(
                    conn, consumer, message, 0, ConsumeFailure(reason, 0.0)
                )
                await conn.execute(_RENEW_SAVEPOINT)
                outcomes.append("waiting")
                continue
            try:
                await handler(message, conn, 1)
                await conn.execute(_RENEW_SAVEPOINT)
            except Exception as exc:  # noqa: BLE001 - the handler's failure is the message's
                await conn.execute("ROLLBACK TO SAVEPOINT outboxer_message")
                outcomes.append(
                    await self._record_first_failure(
                        conn, consumer, message, on_failure(message, 1, exc), retention
                    )
                )
                await conn.execute(_RENEW_SAVEPOINT)
                continue
            outcomes.append("handled")
        return outcomes

    async def _record_first_failure(
        self,
        conn: Conn,
        consumer: str,
        message: Message,
        failure: ConsumeFailure,
        retention: float,
    ) -> ConsumeOutcome:
        # The inbox row was rolled back with the handler: insert it again, with no expiry while
        # a retry is pending. If it exists (another instance handled the message meanwhile), the
        # message is done: nothing to record.
        expiry = None if failure.retry_in is not None else retention
        if not await conn.fetchval(self._q["inbox_insert_again"], consumer, message.id, expiry):
            return "duplicate"
        await self._insert_consume_failure(conn, consumer, message, 1, failure)
        if failure.retry_in is None:
            await self._dead_letter_consumed(conn, message, 1, failure.reason)
            return "dead"
        return "retrying"

    async def _consume_one(
        self,
        conn: Conn,
        consumer: str,
        message: Message,
        handler: InboxHandler,
        on_failure: FailurePolicy,
        retention: float,
    ) -> ConsumeOutcome:
        async with conn.transaction():
            row = await conn.fetchrow(
                self._q["inbox_receive"], consumer, message.id, message.key, retention
            )
            assert row is not None  # a SELECT of two expressions always returns a row
            if not row["fresh"]:
                return "duplicate"
            return await self._handle_fresh_delivery(
                conn,
                consumer,
                message,
                blocked=row["blocked"],
                handler=handler,
                on_failure=on_failure,
            )

    async def _set_retrying(self, conn: Conn, consumer: str, message_id: str) -> None:
        await conn.execute(self._q["inbox_set_retrying"], consumer, message_id)

    async def redrive_consume_failures(
        self,
        consumer: str,
        handler: InboxHandler,
        *,
        on_failure: FailurePolicy,
        retention_seconds: float,
        limit: int,
    ) -> list[ConsumeOutcome]:
        """Re-drive due failed consumptions of ``consumer``, one transaction each."""

        async def due(conn: Conn) -> list[str]:
            return [
                r["message_id"] for r in await conn.fetch(self._q["inbox_due"], consumer, limit)
            ]

        outcomes: list[ConsumeOutcome] = []
        for message_id in await self._run(due):

            async def redrive(conn: Conn, message_id: str = message_id) -> ConsumeOutcome | None:
                return await self._redrive_one(
                    conn, consumer, message_id, handler, on_failure, float(retention_seconds)
                )

            outcome = await self._run(redrive)
            if outcome is not None:
                outcomes.append(outcome)
        attempts = sum(outcome != "duplicate" for outcome in outcomes)
        if attempts:

            async def count(conn: Conn) -> None:
                await conn.execute(self._q["inbox_count_retries"], attempts)

            await self._run(count)
        return outcomes

    async def _redrive_one(
        self,
        conn: Conn,
        consumer: str,
        message_id: str,
        handler: InboxHandler,
        on_failure: FailurePolicy,
        retention: float,
    ) -> ConsumeOutcome | None:
        async with conn.transaction():
            # The row lock is the re-drive's ownership: held until this transaction ends.
            row = await conn.fetchrow(self._q["inbox_failure_lock"], consumer, message_id)
            if row is None:  # taken by another instance, or no longer due
                return None
            seq = row["seq"]
            if row["handled"]:
                await conn.execute(self._q["inbox_failure_delete"], seq)
                return "duplicate"
            message = message_from_row(row)
            attempt = row["consume_attempts"] + 1
            error = await self._run_handler_in_savepoint(conn, handler, message, attempt)
            if error is None:
                await conn.execute(self._q["inbox_failure_delete"], seq)
                await conn.execute(self._q["inbox_set_done"], consumer, message_id, retention)
                return "handled"
            failure = on_failure(message, attempt, error)
            if failure.retry_in is None:
                await conn.execute(self._q["inbox_failure_dead"], seq, attempt, failure.reason)
                await conn.execute(self._q["inbox_set_done"], consumer, message_id, retention)
                await self._dead_letter_consumed(conn, message, attempt, failure.reason)
                return "dead"
            await conn.execute(
                self._q["inbox_failure_retry"],
                seq,
                attempt,
                float(failure.retry_in),
                failure.reason,
            )
            return "retrying"

    async def _run_handler_in_savepoint(
        self, conn: Conn, handler: InboxHandler, message: Message, attempt: int
    ) -> Exception | None:
        """Run the handler inside a savepoint; return its exception after undoing its writes.

        The savepoint is released explicitly: if the handler swallowed a database error, the
        transaction is aborted and RELEASE fails, which turns into a handler failure here.
        Without it the final COMMIT would silently roll back (PostgreSQL answers COMMIT in an
        aborted transaction with ROLLBACK, no error) and the message would be acknowledged
        with no effect and no inbox row.
        """
        await conn.execute("SAVEPOINT outboxer_handler")
        try:
            await handler(message, conn, attempt)
            await conn.execute("RELEASE SAVEPOINT outboxer_handler")
        except Exception as exc:  # noqa: BLE001 - the handler's failure is the message's
            await conn.execute("ROLLBACK TO SAVEPOINT outboxer_handler")
            return exc
        return None

    async def _insert_consume_failure(
        self, conn: Conn, consumer: str, message: Message, attempts: int, failure: ConsumeFailure
    ) -> None:
        await conn.execute(
            self._q["inbox_failure_insert"],
            consumer,
            message.id,
            message.topic,
            message.key,
            message.type,
            message.payload,
            message.content_type,
            encode_headers(message.headers),
            message.created_at,
            attempts,
            float(failure.retry_in or 0.0),
            failure.reason,
            "dead" if failure.retry_in is None else "retrying",
        )

    async def _dead_letter_consumed(
        self, conn: Conn, message: Message, attempts: int, reason: str
    ) -> None:
        await conn.execute(
            self._q["inbox_dead_letter"],
            message.id,
            message.topic,
            message.key,
            message.type,
            message.payload,
            message.content_type,
            encode_headers(message.headers),
            message.created_at,
            reason,
            attempts,
        )

    async def _sweep_inbox(self) -> None:
        """Purge expired inbox rows in batches (bounded in time) and forget the failure rows of
        purged consume dead letters; run by whichever instance won the sweep."""
        purged = forgotten = 0
        deadline = asyncio.get_running_loop().time() + _INBOX_PURGE_SECONDS
        try:
            while True:

                async def purge(conn: Conn) -> int:
                    status = await conn.execute(self._q["inbox_purge"], _INBOX_PURGE_BATCH)
                    return int(status.split()[-1])

                count = await self._run(purge)
                purged += count
                if count < _INBOX_PURGE_BATCH or asyncio.get_running_loop().time() > deadline:
                    break

            async def forget(conn: Conn) -> int:
                status = await conn.execute(self._q["inbox_forget_dead"], _INBOX_PURGE_BATCH)
                return int(status.split()[-1])

            forgotten = await self._run(forget)
        except StoreError as exc:
            log.warning("inbox purge failed (the next sweep continues): %s", exc)
        if purged or forgotten:
            log.info(
                "sweep purged %d expired inbox rows and %d failure rows of purged dead letters",
                purged,
                forgotten,
            )
