"""What operators ask of SQLite: figures and dead letters (CLI, admin API)."""

from __future__ import annotations

import json
from typing import Any

from outboxer.ports import DeadLetterFilter, DeadLetterPage, OutboxStats, RelayInfo
from outboxer.stores._common import (
    DeadLetterLookup,
    check_limit,
    dead_letter_page,
    parse_cursor,
    sweep_report,
    to_datetime,
)
from outboxer.stores.sqlite.connection import SqlitePart

__all__ = ["SqliteDeadLetters"]


class SqliteDeadLetters(SqlitePart, DeadLetterLookup):
    """The operators' port (:class:`~outboxer.ports.AdminStore`) on SQLite."""

    async def stats(self, *, live_seconds: float = 15.0) -> OutboxStats:
        async with self.db.connection() as conn:
            async with conn.execute(self.q["stats"], {"live": live_seconds}) as cur:
                row = await cur.fetchone()
            async with conn.execute(self.q["live_relays"], {"live": live_seconds}) as cur:
                relays = await cur.fetchall()
            async with conn.execute(self.q["last_sweep"]) as cur:
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
            scheduled=row["scheduled"],
        )

    async def list_dead_letters(
        self, flt: DeadLetterFilter, *, limit: int, cursor: str | None
    ) -> DeadLetterPage:
        limit = check_limit(limit)
        params = {**_filter_params(flt), "after": parse_cursor(cursor), "limit": limit + 1}
        async with (
            self.db.connection() as conn,
            conn.execute(self.q["list_dead_letters"], params) as cur,
        ):
            rows = list(await cur.fetchall())
        return dead_letter_page(rows, limit)

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
        return ids + consumed

    async def purge_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        async with (
            self.db.transaction() as conn,
            conn.execute(self.q["purge_dead_letters"], _filter_params(flt)) as cur,
        ):
            return [r["id"] for r in await cur.fetchall()]


def _filter_params(flt: DeadLetterFilter) -> dict[str, Any]:
    return {
        "topic": flt.topic,
        "type": flt.type,
        "key": flt.key,
        "ids": json.dumps(list(flt.ids)) if flt.ids is not None else None,
    }
