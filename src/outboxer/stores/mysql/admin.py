"""What operators ask of the MySQL store: statistics, the backlog and the dead-letter tools.

MySQL has no ``DELETE ... RETURNING``: a replay or purge first locks the dead letters it acts on
(``select_dead_letters``), then moves or deletes exactly those rows by ``dl_seq`` in the same
transaction, so a dead letter written meanwhile is neither lost nor half-moved.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from outboxer.errors import NotFound
from outboxer.ports import (
    DeadLetter,
    DeadLetterFilter,
    DeadLetterPage,
    MessageFilter,
    OutboxStats,
    RelayInfo,
)
from outboxer.stores._common import (
    MessageViews,
    check_limit,
    dead_letter_from_row,
    message_query,
    parse_cursor,
    sweep_report,
    to_datetime,
)
from outboxer.stores.mysql.connection import (
    Conn,
    MysqlDatabase,
    execute,
    fetch_all,
    fetch_one,
    transaction,
)
from outboxer.stores.mysql.relay import micros, text_row

__all__ = ["MysqlAdmin"]


def filter_args(flt: DeadLetterFilter) -> dict[str, Any]:
    """Query parameters of a dead-letter filter (an empty ``ids`` list matches nothing)."""
    ids = tuple(flt.ids) if flt.ids is not None else ()
    return {
        "topic": flt.topic,
        "type": flt.type,
        "key": flt.key,
        "by_id": flt.ids is not None,
        # "IN ()" is not SQL: with no ids, a value no id can equal (ids are non-empty)
        "ids": ids or ("",),
    }


class MysqlAdmin(MessageViews):
    """Stats, messages not yet published and dead letters over a :class:`MysqlDatabase`."""

    db: MysqlDatabase

    async def stats(self, *, live_seconds: float = 15.0) -> OutboxStats:
        q = self.db.queries
        live = {"live_us": micros(live_seconds)}

        async def read(conn: Conn) -> OutboxStats:
            row = await fetch_one(conn, q["stats"], live)
            relays = await fetch_all(conn, q["live_relays"], live)
            sweep = await fetch_one(conn, q["last_sweep"])
            assert row is not None  # a SELECT of expressions always returns a row
            age = row["oldest_age"]
            return OutboxStats(
                pending=int(row["pending"]),
                in_flight=int(row["in_flight"]),
                dead_letters=int(row["dead_letters"]),
                oldest_pending_age_seconds=float(age) if age is not None else None,
                relays=[_relay(r) for r in relays],
                last_sweep=sweep_report(sweep) if sweep is not None else None,
                unowned_in_flight=int(row["unowned"]),
            )

        return await self.db.run(read)

    async def list_dead_letters(
        self, flt: DeadLetterFilter, *, limit: int, cursor: str | None
    ) -> DeadLetterPage:
        limit = check_limit(limit)
        args = {**filter_args(flt), "after": parse_cursor(cursor), "limit": limit + 1}
        query = self.db.queries["list_dead_letters"]

        async def read(conn: Conn) -> list[dict[str, Any]]:
            return await fetch_all(conn, query, args)

        rows = await self.db.run(read)
        more = len(rows) > limit
        rows = rows[:limit]
        next_cursor = str(rows[-1]["dl_seq"]) if more else None
        return DeadLetterPage([dead_letter_from_row(text_row(r)) for r in rows], next_cursor)

    async def get_dead_letter(self, dead_letter_id: str) -> DeadLetter:
        page = await self.list_dead_letters(
            DeadLetterFilter(ids=[dead_letter_id]), limit=1, cursor=None
        )
        if not page.items:
            raise NotFound(f"no dead letter with id {dead_letter_id!r}")
        return page.items[0]

    async def replay_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        """Publish dead letters go back to the outbox; consume dead letters are re-driven to
        the consumers that gave up on them (see docs/inbox.md)."""
        q = self.db.queries

        async def replay(conn: Conn) -> list[str]:
            async with transaction(conn):
                rows = await fetch_all(conn, q["select_dead_letters"], filter_args(flt))
                publish = tuple(r["dl_seq"] for r in rows if r["direction"] == "publish")
                consume = [r for r in rows if r["direction"] == "consume"]
                moved: list[dict[str, Any]] = []
                if publish:
                    moved = await fetch_all(conn, q["replayable_dead_letters"], {"seqs": publish})
                if moved:
                    seqs = tuple(r["dl_seq"] for r in moved)
                    await execute(conn, q["replay_dead_letters"], {"seqs": seqs})
                    await execute(conn, q["delete_dead_letters"], {"seqs": seqs})
                revived = await self._redrive_consume_dead_letters(conn, consume)
            return [text_row(r)["id"] for r in moved] + revived

        return await self.db.run(replay)

    async def _redrive_consume_dead_letters(
        self, conn: Conn, rows: list[dict[str, Any]]
    ) -> list[str]:
        """Consume dead letters go back to their consumers (the inbox's part of a replay)."""
        return []

    async def purge_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        q = self.db.queries

        async def purge(conn: Conn) -> list[str]:
            async with transaction(conn):
                rows = await fetch_all(conn, q["select_dead_letters"], filter_args(flt))
                if rows:
                    seqs = tuple(r["dl_seq"] for r in rows)
                    await execute(conn, q["delete_dead_letters"], {"seqs": seqs})
            return [text_row(r)["id"] for r in rows]

        return await self.db.run(purge)

    async def _message_rows(
        self, flt: MessageFilter, message_id: str | None, limit: int, after: int | None
    ) -> list[dict[str, Any]]:
        sql, params = message_query(
            self.db.queries["list_messages"],
            flt,
            message_id,
            limit,
            after,
            "AND o.`{1}` = %({1})s".format,
        )

        async def read(conn: Conn) -> list[dict[str, Any]]:
            return [text_row(row) for row in await fetch_all(conn, sql, dict(params))]

        return await self.db.run(read)


def _relay(row: Mapping[str, Any]) -> RelayInfo:
    return RelayInfo(
        relay_id=row["relay_id"],
        hostname=row["hostname"],
        pid=int(row["pid"]),
        started_at=to_datetime(row["started_at"]),
        heartbeat_at=to_datetime(row["heartbeat_at"]),
        in_flight=int(row["in_flight"]),
    )
