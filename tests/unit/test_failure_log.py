"""The relay's failure lines: one per message while rare, bounded in a burst, ids kept."""

from __future__ import annotations

import logging

import pytest

from outboxer.message import Message
from outboxer.relay.failures import FailedPublish, FailureLog

log = logging.getLogger("outboxer.relay")


def failures(count: int, *, dead: bool = False, start: int = 0) -> list[FailedPublish]:
    return [
        FailedPublish(
            Message(id=f"m{n}", topic="orders", payload=b"{}", key=f"o{n}", type="OrderPlaced"),
            attempts=3 if dead else 1,
            reason="boom",
            retry_in=None if dead else 1.0,
        )
        for n in range(start, start + count)
    ]


def test_a_burst_of_10k_failures_in_one_second_writes_a_bounded_number_of_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    lines = FailureLog(log, max_attempts=3, clock=lambda: now[0], lines_per_second=20)
    with caplog.at_level(logging.WARNING, logger="outboxer.relay"):
        lines.batch(failures(5))  # rare: one line each
        assert len(caplog.records) == 5
        assert caplog.records[0].getMessage() == (
            "message m0 (key 'o0', type 'OrderPlaced') failed, attempt 1 of 3; "
            "retrying in 1.0s: boom"
        )
        for batch in range(100):  # 10,000 more in the same second, 100 a batch
            now[0] += 0.009
            lines.batch(failures(50, start=batch * 100) + failures(50, dead=True, start=50))
        burst = caplog.records[5:]
        assert len(burst) == 15  # the rest of the second's budget: one line per batch and kind
        assert (
            burst[0]
            .getMessage()
            .startswith("50 messages of one batch failed and will be retried: m0, m1, ")
        )
        assert "; the first: message m0 (key 'o0'" in burst[0].getMessage()
        assert burst[1].getMessage().startswith("50 messages of one batch moved to dead letter: ")
        assert burst[1].levelno == logging.ERROR
        assert len(burst[0].message_ids) == 50  # type: ignore[attr-defined]
        now[0] = 1.5
        lines.batch(failures(1))
    unlogged = caplog.records[20].getMessage()
    assert unlogged.startswith("4600 publish retries and 4650 dead letters were not logged")
    assert caplog.records[21].getMessage().startswith("message m0 ")  # a new second's budget


def test_a_dead_letter_line_names_id_key_type_attempts_and_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="outboxer.relay"):
        FailureLog(log, max_attempts=3, clock=lambda: 0.0).batch(failures(1, dead=True))
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert record.getMessage() == (
        "message m0 (key 'o0', type 'OrderPlaced') moved to dead letter after 3 attempts: boom"
    )


def test_failures_without_text_get_a_reason_on_every_path() -> None:
    from outboxer.ports import NO_REASON, ConsumeFailure, Retry, Settlement

    assert Retry("m1", 1.0, "").reason == NO_REASON
    assert ConsumeFailure("  ", None).reason == NO_REASON
    assert Settlement(dead=[("m1", ""), ("m2", "why")]).dead_letters() == [
        ("m1", NO_REASON),
        ("m2", "why"),
    ]
