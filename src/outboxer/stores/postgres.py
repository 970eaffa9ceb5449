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
from outboxer.errors import ConfigurationError, NotFound, SchemaError, StoreUnavailable
from outboxer.ports import (
    Claim,
    DeadLetter,
    DeadLetterFilter,
    DeadLetterPage,
    OutboxStats,
    RelayInfo,
    Settlement,
    SweepReport,
)
from outboxer.stores import _sql
from outboxer.stores._common import (
    check_limit,
    dead_letter_from_row,
    message_from_row,
    parse_cursor,
    sweep_report,
)

__all__ = ["PostgresStore"]

log = logging.getLogger("outboxer.store.postgres")
T = TypeVar("T")
#: What operations receive: a connection borrowed from the pool.
Conn: TypeAlias = "PoolConnectionProxy[asyncpg.Record]"

#: Connection problems that mean "the database is not reachable right now".
_UNAVAILABLE = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
)


def normalize_url(url: str) -> str:
    """Accept ``postgresql://``, ``postgres://`` and SQLAlchemy's ``postgresql+driver://``."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+")[0] not in ("postgresql", "postgres"):
        raise ConfigurationError(f"not a PostgreSQL URL: {scheme}://…")
    return f"postgresql://{rest}"


class PostgresStore:
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
        self, *, limit: int, lease_seconds: float, ordered: bool, relay_id: str
    ) -> Claim:
        token = int.from_bytes(os.urandom(8), "big") >> 1  # positive bigint
        query = self._q["claim_ordered" if ordered else "claim_unordered"]

        async def claim(conn: Conn) -> list[asyncpg.Record]:
            return list(await conn.fetch(query, limit, token, relay_id, float(lease_seconds)))

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

        return await self._run(sweep)

    async def last_sweep(self) -> SweepReport | None:
        async def read(conn: Conn) -> SweepReport | None:
            row = await conn.fetchrow(self._q["last_sweep"])
            return sweep_report(row) if row is not None else None

        return await self._run(read)

    async def wait_for_messages(self, timeout: float) -> bool:
        if self._listener is None or self._listener.is_closed():
            await self._listen()
        try:
            await asyncio.wait_for(self._doorbell.wait(), timeout)
        except TimeoutError:
            return False
        self._doorbell.clear()
        return True

    async def _listen(self) -> None:
        """Hold one pooled connection for LISTEN; on failure polling carries on alone."""
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self.pool.release(self._listener, timeout=2)
        self._listener = None
        try:
            conn = await self.pool.acquire()
            await conn.add_listener(self.names.channel, self._ring)
            self._listener = conn
        except Exception as exc:  # noqa: BLE001 - polling is the documented fallback
            log.warning("LISTEN unavailable, polling only: %s", exc)

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

    async def _bulk(self, query: str, flt: DeadLetterFilter) -> list[str]:
        async def run(conn: Conn) -> list[str]:
            async with conn.transaction():
                rows = await conn.fetch(self._q[query], *self._filter_args(flt))
            return [r["id"] for r in rows]

        return await self._run(run)

    async def replay_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        return await self._bulk("replay_dead_letters", flt)

    async def purge_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        return await self._bulk("purge_dead_letters", flt)

    async def execute(self, sql: str, *args: Any) -> Sequence[asyncpg.Record]:
        """Run SQL with the outbox placeholders rendered (tests and benchmarks)."""

        async def run(conn: Conn) -> Sequence[asyncpg.Record]:
            return list(await conn.fetch(_sql.render(sql, self.names), *args))

        return await self._run(run)
