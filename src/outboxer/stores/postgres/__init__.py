"""PostgreSQL store, on asyncpg.

One class, :class:`PostgresStore`, assembled from its parts, one module per concern over the
connection seam of :mod:`~outboxer.stores.postgres.connection`:

- ``relay.py``: claims (``FOR UPDATE SKIP LOCKED``), settlements fenced by the claim token, the
  relay registry (no doorbell: relays poll adaptively, docs/adr/0007-polling-wakeup.md);
- ``sweeper.py``: the periodic sweep, one instance at a time;
- ``dead_letters.py``: figures and dead letters for operators;
- ``messages.py``: the messages not yet published, read-only, for operators;
- ``schema.py``: the versioned migrations;
- ``inbox.py``: the inbox's SQL primitives (the state machine is :mod:`outboxer.inbox.consume`);
- ``sql/``: the migrations and the named queries (``queries.sql``), with the reasons beside them.

Ownership: a store built from a URL creates and closes its pool; a store handed a pool uses it
and never closes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from outboxer.config import TableNames
from outboxer.ports import DatabaseStore
from outboxer.stores import _sql
from outboxer.stores._common import StoreLifecycle
from outboxer.stores.postgres.connection import URL_SPEC, PostgresDatabase
from outboxer.stores.postgres.dead_letters import PostgresDeadLetters
from outboxer.stores.postgres.inbox import PostgresInbox
from outboxer.stores.postgres.messages import PostgresMessages
from outboxer.stores.postgres.relay import PostgresRelay
from outboxer.stores.postgres.schema import PostgresSchema
from outboxer.stores.postgres.sweeper import PostgresSweeper

__all__ = ["URL_SPEC", "PostgresStore", "from_url"]


class PostgresStore(
    StoreLifecycle,
    PostgresRelay,
    PostgresSweeper,
    PostgresDeadLetters,
    PostgresMessages,
    PostgresSchema,
    PostgresInbox,
):
    """The outbox in PostgreSQL: every port of :class:`~outboxer.ports.DatabaseStore`.

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
        self.q = _sql.queries("postgres", self.names)
        self.db = PostgresDatabase(dsn_or_pool, self.names, max_connections=max_connections)

    @property
    def pool(self) -> asyncpg.Pool:
        return self.db.pool

    async def execute(self, sql: str, *args: Any) -> Sequence[asyncpg.Record]:
        """Run SQL with the outbox placeholders rendered (tests and benchmarks)."""
        async with self.db.connection() as conn:
            return list(await conn.fetch(_sql.render(sql, self.names), *args))


def from_url(
    url: str, names: TableNames | None = None, *, connections: int | None = None
) -> DatabaseStore:
    """The (not yet opened) store for a ``postgresql://`` URL; ``connections`` sizes its pool.

    ``outboxer.stores.open_store`` calls this for the schemes registered in
    :data:`outboxer.urls.SCHEMES`.
    """
    return PostgresStore(url, names, max_connections=connections or 10)
