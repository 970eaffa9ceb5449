"""PostgreSQL's ordered claim on random outbox states keeps the rules of its statement's comment
(``claim_ordered`` in stores/postgres/sql/queries.sql, docs/adr/0001, 0008, 0010, 0011).

Each seed builds a small outbox of a few keys (some rows unkeyed) and puts it in a random state:
key prefixes leased under this relay's batches in flight (``behind``) or another relay's token,
rows waiting for a retry or a delayed time, suspects, rows behind the commit-order gate, keys
with a publish dead letter, rows another transaction holds locked (SKIP LOCKED). Small batches
and fronts send the claim through every way it looks for candidates. Then one claim, rolled
back, is checked against a model of the rules:

- every claimed row is claimable (not leased, not waiting, not behind the gate, not locked by
  another transaction, its key not held by a dead letter when the relay asks so);
- a suspect is claimed alone;
- every older row of a claimed row's key is claimed with it or leased under ``behind``;
- the claim is never empty while the model has a claimable row (progress), and it is the
  suspect when a suspect heads its key.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest

from outboxer.stores.postgres import PostgresStore
from outboxer.stores.postgres import relay as postgres_relay

SEEDS = 120
OTHER = 999  # another relay's claim token
BEHIND = (101, 102, 103)


@dataclass
class Row:
    id: str
    seq: int
    key: str | None
    token: int | None = None
    waiting: bool = False
    suspect: bool = False
    gated: bool = False
    locked: bool = False


@dataclass
class State:
    rows: list[Row]
    behind: list[int]
    hold: bool
    dead_keys: set[str] = field(default_factory=set)

    def claimable(self, row: Row) -> bool:
        return not (
            row.token is not None
            or row.waiting
            or row.gated
            or row.locked
            or (self.hold and row.key in self.dead_keys)
        )

    def older(self, row: Row) -> list[Row]:
        """The older rows of ``row``'s key (none for an unkeyed row)."""
        if row.key is None:
            return []
        return [r for r in self.rows if r.key == row.key and r.seq < row.seq]

    def violation(self, claimed: set[str], limit: int) -> str | None:
        by_id = {r.id: r for r in self.rows}
        if len(claimed) > limit:
            return f"{len(claimed)} rows claimed, more than {limit}"
        for row in (by_id[i] for i in claimed):
            if not self.claimable(row):
                return f"claimed an unclaimable row: {row}"
            if row.suspect:
                return None if len(claimed) == 1 else f"a suspect claimed with others: {row}"
            if row.key is None:
                continue
            for before in self.older(row):
                if before.id not in claimed and before.token not in self.behind:
                    return f"claimed {row} with an older row of its key left out: {before}"
        return None

    def expected_progress(self) -> tuple[Row | None, bool]:
        """The oldest row a claim must not miss, and whether it must be claimed alone."""
        taken: set[str] = set()
        for row in self.rows:
            if row.suspect and self.claimable(row) and not self.older(row):
                return row, True
        for row in self.rows:
            if (
                not row.suspect
                and self.claimable(row)
                and all(b.id in taken or b.token in self.behind for b in self.older(row))
            ):
                taken.add(row.id)
        first = min((r for r in self.rows if r.id in taken), key=lambda r: r.seq, default=None)
        return first, False


async def build(conn: asyncpg.Connection, schema: str, rnd: random.Random) -> State:
    table = f'"{schema}".outbox'
    await conn.execute(f'TRUNCATE {table}, "{schema}".outbox_dead_letters')
    keys, count, unkeyed = rnd.choice([1, 3, 8, 20]), rnd.choice([20, 60, 150]), rnd.random() / 2
    records = [
        (f"m{n}", "t", None if rnd.random() < unkeyed else f"k{rnd.randrange(keys)}", b"{}")
        for n in range(count)
    ]
    await conn.copy_records_to_table(
        "outbox", records=records, columns=["id", "topic", "key", "payload"], schema_name=schema
    )
    await conn.execute(f"UPDATE {table} SET txid = NULL")  # the gate: only where set below
    rows = [Row(r["id"], r["seq"], r["key"]) for r in await conn.fetch(f"TABLE {table}")]
    rows.sort(key=lambda r: r.seq)
    state = State(rows, list(BEHIND[: rnd.randrange(4)]), rnd.random() < 0.5)
    for key in {r.key for r in rows if r.key is not None}:
        of_key = [r for r in rows if r.key == key]
        held = rnd.random()
        if held < 0.4 and state.behind:  # a prefix in this relay's batches in flight
            for row in of_key[: rnd.randrange(len(of_key) + 1)]:
                row.token = rnd.choice(state.behind)
        elif held < 0.55:  # a prefix leased by another relay
            for row in of_key[: rnd.randrange(1, len(of_key) + 1)]:
                row.token = OTHER
        if rnd.random() < 0.1:
            state.dead_keys.add(key)
    for row in rows:
        if row.token is None:
            flaw = rnd.random()
            row.waiting, row.suspect, row.gated = (
                flaw < 0.04,
                0.04 <= flaw < 0.06,
                0.06 <= flaw < 0.08,
            )
    for row in rows:
        if row.token is not None or row.waiting or row.suspect or row.gated:
            await conn.execute(
                f"UPDATE {table} SET claim_token = $2,"
                " locked_until = CASE WHEN $2::bigint IS NULL THEN NULL"
                " ELSE now() + interval '1 hour' END,"
                " available_at = CASE WHEN $3 THEN now() + interval '1 hour' ELSE available_at END,"
                " lease_expiries = CASE WHEN $4 THEN 1 ELSE 0 END,"
                " txid = CASE WHEN $5 THEN '99999999999'::xid8 END"
                " WHERE id = $1",
                *(row.id, row.token, row.waiting, row.suspect, row.gated),
            )
    for key in state.dead_keys:
        await conn.execute(
            f'INSERT INTO "{schema}".outbox_dead_letters (id, topic, key, payload, content_type,'
            " created_at, failure_reason, attempts) VALUES ($1, 't', $2, '', 'x', now(), 'r', 1)",
            f"dl-{key}",
            key,
        )
    await conn.execute(f"ANALYZE {table}")
    return state


@pytest.mark.parametrize("chunk", range(4))
async def test_an_ordered_claim_keeps_the_rules_on_random_states(
    pg_store: PostgresStore, pg_url: str, pg_schema: str, chunk: int
) -> None:
    admin = await asyncpg.connect(pg_url)
    locker = await asyncpg.connect(pg_url)
    try:
        for seed in range(chunk, SEEDS, 4):
            rnd = random.Random(seed)
            state = await build(admin, pg_schema, rnd)
            limit = rnd.choice([5, 10, 25])
            front = limit * (postgres_relay.FRONT_PER_MESSAGE + len(state.behind))
            keys = limit * postgres_relay.KEYS_PER_MESSAGE
            if rnd.random() < 0.25:  # no front, or too many keys: the other ways in
                front = 0 if rnd.random() < 0.5 else front
                keys = 0 if rnd.random() < 0.5 else keys
            args: tuple[Any, ...] = (limit, 7, "me", 30.0, state.hold, state.behind, front, keys)
            async with locker.transaction():
                if rnd.random() < 0.5:
                    for row in state.rows:
                        row.locked = row.token is None and rnd.random() < 0.1
                    locked = [r.id for r in state.rows if r.locked]
                    await locker.execute(
                        f'SELECT 1 FROM "{pg_schema}".outbox WHERE id = ANY($1) FOR UPDATE', locked
                    )
                async with pg_store.db.connection() as conn:
                    tx = conn.transaction()
                    await tx.start()
                    try:
                        claimed = {
                            r["id"] for r in await conn.fetch(pg_store.q["claim_ordered"], *args)
                        }
                    finally:
                        await tx.rollback()
            problem = state.violation(claimed, limit)
            assert problem is None, f"seed {seed}: {problem}"
            first, alone = state.expected_progress()
            if first is not None:
                assert first.id in claimed, f"seed {seed}: {first} not claimed ({sorted(claimed)})"
                assert not alone or claimed == {first.id}, f"seed {seed}: suspect not alone"
            else:
                assert not claimed
    finally:
        await locker.close()
        await admin.close()
