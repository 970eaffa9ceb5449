"""Message ids are canonical UUIDv7 strings, one at a time or a batch at once."""

from __future__ import annotations

import time
import uuid

from outboxer._ids import new_message_id, new_message_ids


def test_ids_are_canonical_uuid7_distinct_and_time_ordered() -> None:
    before = time.time_ns() // 1_000_000
    ids = [new_message_id() for _ in range(1000)] + new_message_ids(5000)
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    for value in ids:
        parsed = uuid.UUID(value)
        assert str(parsed) == value  # lowercase, hyphenated 8-4-4-4-12
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
        assert before <= parsed.int >> 80 <= after  # the 48-bit millisecond stamp
    assert new_message_ids(0) == []
