"""Which candidates of an ordered MySQL claim are kept (``keep_in_order``), on rows as the
claim's SELECT returns them: seq, key and position (rows of the key up to it, read at that
instant, uncommitted rows included)."""

from __future__ import annotations

from typing import Any

from outboxer.stores.mysql.relay import keep_in_order, seq_ranges


def row(seq: int, key: bytes | None, position: int) -> dict[str, Any]:
    return {"seq": seq, "key": key, "position": position}


def seqs(rows: list[dict[str, Any]]) -> list[int]:
    return [r["seq"] for r in rows]


def test_a_run_from_the_head_of_its_key_is_kept() -> None:
    assert seqs(keep_in_order([row(3, b"K", 1), row(1, b"J", 1), row(4, b"K", 2)])) == [1, 3, 4]


def test_a_candidate_behind_a_row_of_its_key_outside_the_batch_is_not_kept() -> None:
    # seq 1 of K is locked by another relay, or still being written: it counts, is no candidate
    assert seqs(keep_in_order([row(2, b"K", 2), row(3, b"K", 3), row(5, None, 0)])) == [5]


def test_nothing_after_a_refused_candidate_of_its_key_is_kept() -> None:
    """Positions are read row by row, not from one snapshot: between the reads of seq 3 and seq
    4, an acknowledgement removed the key's older row, so seq 4 counts 2 = its rank while seq 3
    (counted 2 too, rank 1) was refused. Keeping seq 4 would publish it before seq 3."""
    assert seqs(keep_in_order([row(3, b"K", 2), row(4, b"K", 2), row(6, b"J", 1)])) == [6]


def test_the_ranges_of_a_bounded_claim_start_at_the_heads_and_merge_when_they_touch() -> None:
    assert seq_ranges([], 10) == ""
    assert seq_ranges([30, 1, 5, 41], 10) == "o.seq BETWEEN 1 AND 15 OR o.seq BETWEEN 30 AND 51"
