"""The seed's defaults, pinned on a virtual clock: outage pauses, attempts, sweep cadence.

Each test runs a relay with ``RelaySettings()`` (nothing overridden but what the test names) on
:class:`~tests.simulation.virtual_time.VirtualTimeLoop`, whose clock jumps to the next timer: the
minutes these defaults stand for take milliseconds, and the times asserted are the relay's own.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import pytest

from outboxer.config import RelaySettings
from outboxer.errors import BrokerUnavailable, PublishError, RetryablePublishError
from outboxer.message import Message
from outboxer.ports import ClaimRequest, Settlement, SweepReport
from outboxer.relay import Relay
from outboxer.testing import InMemoryStore, RecordingPublisher
from tests.simulation.virtual_time import VirtualTimeLoop

T = TypeVar("T")
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def on_virtual_time(scenario: Callable[[], Awaitable[T]]) -> T:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(scenario())
    finally:
        loop.close()


def virtual_store(offset: list[float] | None = None) -> InMemoryStore:
    """A store whose clock is the running loop's (plus ``offset[0]`` seconds, to age rows)."""
    shift = offset if offset is not None else [0.0]
    return InMemoryStore(
        clock=lambda: EPOCH + dt.timedelta(seconds=asyncio.get_running_loop().time() + shift[0])
    )


def test_outage_pauses_double_from_5_s_to_60_s_and_reset_after_a_success() -> None:
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        store = virtual_store()
        store.enqueue("orders", {"n": 1})
        calls: list[float] = []

        class Outages(RecordingPublisher):
            async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
                calls.append(loop.time())
                if len(calls) == 7:  # the broker is back: then a second outage begins
                    store.enqueue("orders", {"n": 2})
                    return await super().publish(messages)
                if len(calls) in (1, 2, 3, 4, 5, 6, 8, 9):
                    raise BrokerUnavailable("connection refused")
                return await super().publish(messages)

        await Relay(store, Outages(), RelaySettings()).drain(timeout=3600)
        return calls

    calls = on_virtual_time(scenario)
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(calls)]
    # 6 failed rounds: 5, 10, 20, 40, 60 (capped), 60; the 7th call succeeds. The next outage
    # starts again at 5 s.
    assert gaps[:6] == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    assert gaps[7:] == [5.0, 10.0]


def test_a_poison_order_is_tried_3_times_then_dead_lettered_with_lines_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> tuple[list[float], float, InMemoryStore]:
        loop = asyncio.get_running_loop()
        store = virtual_store()
        written = loop.time()
        store.enqueue("orders", {"order": "A-17"}, key="A-17", type="OrderPlaced")
        attempts: list[float] = []

        def poison(message: Message) -> PublishError | None:
            attempts.append(loop.time())
            return RetryablePublishError("schema registry rejected the payload")

        await Relay(store, RecordingPublisher(fail=poison), RelaySettings()).drain(timeout=600)
        return attempts, loop.time() - written, store

    with caplog.at_level(logging.INFO, logger="outboxer.relay"):
        attempts, took, store = on_virtual_time(scenario)
    assert len(attempts) == 3
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    poll = RelaySettings().poll_interval  # an idle relay looks again at most this late
    assert 1.0 <= gaps[0] <= 1.0 + poll and 2.0 <= gaps[1] <= 2.0 + poll
    assert took <= 3.0 + 3 * poll  # write → dead letter with the defaults
    lines = [r.getMessage() for r in caplog.records if r.name == "outboxer.relay"]
    retries = [line for line in lines if "failed, attempt" in line]
    assert [line.split(", attempt ")[1][:6] for line in retries] == ["1 of 3", "2 of 3"]
    assert all("key 'A-17', type 'OrderPlaced'" in line for line in retries)
    [dead] = [line for line in lines if "moved to dead letter" in line]
    assert "key 'A-17'" in dead and "after 3 attempts" in dead
    assert dead.endswith("schema registry rejected the payload")
    [letter] = on_virtual_time(lambda: _dead_letters(store))
    assert (letter.key, letter.attempts) == ("A-17", 3)
    assert letter.failure_reason == "schema registry rejected the payload"


async def _dead_letters(store: InMemoryStore) -> list:  # type: ignore[type-arg]
    from outboxer.ports import DeadLetterFilter

    return list((await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)).items)


def test_one_sweep_a_minute_purging_50_expired_dead_letters_at_a_time() -> None:
    async def scenario() -> list[tuple[float, SweepReport]]:
        loop = asyncio.get_running_loop()
        age = [0.0]
        store = virtual_store(age)
        ids = [store.enqueue("t", {"n": n}) for n in range(120)]
        claim = await store.claim_batch(
            ClaimRequest(limit=120, lease_seconds=30, ordered=False, relay_id="x")
        )
        await store.settle(claim, Settlement(dead=[(i, "old") for i in ids]))
        age[0] = RelaySettings().dead_letter_retention + 1  # they are past their retention now
        sweeps: list[tuple[float, SweepReport]] = []
        sweep = store.sweep

        async def recorded(**kwargs: float | int | str) -> SweepReport | None:
            report = await sweep(**kwargs)  # type: ignore[arg-type]
            if report is not None:
                sweeps.append((loop.time(), report))
            return report

        store.sweep = recorded  # type: ignore[method-assign]
        relay = Relay(store, RecordingPublisher(), RelaySettings())
        running = asyncio.create_task(relay.run())
        await asyncio.sleep(190)
        relay.stop()
        await running
        return sweeps

    sweeps = on_virtual_time(scenario)
    assert [round(at) for at, _ in sweeps] == [0, 60, 120, 180]
    assert [report.purged for _, report in sweeps] == [50, 50, 20, 0]


def test_relays_and_consumers_log_the_last_sweep_when_they_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from outboxer.inbox import HandlerRegistry, Inbox, InboxSettings, run_consumer

    class IdleBroker:
        async def __aenter__(self) -> IdleBroker:
            return self

        async def __aexit__(self, *exc_info: object) -> None:
            return None

        async def run(self, deliver: object, stop: asyncio.Event) -> None:
            await stop.wait()

    async def scenario() -> None:
        store = virtual_store()
        await store.sweep(sweeper="earlier", interval=60, retention_seconds=0, batch_size=50)
        relay = Relay(store, RecordingPublisher(), RelaySettings())
        await relay.drain(timeout=60)
        inbox = Inbox(store, HandlerRegistry(), InboxSettings(consumer="stock"))
        loop = asyncio.get_running_loop()
        loop.call_later(1, inbox.stop)
        await run_consumer(inbox, IdleBroker(), sweeper=store)

    with caplog.at_level(logging.INFO):
        on_virtual_time(scenario)
    reports = [r.name for r in caplog.records if r.getMessage().startswith("last sweep: {")]
    assert reports == ["outboxer.relay", "outboxer.consumer"]
    assert '"swept_by": "earlier"' in caplog.records[1].getMessage()


class NoDoorbell(InMemoryStore):
    """A store that never rings (PostgreSQL since schema 6): only polling finds new messages."""

    async def wait_for_messages(self, timeout: float) -> bool:
        await asyncio.sleep(timeout)
        return False


def test_an_idle_relay_sees_a_message_committed_at_any_moment_within_one_poll_interval() -> None:
    """No lost wake-up, on many schedules: messages committed at random moments (during work,
    just after it, deep in an idle period) are each claimed at most ``poll_interval`` (50 ms)
    after their commit, and right after a claim that found work the relay looks again within
    ``min_poll_interval`` (2 ms)."""

    async def scenario() -> tuple[list[float], list[float]]:
        loop = asyncio.get_running_loop()
        store = NoDoorbell(clock=lambda: EPOCH + dt.timedelta(seconds=loop.time()))
        claimed: dict[str, float] = {}

        class Timed(RecordingPublisher):
            async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
                for message in messages:
                    claimed[message.id] = loop.time()
                return await super().publish(messages)

        relay = Relay(store, Timed(), RelaySettings())
        task = asyncio.create_task(relay.run())
        rng = random.Random(15)
        delays, busy = [], []
        for n in range(300):
            await asyncio.sleep(rng.choice([0.0, 0.001, rng.uniform(0, 0.2), rng.uniform(0, 5)]))
            message_id = store.enqueue("orders", {"n": n})
            committed = loop.time()
            while message_id not in claimed:
                await asyncio.sleep(0.0001)
            delays.append(claimed[message_id] - committed)
            # a second one at once: the relay just found work, so it looks again soon
            second = store.enqueue("orders", {"n": n, "again": True})
            committed = loop.time()
            while second not in claimed:
                await asyncio.sleep(0.0001)
            busy.append(claimed[second] - committed)
        relay.stop()
        await task
        return delays, busy

    delays, busy = on_virtual_time(scenario)
    settings = RelaySettings()
    assert max(delays) <= settings.poll_interval + 1e-6
    assert max(delays) > settings.poll_interval / 2  # some commits did land deep in idleness
    assert max(busy) <= 2 * settings.min_poll_interval + 1e-6


@pytest.mark.parametrize("heartbeat", [5.0, 14.0, 60.0, 3600.0])
def test_a_relay_with_a_long_heartbeat_interval_is_always_listed_live(heartbeat: float) -> None:
    """Found by a probe: ``--lease-seconds 300 --heartbeat-interval 60`` (both in range) made a
    healthy relay vanish from ``stats`` 15 s after each heartbeat (a relay is live while its
    heartbeat is younger than that): ``/readyz`` failed, and its messages in flight were
    reported as held by a dead relay (``unowned_in_flight``)."""

    async def scenario() -> list[tuple[int, int]]:
        store = virtual_store()
        store.enqueue("orders", {"n": 1})
        settings = RelaySettings(lease_seconds=3600, heartbeat_interval=heartbeat)

        class Slow(RecordingPublisher):
            async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
                await asyncio.sleep(600)  # in flight for ten minutes
                return await super().publish(messages)

        relay = Relay(store, Slow(), settings)
        running = asyncio.create_task(relay.run())
        seen = []
        for _ in range(300):
            await asyncio.sleep(1.7)
            stats = await store.stats()
            seen.append((len(stats.relays), stats.unowned_in_flight))
        relay.stop()
        await running
        return seen

    seen = on_virtual_time(scenario)
    assert set(seen[3:]) == {(1, 0)}
