"""The store contract against the in-memory fake users get in ``outboxer.testing``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from outboxer import Backoff, HandlerContext, HandlerRegistry, Message
from outboxer.inbox import Inbox, InboxSettings
from outboxer.ports import ClaimRequest, DeadLetterFilter
from outboxer.testing import InMemoryStore
from tests.contracts.store import StoreContract


class TestInMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> InMemoryStore:
        return InMemoryStore()

    @pytest.fixture
    def add(self, store: InMemoryStore) -> Any:
        async def add(topic: str, payload: object, **options: Any) -> str:
            return store.enqueue(topic, payload, **options)

        return add


@pytest.mark.parametrize(
    "epoch", [dt.datetime(2020, 1, 1, tzinfo=dt.UTC), dt.datetime(2100, 1, 1, tzinfo=dt.UTC)]
)
async def test_consume_retries_and_replays_follow_the_fakes_clock(epoch: dt.datetime) -> None:
    # A failed consumption was due at the wall clock's now + its delay, and a replayed consume
    # dead letter at the wall clock's now, whatever clock= the fake was given: on a clock behind
    # the wall clock neither was ever re-driven (production re-drives both), on one ahead both
    # were re-driven at once, before their delay (a probe).
    now = [epoch]
    store = InMemoryStore(clock=lambda: now[0])
    registry = HandlerRegistry()
    calls: list[int] = []

    @registry.handler("T")
    def handle(message: Message, ctx: HandlerContext) -> None:
        calls.append(ctx.attempt)
        if len(calls) <= 2:
            raise ValueError("not yet")

    settings = InboxSettings(consumer="c", max_attempts=2, retry=Backoff(base=60, factor=1, cap=60))
    inbox = Inbox(store, registry, settings)
    assert await inbox.receive(Message(id="m", topic="t", payload=b"{}", type="T")) == "retrying"
    assert await inbox.redrive() == []  # its 60 s have not passed
    now[0] += dt.timedelta(seconds=61)
    assert await inbox.redrive() == ["dead"]
    assert await store.replay_dead_letters(DeadLetterFilter(ids=["m"])) == ["m"]
    assert await inbox.redrive() == ["handled"]  # a replay is due at once
    assert calls == [1, 2, 1]


@pytest.mark.parametrize(
    "epoch", [dt.datetime(2020, 1, 1, tzinfo=dt.UTC), dt.datetime(2100, 1, 1, tzinfo=dt.UTC)]
)
async def test_a_delay_given_as_a_timedelta_counts_from_the_fakes_clock(epoch: dt.datetime) -> None:
    # enqueue(available_at=timedelta(...)) counted from the wall clock, whatever clock= said:
    # on a clock behind it the message waited years (a drain never published it), on one ahead
    # it was due at once (a probe).
    now = [epoch]
    store = InMemoryStore(clock=lambda: now[0])
    later = store.enqueue("t", {"n": 1}, available_at=dt.timedelta(seconds=30))
    message = await store.get_message(later)
    assert (message.state, message.next_attempt_at) == (
        "scheduled",
        epoch + dt.timedelta(seconds=30),
    )
    request = ClaimRequest(limit=10, lease_seconds=30, ordered=True, relay_id="r")
    assert (await store.claim_batch(request)).messages == []
    now[0] += dt.timedelta(seconds=31)
    assert [m.id for m in (await store.claim_batch(request)).messages] == [later]
