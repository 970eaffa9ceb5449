"""What operators ask of PostgreSQL: figures and dead letters (CLI, admin API)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from outboxer.ports import DeadLetterFilter
from outboxer.stores._common import DeadLetterViews, Row, unique
from outboxer.stores.postgres.connection import PostgresPart

__all__ = ["PostgresDeadLetters"]


class PostgresDeadLetters(PostgresPart, DeadLetterViews):
    """The operators' port (:class:`~outboxer.ports.AdminStore`) on PostgreSQL."""

    async def _stats_rows(
        self, live_seconds: float
    ) -> tuple[Row, Sequence[Row], Row | None, Sequence[Row]]:
        async with self.db.connection() as conn:
            row = await conn.fetchrow(self.q["stats"], float(live_seconds))
            assert row is not None  # an aggregate query always returns one row
            relays = await conn.fetch(self.q["live_relays"], float(live_seconds))
            sweep = await conn.fetchrow(self.q["last_sweep"])
            try:
                failures: Sequence[Row] = await conn.fetch(self.q["consume_failures"])
            except asyncpg.UndefinedTableError:
                # A schema from before the inbox (version 3): no consumer, so nothing failed.
                # Not in a transaction, so the connection goes on as if nothing happened.
                failures = []
        return row, relays, sweep, failures

    async def _dead_letter_rows(
        self, flt: DeadLetterFilter, after: int | None, limit: int, budget: int
    ) -> list[Row]:
        async with self.db.connection() as conn:
            return list(
                await conn.fetch(
                    self.q["list_dead_letters"],
                    *_filter_args(flt),
                    after,
                    limit,
                    budget,
                    flt.direction,
                )
            )

    async def _known_ids(self, query: str, ids: Sequence[str]) -> list[str]:
        async with self.db.connection() as conn:
            return [r["id"] for r in await conn.fetch(self.q[query], ids)]

    async def replay_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        # Consume dead letters are re-driven to their consumer instead (see docs/inbox.md); both
        # kinds in one transaction, so a replay is all or nothing.
        return await self._bulk(("replay_dead_letters", "replay_consume_dead_letters"), flt)

    async def purge_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        return await self._bulk(("purge_dead_letters",), flt)

    async def _bulk(self, queries: Sequence[str], flt: DeadLetterFilter) -> list[str]:
        """Run ``queries`` in one transaction; the ids they return, in order."""
        ids: list[str] = []
        async with self.db.transaction() as conn:
            for query in queries:
                rows = await conn.fetch(self.q[query], *_filter_args(flt), flt.direction)
                ids.extend(r["id"] for r in rows)
        return unique(ids)


def _filter_args(flt: DeadLetterFilter) -> tuple[Any, ...]:
    ids = list(flt.ids) if flt.ids is not None else None
    return (flt.topic, flt.type, flt.key, ids)
