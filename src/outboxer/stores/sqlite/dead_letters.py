"""What operators ask of SQLite: figures and dead letters (CLI, admin API)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from outboxer.ports import DeadLetterFilter
from outboxer.stores._common import DeadLetterViews, Row, unique
from outboxer.stores.sqlite.connection import SqlitePart

__all__ = ["SqliteDeadLetters"]


class SqliteDeadLetters(SqlitePart, DeadLetterViews):
    """The operators' port (:class:`~outboxer.ports.AdminStore`) on SQLite."""

    async def _stats_rows(
        self, live_seconds: float
    ) -> tuple[Row, Sequence[Row], Row | None, Sequence[Row]]:
        async with self.db.connection() as conn:
            async with conn.execute(self.q["stats"], {"live": live_seconds}) as cur:
                row = await cur.fetchone()
            async with conn.execute(self.q["live_relays"], {"live": live_seconds}) as cur:
                relays = list(await cur.fetchall())
            async with conn.execute(self.q["last_sweep"]) as cur:
                sweep = await cur.fetchone()
            failures: Sequence[Row] = []
            try:
                async with conn.execute(self.q["consume_failures"]) as cur:
                    failures = list(await cur.fetchall())
            except sqlite3.OperationalError as exc:
                # A schema from before the inbox (version 3): no consumer, so nothing failed.
                if "no such table" not in str(exc):
                    raise
        assert row is not None
        return row, relays, sweep, failures

    async def _dead_letter_rows(
        self, flt: DeadLetterFilter, after: int | None, limit: int, budget: int
    ) -> list[Row]:
        params = {**_filter_params(flt), "after": after, "limit": limit, "budget": budget}
        async with (
            self.db.connection() as conn,
            conn.execute(self.q["list_dead_letters"], params) as cur,
        ):
            return list(await cur.fetchall())

    async def _known_ids(self, query: str, ids: Sequence[str]) -> list[str]:
        async with (
            self.db.connection() as conn,
            conn.execute(self.q[query], {"ids": json.dumps(ids)}) as cur,
        ):
            return [r["id"] for r in await cur.fetchall()]

    async def replay_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        params = _filter_params(flt)
        async with self.db.transaction() as conn:
            async with conn.execute(self.q["replay_copy"], params) as cur:
                ids = [r["id"] for r in await cur.fetchall()]
            await conn.execute(self.q["replay_delete"], {"replayed": json.dumps(ids)})
            # Consume dead letters are re-driven to their consumer instead (see docs/inbox.md);
            # both kinds in one transaction, so a replay is all or nothing.
            async with conn.execute(self.q["replay_consume_select"], params) as cur:
                consumed = [r["id"] for r in await cur.fetchall()]
            if consumed:
                replayed = {"replayed": json.dumps(consumed)}
                for step in ("revive", "keep", "delete"):
                    await conn.execute(self.q[f"replay_consume_{step}"], replayed)
        return unique(ids + consumed)

    async def purge_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        async with (
            self.db.transaction() as conn,
            conn.execute(self.q["purge_dead_letters"], _filter_params(flt)) as cur,
        ):
            return unique(r["id"] for r in await cur.fetchall())


def _filter_params(flt: DeadLetterFilter) -> dict[str, Any]:
    return {
        "topic": flt.topic,
        "type": flt.type,
        "key": flt.key,
        "ids": json.dumps(list(flt.ids)) if flt.ids is not None else None,
        "direction": flt.direction,
    }
