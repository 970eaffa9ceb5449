"""SQLite store, the embedded default (aiosqlite, WAL mode).

SQLite admits one writer at a time, so a claim is a ``BEGIN IMMEDIATE`` transaction: relays in
several processes serialize on the database lock instead of skipping each other's rows, and
leased rows are excluded by their claim token exactly as on PostgreSQL. There is no NOTIFY: the
relay polls (adaptively) for work committed by other processes.

Ownership: the store opens and closes its own connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

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
    to_datetime,
)
from outboxer.stores._inbox import InboxSteps

__all__ = ["SqliteStore", "path_from_url"]

T = TypeVar("T")
log = logging.getLogger("outboxer.store.sqlite")

#: The sweep purges expired inbox rows this many at a time, for at most this many seconds.
_INBOX_PURGE_BATCH = 5000
_INBOX_PURGE_SECONDS = 10.0

#: SQLite's clock in UTC epoch seconds, as the schema stores times.
_NOW = "(julianday('now') - 2440587.5) * 86400.0"


def path_from_url(url: str) -> str:
    """``sqlite:///relative.db``, ``sqlite:////abs/path.db`` or ``sqlite:///:memory:``."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+")[0] != "sqlite" or not rest.startswith("/"):
        raise ConfigurationError(f"not a SQLite URL (sqlite:///path.db): {url}")
    path = rest[1:]
    if not path:
        raise ConfigurationError(f"SQLite URL has no path: {url}")
    return path


class SqliteStore(InboxSteps):
    """The outbox in a SQLite database file.

    Args:
        path_or_url: A file path or ``sqlite:///path.db``.
        names: Table names (SQLite has no schemas: ``names.schema`` must be ``None``).
        clock: The current time in UTC epoch seconds for the relay's queries (leases, retry
            delays, sweeps), instead of SQLite's own clock (``tests/simulation`` runs on virtual
            time). Default: SQLite's ``julianday('now')``.
    """

    dialect = "sqlite"

    def __init__(
        self,
        path_or_url: str | Path,
        names: TableNames | None = None,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.names = names or TableNames()
        if self.names.schema is not None:
            raise ConfigurationError("SQLite has no schemas: leave the schema name unset")
        raw = str(path_or_url)
        self.path = path_from_url(raw) if "://" in raw else raw
        q = _sql.queries("sqlite", self.names)
        where = q.pop("dead_letter_where")
        self._q = {name: sql.replace("{where}", where) for name, sql in q.items()}
        self._clock = clock
        if clock is not None:
            self._q = {name: sql.replace(_NOW, "outboxer_now()") for name, sql in self._q.items()}
        self._conn: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()  # one transaction at a time on the shared connection
        self._doorbell = asyncio.Event()

    async def __aenter__(self) -> SqliteStore:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def open(self) -> None:
        if self._conn is not None:
            return
        if self.path != ":memory:" and not Path(self.path).parent.exists():
            raise ConfigurationError(f"SQLite: directory of {self.path} does not exist")
        try:
            conn = await self._connect()
            conn.row_factory = sqlite3.Row
            await conn.execute("PRAGMA busy_timeout = 30000")
            await conn.execute("PRAGMA journal_mode = WAL")
            await conn.execute("PRAGMA synchronous = NORMAL")
            if self._clock is not None:
                await conn.create_function("outboxer_now", 0, self._clock)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open SQLite database {self.path}: {exc}") from exc
        self._conn = conn

    async def _connect(self) -> aiosqlite.Connection:
        """The connection, in autocommit mode (transactions are explicit)."""
        return await aiosqlite.connect(self.path, isolation_level=None, timeout=30)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def _run(self, operation: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T:
        if self._conn is None:
            raise RuntimeError("SqliteStore is not open (use 'async with store:')")
        async with self._lock:
            try:
                return await operation(self._conn)
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    raise SchemaError(
                        f"outbox table {self.names.table} is missing: run 'outboxer db upgrade'"
                    ) from exc
                raise StoreUnavailable(f"SQLite: {exc}") from exc

    async def _transaction(self, conn: aiosqlite.Connection, work: Callable[[], Awaitable[T]]) -> T:
        await conn.execute("BEGIN IMMEDIATE")
        try:
            result = await work()
        except BaseException:
            await conn.execute("ROLLBACK")
            raise
        await conn.execute("COMMIT")
        return result

    # -- schema --------------------------------------------------------------------------------

    async def migrate(self, target: int | None = None) -> list[int]:
        async def upgrade(conn: aiosqlite.Connection) -> list[int]:
            table = _sql.render("{schema_version}", self.names)

            async def work() -> list[int]:
                await conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {table} (version INTEGER PRIMARY KEY, "
                    "applied_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0))"
                )
                async with conn.execute(f"SELECT max(version) FROM {table}") as cur:
                    row = await cur.fetchone()
                current = (row[0] if row else 0) or 0
                applied = []
                for migration in _sql.migrations("sqlite"):
                    if migration.version <= current or (
                        target is not None and migration.version > target
                    ):
                        continue
                    for statement in _sql.split_statements(migration.sql):
                        await conn.execute(_sql.render(statement, self.names))
                    await conn.execute(
                        f"INSERT INTO {table} (version) VALUES (?)", (migration.version,)
                    )
                    applied.append(migration.version)
                return applied

            return await self._transaction(conn, work)

        return await self._run(upgrade)

    async def schema_version(self) -> int:
        async def read(conn: aiosqlite.Connection) -> int:
            table = f"{self.names.table}_schema_version"
            async with conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
            ) as cur:
                if await cur.fetchone() is None:
                    return 0
            async with conn.execute(f'SELECT max(version) FROM "{table}"') as cur:
                row = await cur.fetchone()
            return int(row[0] or 0) if row else 0

        return await self._run(read)

    async def check_schema(self) -> None:
        latest = _sql.migrations("sqlite")[-1].version
        current = await self.schema_version()
        if current == 0:
            raise SchemaError(
                f"outbox table {self.names.table} is missing in {self.path}: "
                "run 'outboxer db upgrade'"
            )
        if current != latest:
            raise SchemaError(
                f"outbox schema is at version {current}, this outboxer expects {latest}: "
                "run 'outboxer db upgrade'"
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
        token = int.from_bytes(os.urandom(8), "big") >> 1
        params = {
            "token": token,
            "relay": relay_id,
            "lease": lease_seconds,
            "limit": limit,
            "hold": hold_dead_keys,
        }
        query = self._q["claim_ordered" if ordered else "claim_unordered"]

        async def claim(conn: aiosqlite.Connection) -> list[sqlite3.Row]:
            async def work() -> list[sqlite3.Row]:
                async with conn.execute(query, params) as cur:
                    return list(await cur.fetchall())

            return await self._transaction(conn, work)

        rows = await self._run(claim)
        rows.sort(key=lambda r: r["seq"])
        return Claim(token=token, messages=[message_from_row(r) for r in rows])

    async def settle(self, claim: Claim, settlement: Settlement) -> None:
        token = claim.token
        steps: list[tuple[str, dict[str, Any]]] = []
        if settlement.published:
            steps.append(("ack", {"ids": json.dumps(settlement.published), "token": token}))
        if settlement.retries:
            items = [[r.id, r.delay, r.reason] for r in settlement.retries]
            steps.append(("retry", {"items": json.dumps(items), "token": token}))
        if settlement.dead:
            items_json = json.dumps([list(d) for d in settlement.dead])
            steps.append(("dead_letter_copy", {"items": items_json, "token": token}))
            steps.append(("dead_letter_delete", {"items": items_json, "token": token}))
        if settlement.released:
            steps.append(("release", {"ids": json.dumps(settlement.released), "token": token}))
        if not steps:
            return

        async def apply(conn: aiosqlite.Connection) -> None:
            async def work() -> None:
                for name, params in steps:
                    await conn.execute(self._q[name], params)

            await self._transaction(conn, work)

        await self._run(apply)

    async def release_expired_leases(self) -> int:
        async def release(conn: aiosqlite.Connection) -> int:
            async def work() -> int:
                cur = await conn.execute(self._q["release_expired"])
                released = cur.rowcount
                if released:
                    await conn.execute(self._q["count_released"], {"released": released})
                return released

            return await self._transaction(conn, work)

        return await self._run(release)

    async def sweep(
        self, *, sweeper: str, interval: float, retention_seconds: float, batch_size: int
    ) -> SweepReport | None:
        async def sweep(conn: aiosqlite.Connection) -> SweepReport | None:
            async def work() -> SweepReport | None:
                # BEGIN IMMEDIATE holds the database's write lock: one sweeper at a time.
                async with conn.execute(self._q["sweep_due"], {"interval": interval}) as cur:
                    due = await cur.fetchone()
                if due is None or not due["due"]:
                    return None
                now = "outboxer_now()" if self._clock is not None else _NOW
                async with conn.execute("SELECT " + now) as cur:
                    started = (await cur.fetchone() or [0.0])[0]
                purge = {"retention": retention_seconds, "batch": batch_size}
                purged = (await conn.execute(self._q["sweep_purge"], purge)).rowcount
                params = {"purged": purged, "sweeper": sweeper, "started": started}
                async with conn.execute(self._q["sweep"], params) as cur:
                    row = await cur.fetchone()
                return sweep_report(row) if row is not None else None

            return await self._transaction(conn, work)

        report = await self._run(sweep)
        if report is not None:  # this instance won the sweep: the inbox part follows
            await self._sweep_inbox()
        return report

    async def last_sweep(self) -> SweepReport | None:
        async def read(conn: aiosqlite.Connection) -> SweepReport | None:
            async with conn.execute(self._q["last_sweep"]) as cur:
                row = await cur.fetchone()
            return sweep_report(row) if row is not None else None

        return await self._run(read)

    async def wait_for_messages(self, timeout: float) -> bool:
        # No cross-process notification in SQLite: the relay's adaptive polling does the work.
        try:
            await asyncio.wait_for(self._doorbell.wait(), timeout)
        except TimeoutError:
            return False
        self._doorbell.clear()
        return True

    async def heartbeat(self, relay: RelayInfo) -> None:
        params = {
            "relay_id": relay.relay_id,
            "hostname": relay.hostname,
            "pid": relay.pid,
            "started_at": relay.started_at.timestamp(),
        }

        async def beat(conn: aiosqlite.Connection) -> None:
            await conn.execute(self._q["heartbeat"], params)

        await self._run(beat)

    async def unregister(self, relay_id: str) -> None:
        async def remove(conn: aiosqlite.Connection) -> None:
            await conn.execute(self._q["unregister"], {"relay_id": relay_id})

        await self._run(remove)

    # -- operators -----------------------------------------------------------------------------

    async def stats(self, *, live_seconds: float = 15.0) -> OutboxStats:
        async def read(conn: aiosqlite.Connection) -> OutboxStats:
            async with conn.execute(self._q["stats"], {"live": live_seconds}) as cur:
                row = await cur.fetchone()
            async with conn.execute(self._q["live_relays"], {"live": live_seconds}) as cur:
                relays = await cur.fetchall()
            async with conn.execute(self._q["last_sweep"]) as cur:
                sweep = await cur.fetchone()
            assert row is not None
            return OutboxStats(
                pending=row["pending"],
                in_flight=row["in_flight"],
                dead_letters=row["dead_letters"],
                oldest_pending_age_seconds=row["oldest_age"],
                relays=[
                    RelayInfo(
                        relay_id=r["relay_id"],
                        hostname=r["hostname"],
                        pid=r["pid"],
                        started_at=to_datetime(r["started_at"]),
                        heartbeat_at=to_datetime(r["heartbeat_at"]),
                        in_flight=r["in_flight"],
                    )
                    for r in relays
                ],
                last_sweep=sweep_report(sweep) if sweep is not None else None,
                unowned_in_flight=row["unowned"],
            )

        return await self._run(read)

    @staticmethod
    def _filter_params(flt: DeadLetterFilter) -> dict[str, Any]:
        return {
            "topic": flt.topic,
            "type": flt.type,
            "key": flt.key,
            "ids": json.dumps(list(flt.ids)) if flt.ids is not None else None,
        }

    async def list_dead_letters(
        self, flt: DeadLetterFilter, *, limit: int, cursor: str | None
    ) -> DeadLetterPage:
        limit = check_limit(limit)
        params = {**self._filter_params(flt), "after": parse_cursor(cursor), "limit": limit + 1}

        async def read(conn: aiosqlite.Connection) -> list[sqlite3.Row]:
            async with conn.execute(self._q["list_dead_letters"], params) as cur:
                return list(await cur.fetchall())

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

    async def replay_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        params = self._filter_params(flt)

        async def replay(conn: aiosqlite.Connection) -> list[str]:
            async def work() -> list[str]:
                async with conn.execute(self._q["replay_copy"], params) as cur:
                    ids = [r["id"] for r in await cur.fetchall()]
                await conn.execute(self._q["replay_delete"], {"replayed": json.dumps(ids)})
                # Consume dead letters are re-driven to their consumer instead (see
                # docs/inbox.md); both kinds in one transaction, so a replay is all or nothing.
                async with conn.execute(self._q["replay_consume_select"], params) as cur:
                    consumed = [r["id"] for r in await cur.fetchall()]
                if consumed:
                    replayed = {"replayed": json.dumps(consumed)}
                    for step in ("revive", "keep", "delete"):
                        await conn.execute(self._q[f"replay_consume_{step}"], replayed)
                return ids + consumed

            return await self._transaction(conn, work)

        return await self._run(replay)

    async def purge_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        params = self._filter_params(flt)

        async def purge(conn: aiosqlite.Connection) -> list[str]:
            async def work() -> list[str]:
                async with conn.execute(self._q["purge_dead_letters"], params) as cur:
                    return [r["id"] for r in await cur.fetchall()]

            return await self._transaction(conn, work)

        return await self._run(purge)

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
    ) -> list[sqlite3.Row]:
        equal = message_conditions(flt, message_id)
        filters = " ".join(f"AND o.{column} = :{column}" for column, _ in equal)
        sql = self._q["list_messages"].replace("{filters}", filters)
        params = {"after": after or 0, "limit": limit, "state": flt.state, **dict(equal)}

        async def read(conn: aiosqlite.Connection) -> list[sqlite3.Row]:
            async with conn.execute(sql, params) as cur:
                return list(await cur.fetchall())

        return await self._run(read)

    async def execute(self, sql: str, *args: Any) -> Sequence[sqlite3.Row]:
        """Run SQL with the outbox placeholders rendered (tests and benchmarks)."""

        async def run(conn: aiosqlite.Connection) -> list[sqlite3.Row]:
            async with conn.execute(_sql.render(sql, self.names), args) as cur:
                rows = list(await cur.fetchall())
            return rows

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
        """Run ``handler`` once per (consumer, message id) (see
        :class:`~outboxer.ports.InboxStore`), each message in its own transaction with its inbox
        row or all in one (``single_transaction``; a savepoint per message either way); the
        handler gets the aiosqlite connection. SQLite has one writer: one message at a time."""
        retention = float(retention_seconds)

        async def run(conn: aiosqlite.Connection) -> list[ConsumeOutcome]:
            async def one(message: Message) -> ConsumeOutcome:
                return await self._consume_one(
                    conn, consumer, message, handler, on_failure, retention
                )

            if single_transaction:

                async def all_messages() -> list[ConsumeOutcome]:
                    return [await one(message) for message in messages]

                return await self._transaction(conn, all_messages)
            outcomes: list[ConsumeOutcome] = []
            for message in messages:

                async def work(message: Message = message) -> ConsumeOutcome:
                    return await one(message)

                outcomes.append(await self._transaction(conn, work))
            return outcomes

        return await self._run(run)

    async def _consume_one(
        self,
        conn: aiosqlite.Connection,
        consumer: str,
        message: Message,
        handler: InboxHandler,
        on_failure: FailurePolicy,
        retention: float,
    ) -> ConsumeOutcome:
        base = {"consumer": consumer, "id": message.id}
        blocked = False
        if message.key is not None:
            async with conn.execute(self._q["inbox_blocked"], {**base, "key": message.key}) as cur:
                row = await cur.fetchone()
            blocked = bool(row is not None and row["blocked"])
        params = {**base, "blocked": blocked, "retention": retention}
        cursor = await conn.execute(self._q["inbox_insert"], params)
        if cursor.rowcount == 0:
            return "duplicate"
        return await self._handle_fresh_delivery(
            conn, consumer, message, blocked=blocked, handler=handler, on_failure=on_failure
        )

    async def _set_retrying(
        self, conn: aiosqlite.Connection, consumer: str, message_id: str
    ) -> None:
        await conn.execute(self._q["inbox_set_retrying"], {"consumer": consumer, "id": message_id})

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

        async def due(conn: aiosqlite.Connection) -> list[str]:
            params = {"consumer": consumer, "limit": limit}
            async with conn.execute(self._q["inbox_due"], params) as cur:
                return [r["message_id"] for r in await cur.fetchall()]

        outcomes: list[ConsumeOutcome] = []
        for message_id in await self._run(due):

            async def redrive(
                conn: aiosqlite.Connection, message_id: str = message_id
            ) -> ConsumeOutcome | None:
                async def work() -> ConsumeOutcome | None:
                    return await self._redrive_one(
                        conn, consumer, message_id, handler, on_failure, float(retention_seconds)
                    )

                return await self._transaction(conn, work)

            outcome = await self._run(redrive)
            if outcome is not None:
                outcomes.append(outcome)
        attempts = sum(outcome != "duplicate" for outcome in outcomes)
        if attempts:

            async def count(conn: aiosqlite.Connection) -> None:
                await conn.execute(self._q["inbox_count_retries"], {"count": attempts})

            await self._run(count)
        return outcomes

    async def _redrive_one(
        self,
        conn: aiosqlite.Connection,
        consumer: str,
        message_id: str,
        handler: InboxHandler,
        on_failure: FailurePolicy,
        retention: float,
    ) -> ConsumeOutcome | None:
        base = {"consumer": consumer, "id": message_id}
        # BEGIN IMMEDIATE (the caller's transaction) already excludes every other writer.
        async with conn.execute(self._q["inbox_failure_lock"], base) as cur:
            row = await cur.fetchone()
        if row is None:
            return None
        seq = {"seq": row["seq"]}
        if row["handled"]:
            await conn.execute(self._q["inbox_failure_delete"], seq)
            return "duplicate"
        message = message_from_row(row)
        attempt = row["consume_attempts"] + 1
        error = await self._run_handler_in_savepoint(conn, handler, message, attempt)
        if error is None:
            await conn.execute(self._q["inbox_failure_delete"], seq)
            await conn.execute(self._q["inbox_set_done"], {**base, "retention": retention})
            return "handled"
        failure = on_failure(message, attempt, error)
        update = {**seq, "attempts": attempt, "reason": failure.reason}
        if failure.retry_in is None:
            await conn.execute(self._q["inbox_failure_dead"], update)
            await conn.execute(self._q["inbox_set_done"], {**base, "retention": retention})
            await self._dead_letter_consumed(conn, message, attempt, failure.reason)
            return "dead"
        await conn.execute(
            self._q["inbox_failure_retry"], {**update, "delay": float(failure.retry_in)}
        )
        return "retrying"

    async def _run_handler_in_savepoint(
        self, conn: aiosqlite.Connection, handler: InboxHandler, message: Message, attempt: int
    ) -> Exception | None:
        """Run the handler inside a savepoint; return its exception after undoing its writes."""
        await conn.execute("SAVEPOINT outboxer_handler")
        try:
            await handler(message, conn, attempt)
        except Exception as exc:  # noqa: BLE001 - the handler's failure is the message's
            await conn.execute("ROLLBACK TO outboxer_handler")
            await conn.execute("RELEASE outboxer_handler")
            return exc
        await conn.execute("RELEASE outboxer_handler")
        return None

    def _message_params(self, message: Message) -> dict[str, Any]:
        return {
            "id": message.id,
            "topic": message.topic,
            "key": message.key,
            "type": message.type,
            "payload": message.payload,
            "content_type": message.content_type,
            "headers": encode_headers(message.headers),
            "created_at": message.created_at.timestamp(),
        }

    async def _insert_consume_failure(
        self,
        conn: aiosqlite.Connection,
        consumer: str,
        message: Message,
        attempts: int,
        failure: ConsumeFailure,
    ) -> None:
        params = {
            **self._message_params(message),
            "consumer": consumer,
            "attempts": attempts,
            "delay": float(failure.retry_in or 0.0),
            "reason": failure.reason,
            "state": "dead" if failure.retry_in is None else "retrying",
        }
        await conn.execute(self._q["inbox_failure_insert"], params)

    async def _dead_letter_consumed(
        self, conn: aiosqlite.Connection, message: Message, attempts: int, reason: str
    ) -> None:
        params = {**self._message_params(message), "reason": reason, "attempts": attempts}
        await conn.execute(self._q["inbox_dead_letter"], params)

    async def _sweep_inbox(self) -> None:
        """Purge expired inbox rows in batches and forget the failure rows of purged consume
        dead letters; each batch is its own short write transaction."""
        purged = forgotten = 0
        batch = {"batch": _INBOX_PURGE_BATCH}
        deadline = asyncio.get_running_loop().time() + _INBOX_PURGE_SECONDS
        try:
            while True:

                async def purge(conn: aiosqlite.Connection) -> int:
                    async def work() -> int:
                        return (await conn.execute(self._q["inbox_purge"], batch)).rowcount

                    return await self._transaction(conn, work)

                count = await self._run(purge)
                purged += count
                if count < _INBOX_PURGE_BATCH or asyncio.get_running_loop().time() > deadline:
                    break

            async def forget(conn: aiosqlite.Connection) -> int:
                return (await conn.execute(self._q["inbox_forget_dead"], batch)).rowcount

            forgotten = await self._run(forget)
        except StoreError as exc:
            log.warning("inbox purge failed (the next sweep continues): %s", exc)
        if purged or forgotten:
            log.info(
                "sweep purged %d expired inbox rows and %d failure rows of purged dead letters",
                purged,
                forgotten,
            )
