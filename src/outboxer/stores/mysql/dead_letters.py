"""What operators ask of MySQL: figures and dead letters (CLI, admin API).

MySQL has no ``DELETE ... RETURNING``: a replay or purge first locks the dead letters it acts on
(``select_dead_letters``), then moves or deletes exactly those rows by ``dl_seq`` in the same
transaction, so a dead letter written meanwhile is neither lost nor half-moved. Publish and
consume dead letters are replayed in that one transaction: a replay is all or nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncmy import errors as mysql_errors

from outboxer.ports import DeadLetterFilter
from outboxer.stores._common import DeadLetterViews, Row, unique
from outboxer.stores.mysql.connection import (
    MysqlPart,
    error_code,
    execute,
    fetch_all,
    fetch_one,
    retried_on_deadlock,
)
from outboxer.stores.mysql.relay import micros, text_row

__all__ = ["MysqlDeadLetters"]

#: MySQL's "table doesn't exist" (ER_NO_SUCH_TABLE).
_NO_SUCH_TABLE = 1146

#: Dead letters a replay moves back to the outbox per ``INSERT ... SELECT``. InnoDB holds its
#: table-level AUTO-INC lock for the whole of such a statement (``innodb_autoinc_lock_mode`` 1,
#: MariaDB's default), and every application ``INSERT`` into the outbox waits for it: one
#: statement replaying 200,000 dead letters held the application's enqueues 1.6-4.7 s (a probe).
#: In chunks the wait is one chunk's (≈ 60 ms); they run in the one transaction, so a replay is
#: still all or nothing.
REPLAY_CHUNK = 1000


def filter_args(flt: DeadLetterFilter) -> dict[str, Any]:
    """Query parameters of a dead-letter filter (an empty ``ids`` list matches nothing)."""
    ids = tuple(flt.ids) if flt.ids is not None else ()
    return {
        "topic": flt.topic,
        "type": flt.type,
        "key": flt.key,
        "by_id": flt.ids is not None,
        "direction": flt.direction,
        # "IN ()" is not SQL: with no ids, a value no id can equal (ids are non-empty)
        "ids": ids or ("",),
    }


class MysqlDeadLetters(MysqlPart, DeadLetterViews):
    """The operators' port (:class:`~outboxer.ports.AdminStore`) on MySQL."""

    async def _stats_rows(
        self, live_seconds: float
    ) -> tuple[Row, Sequence[Row], Row | None, Sequence[Row]]:
        live = {"live_us": micros(live_seconds)}
        async with self.db.connection() as conn:
            row = await fetch_one(conn, self.q["stats"], live)
            assert row is not None  # a SELECT of expressions always returns a row
            relays = await fetch_all(conn, self.q["live_relays"], live)
            sweep = await fetch_one(conn, self.q["last_sweep"])
            try:
                failures = [text_row(r) for r in await fetch_all(conn, self.q["consume_failures"])]
            except mysql_errors.MySQLError as exc:
                # A schema from before the inbox (version 3): no consumer, so nothing failed.
                if error_code(exc) != _NO_SUCH_TABLE:
                    raise
                failures = []
        return row, relays, sweep, failures

    async def _dead_letter_rows(
        self, flt: DeadLetterFilter, after: int | None, limit: int, budget: int
    ) -> list[Row]:
        args = {**filter_args(flt), "after": after, "limit": limit, "budget": budget}
        async with self.db.connection() as conn:
            rows = await fetch_all(conn, self.q["list_dead_letters"], args)
        return [text_row(r) for r in rows]

    async def _known_ids(self, query: str, ids: Sequence[str]) -> list[str]:
        async with self.db.connection() as conn:
            rows = await fetch_all(conn, self.q[query], {"ids": tuple(ids)})
        return [text_row(r)["id"] for r in rows]

    async def replay_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        """Publish dead letters go back to the outbox; consume dead letters are re-driven to
        the consumers that gave up on them (see docs/inbox.md). Two operators acting on the
        same dead letters at once may deadlock: the victim runs again."""
        return await retried_on_deadlock(lambda: self._replay(flt))

    async def _replay(self, flt: DeadLetterFilter) -> list[str]:
        async with self.db.transaction() as conn:
            rows = await fetch_all(conn, self.q["select_dead_letters"], filter_args(flt))
            publish = tuple(r["dl_seq"] for r in rows if r["direction"] == "publish")
            moved: list[dict[str, Any]] = []
            if publish:
                moved = await fetch_all(conn, self.q["replayable_dead_letters"], {"seqs": publish})
            consume = [r for r in rows if r["direction"] == "consume"]
            if consume:  # their failure rows become due again (see replay_consume_dead_letters)
                ids = tuple(r["id"] for r in consume)
                await execute(conn, self.q["replay_consume_dead_letters"], {"ids": ids})
            for start in range(0, len(moved), REPLAY_CHUNK):  # in dead-letter order
                chunk = tuple(r["dl_seq"] for r in moved[start : start + REPLAY_CHUNK])
                await execute(conn, self.q["replay_dead_letters"], {"seqs": chunk})
            if moved or consume:
                seqs = tuple(r["dl_seq"] for r in [*moved, *consume])
                await execute(conn, self.q["delete_dead_letters"], {"seqs": seqs})
        return unique(text_row(r)["id"] for r in [*moved, *consume])

    async def purge_dead_letters(self, flt: DeadLetterFilter) -> list[str]:
        return await retried_on_deadlock(lambda: self._purge(flt))

    async def _purge(self, flt: DeadLetterFilter) -> list[str]:
        async with self.db.transaction() as conn:
            rows = await fetch_all(conn, self.q["select_dead_letters"], filter_args(flt))
            if rows:
                seqs = tuple(r["dl_seq"] for r in rows)
                await execute(conn, self.q["delete_dead_letters"], {"seqs": seqs})
        return unique(text_row(r)["id"] for r in rows)
