"""What operators ask of PostgreSQL: figures and dead letters (CLI, admin API)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from outboxer.ports import DeadLetterFilter, DeadLetterPage, OutboxStats, RelayInfo
from outboxer.stores._common import (
    DeadLetterLookup,
    check_limit,
    dead_letter_page,
    parse_cursor,
    sweep_report,
)
from outboxer.stores.postgres.connection import PostgresPart

__all__ = ["PostgresDeadLetters"]


class PostgresDeadLetters(PostgresPart, DeadLetterLookup):
    """The operators' port (:class:`~outboxer.ports.AdminStore`) on PostgreSQL."""

    async def stats(self, *, live_seconds: float = 15.0) -> OutboxStats:
        async with self.db.connection() as conn:
            row = await conn.fetchrow(self.q["stats"], float(live_seconds))
            assert row is not None  # an aggregate query always returns one row
            relays = await conn.fetch(self.q["live_relays"], float(live_seconds))
            sweep = await conn.fetchrow(self.q["last_sweep"])
        return OutboxStats(
            pending=row["pending"],
            in_flight=row["in_flight"],
            dead_letters=row["dead_letters"],
            oldest_pending_age_seconds=row["oldest_age"],
            relays=[RelayInfo(**dict(r)) for r in relays],
            last_sweep=sweep_report(sweep) if sweep is not None else None,
            unowned_in_flight=row["unowned"],
            scheduled=row["scheduled"],
        )

    async def list_dead_letters(
        self, flt: DeadLetterFilter, *, limit: int, cursor: str | None
    ) -> DeadLetterPage:
        limit = check_limit(limit)
        args = (*_filter_args(flt), parse_cursor(cursor), limit + 1)
        async with self.db.connection() as conn:
            rows = list(await conn.fetch(self.q["list_dead_letters"], *args))
        return dead_letter_page(rows, limit)

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
                rows = await conn.fetch(self.q[query], *_filter_args(flt))
                ids.extend(r["id"] for r in rows)
        return ids


def _filter_args(flt: DeadLetterFilter) -> tuple[Any, ...]:
    ids = list(flt.ids) if flt.ids is not None else None
    return (flt.topic, flt.type, flt.key, ids)
