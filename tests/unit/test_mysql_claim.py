"""Which candidates of an ordered MySQL claim are kept (``keep_in_order``), on rows as the
claim's SELECT returns them: seq, key, head (the key's oldest row) and next_seq (the row of the
key after this one), read at that instant, uncommitted rows included."""

from __future__ import annotations

from typing import Any

import pytest

from outboxer.stores.mysql.relay import keep_in_order, seq_ranges


def row(seq: int, key: bytes | None, head: int | None, next_seq: int | None) -> dict[str, Any]:
    return {"seq": seq, "key": key, "head": head, "next_seq": next_seq}


def seqs(rows: list[dict[str, Any]]) -> list[int]:
    return [r["seq"] for r in rows]


def test_a_run_from_the_head_of_its_key_is_kept() -> None:
    rows = [row(3, b"K", 3, 4), row(1, b"J", 1, None), row(4, b"K", 3, 9)]
    assert seqs(keep_in_order(rows)) == [1, 3, 4]


def test_a_candidate_behind_a_row_of_its_key_outside_the_batch_is_not_kept() -> None:
    # seq 1 of K is locked by another relay, or still being written: it is K's head, no candidate
    rows = [row(2, b"K", 1, 3), row(3, b"K", 1, None), row(5, None, None, None)]
    assert seqs(keep_in_order(rows)) == [5]


def test_a_run_ends_at_a_row_of_its_key_missing_from_the_batch() -> None:
    # seq 4 of K is delayed (a retry) or locked: seq 5 does not follow seq 3
    assert seqs(keep_in_order([row(3, b"K", 3, 4), row(5, b"K", 3, 6)])) == [3]


def test_nothing_after_a_refused_candidate_of_its_key_is_kept() -> None:
    """The probes are read row by row, not from one snapshot: whatever a later candidate's own
    probes say (here, that it heads its key), after a refused candidate its key stops."""
    rows = [row(3, b"K", 2, 4), row(4, b"K", 4, None), row(6, b"J", 6, None)]
    assert seqs(keep_in_order(rows)) == [6]


def test_the_ranges_of_a_bounded_claim_start_at_the_heads_and_merge_when_they_touch() -> None:
    assert seq_ranges([], 10) == ""
    assert seq_ranges([30, 1, 5, 41], 10) == "o.seq BETWEEN 1 AND 15 OR o.seq BETWEEN 30 AND 51"


async def test_a_deadlock_victim_runs_again_and_other_failures_do_not() -> None:
    """InnoDB rolls a deadlock victim back whole: claims, replays and purges run again at once
    (two operators replaying the same dead letters got a 503 on MariaDB: a probe); any other
    unavailability is the caller's, and so is a deadlock that keeps coming back."""
    from asyncmy.errors import OperationalError

    from outboxer.errors import StoreUnavailable
    from outboxer.stores.mysql.connection import retried_on_deadlock

    def failure(code: int) -> StoreUnavailable:
        error = StoreUnavailable(f"MySQL: {code}")
        error.__cause__ = OperationalError(code, "Deadlock found when trying to get lock")
        return error

    runs: list[int] = []

    async def transaction(failures: list[int]) -> str:
        runs.append(len(runs))
        if failures:
            raise failure(failures.pop(0))
        return "done"

    twice = [1213, 1213]
    assert await retried_on_deadlock(lambda: transaction(twice)) == "done"
    assert len(runs) == 3
    runs.clear()
    with pytest.raises(StoreUnavailable, match="1205"):  # a lock wait timeout: not retried
        await retried_on_deadlock(lambda: transaction([1205, 1205]))
    assert len(runs) == 1
    runs.clear()
    with pytest.raises(StoreUnavailable, match="1213"):
        await retried_on_deadlock(lambda: transaction([1213]))  # every time
    assert len(runs) == 3
