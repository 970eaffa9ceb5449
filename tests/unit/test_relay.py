"""The relay loop against the in-memory store: retries, dead letters, backoff, order, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from outboxer.config import Backoff, RelaySettings
from outboxer.errors import (
    BrokerUnavailable,
    PermanentPublishError,
    PublishError,
    RelayFailed,
    RetryablePublishError,
)
from outboxer.message import Message
from outboxer.ports import Claim, ClaimRequest, DeadLetterFilter, Settlement, SweepReport
from outboxer.relay import Relay
from outboxer.relay.relay import MAX_RETRY_AFTER
from outboxer.stores.sqlite import SqliteStore
from outboxer.testing import InMemoryStore, RecordingPublisher

FAST = RelaySettings(
    batch_size=50,
    retry=Backoff(base=0.01, factor=2, cap=0.05),
    outage=Backoff(base=0.05, factor=2, cap=0.2),
    min_poll_interval=0.005,
    poll_interval=0.02,
    heartbeat_interval=0.5,
)


def settings(**changes: object) -> RelaySettings:
    from dataclasses import replace

    return replace(FAST, **changes)  # type: ignore[arg-type]


async def test_poison_is_dead_lettered_after_max_attempts_while_others_flow() -> None:
    store = InMemoryStore()
    poison = store.enqueue("orders", {"bad": True}, key="p", type="Poison")
    good = [store.enqueue("orders", {"n": n}, key=str(n)) for n in range(100)]
    publisher = RecordingPublisher(
        fail=lambda m: RetryablePublishError("cannot decode") if m.type == "Poison" else None
    )
    counters = await Relay(store, publisher, FAST).drain(timeout=10)
    assert sorted(m.id for m in publisher.messages) == sorted(good)
    assert [m.id for m in publisher.attempts].count(poison) == 3
    dead = await store.get_dead_letter(poison)
    assert dead.attempts == 3 and dead.failure_reason == "cannot decode"
    assert counters.dead_lettered == 1 and counters.retried == 2
    assert counters.outages == 0  # a bad message never triggers the broker backoff


async def test_permanent_failure_is_dead_lettered_at_once() -> None:
    store = InMemoryStore()
    bad = store.enqueue("t", "x", type="TooLarge")
    publisher = RecordingPublisher(
        fail=lambda m: PermanentPublishError("message too large") if m.type else None
    )
    await Relay(store, publisher, FAST).drain(timeout=5)
    assert (await store.get_dead_letter(bad)).attempts == 1


async def test_failing_message_blocks_only_its_own_key_and_order_holds() -> None:
    store = InMemoryStore()
    for n in range(5):
        store.enqueue("t", {"n": n}, key="slow")
        store.enqueue("t", {"n": n}, key="fast")
    failures = {"left": 2}

    def flaky(message: Message) -> PublishError | None:
        if message.key == "slow" and message.json() == {"n": 1} and failures["left"]:
            failures["left"] -= 1
            return RetryablePublishError("try again")
        return None

    publisher = RecordingPublisher(fail=flaky)
    await Relay(store, publisher, settings(max_attempts=5)).drain(timeout=10)
    for key in ("slow", "fast"):
        assert [m.json()["n"] for m in publisher.messages if m.key == key] == list(range(5))
    # "slow" n=2..4 were never attempted before n=1 succeeded
    attempts = [m.json()["n"] for m in publisher.attempts if m.key == "slow"]
    assert attempts == [0, 1, 1, 1, 2, 3, 4]


class SettleLog(InMemoryStore):
    """The in-memory store, recording every settlement in the order the relay applied them."""

    def __init__(self) -> None:
        super().__init__()
        self.settlements: list[Settlement] = []

    async def settle(self, claim: Claim, settlement: Settlement) -> None:
        self.settlements.append(settlement)
        await super().settle(claim, settlement)

    def published(self) -> list[str]:
        return [i for s in self.settlements for i in s.published]


async def test_a_retry_waits_at_least_what_the_broker_asked_for() -> None:
    """A webhook answering 503 with ``Retry-After`` (as docs/brokers/http.md tells receivers
    to) had its message retried after the relay's own short delay and dead-lettered within
    seconds (a probe). The retry waits at least that long, at most an hour."""
    store = SettleLog()
    asks = {store.enqueue("t", {}, key=f"k{n}"): ask for n, ask in enumerate((30.0, 1e9, None))}

    def shedding(message: Message) -> PublishError | None:
        return RetryablePublishError("HTTP 503", retry_after=asks[message.id])

    relay = Relay(store, RecordingPublisher(fail=shedding), settings(max_attempts=5))
    with pytest.raises(TimeoutError):  # the first two wait, the third is retried on
        await relay.drain(timeout=0.5)
    first = {r.id: r.delay for s in store.settlements for r in s.retries[:3]}
    waits = [first[message_id] for message_id in asks]
    assert waits[:2] == [30.0, MAX_RETRY_AFTER]
    assert waits[2] < 1  # the relay's own delay


class CallSizes(RecordingPublisher):
    def __init__(self, *, keeps_key_order: bool) -> None:
        super().__init__(keeps_key_order=keeps_key_order)
        self.calls: list[int] = []

    async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
        self.calls.append(len(messages))
        return await super().publish(messages)


@pytest.mark.parametrize("keeps_key_order", [True, False])
async def test_a_keys_run_is_one_call_only_for_a_publisher_that_keeps_key_order(
    keeps_key_order: bool,
) -> None:
    store = InMemoryStore()
    ids = [store.enqueue("t", {"n": n}, key="one-key") for n in range(30)]
    publisher = CallSizes(keeps_key_order=keeps_key_order)
    await Relay(store, publisher, settings(batch_size=30)).drain(timeout=5)
    assert [m.id for m in publisher.messages] == ids
    # Waves: one message of the key per call, i.e. one broker round trip per message.
    assert publisher.calls == ([30] if keeps_key_order else [1] * 30)


@pytest.mark.parametrize("failure", ["retryable", "permanent", "outage"])
async def test_behind_a_failed_message_its_key_is_released_even_if_the_broker_took_it(
    failure: str,
) -> None:
    """Message 1 of "slow" fails (twice when retryable); the broker still takes 2..4, which were
    pipelined behind it. They must not settle as published before 1 did: they are released (no
    attempt counted) and published again after it; "fast" is not held back."""
    store = SettleLog()
    slow = [store.enqueue("t", {"n": n}, key="slow") for n in range(5)]
    fast = [store.enqueue("t", {"n": n}, key="fast") for n in range(5)]
    failures = {"left": 2 if failure == "retryable" else 1}
    error: PublishError = {
        "retryable": RetryablePublishError("try again"),
        "permanent": PermanentPublishError("refused"),
        "outage": BrokerUnavailable("connection lost"),
    }[failure]

    def flaky(message: Message) -> PublishError | None:
        if message.id == slow[1] and failures["left"]:
            failures["left"] -= 1
            return error
        return None

    publisher = RecordingPublisher(fail=flaky, keeps_key_order=True)
    counters = await Relay(store, publisher, settings(max_attempts=5)).drain(timeout=10)
    first = store.settlements[0]
    assert first.published == [slow[0], *fast]
    assert first.released == ([slow[1]] if failure == "outage" else []) + slow[2:]
    published = store.published()
    expected = slow if failure != "permanent" else [slow[0], *slow[2:]]
    assert [i for i in published if i in slow] == expected, "settled in write order"
    # The broker's copies: 2..4 once behind the failure (per failed round), then after 1.
    rounds = 2 if failure == "retryable" else 1
    copies = [m.id for m in publisher.messages if m.key == "slow"]
    assert copies == [slow[0], *slow[2:] * rounds, *expected[1:]]
    assert counters.released == 3 * rounds + (failure == "outage")
    assert counters.retried == (2 if failure == "retryable" else 0)  # only message 1 counts
    dead = (await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)).items
    assert [(d.id, d.attempts) for d in dead] == ([(slow[1], 1)] if failure == "permanent" else [])


async def test_chained_batches_continue_a_busy_key_and_a_failure_fences_the_later_ones() -> None:
    """With a pipelining publisher an ordered relay claims the next rows of a key it is still
    publishing (batches of 5 of one key, three in flight), publishes them only after the earlier
    call returned, and, when message 7 fails, releases 8-9 (behind it in its call) and the whole
    next batch, unsent (behind it across batches)."""
    store = SettleLog()
    ids = [store.enqueue("t", {"n": n}, key="a") for n in range(30)]
    claims: list[list[str]] = []
    original_claim = store.claim_batch

    async def claim_batch(request: ClaimRequest) -> Claim:
        claim = await original_claim(request)
        claims.append([m.id for m in claim.messages])
        return claim

    store.claim_batch = claim_batch  # type: ignore[method-assign]
    failures = {"left": 1}
    attempted: list[list[str]] = []

    class Slow(RecordingPublisher):
        async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
            attempted.append([m.id for m in messages])
            await asyncio.sleep(0.02)  # the next claims happen while this call is out
            return await super().publish(messages)

    def flaky(message: Message) -> PublishError | None:
        if message.id == ids[7] and failures["left"]:
            failures["left"] -= 1
            return RetryablePublishError("try again")
        return None

    publisher = Slow(fail=flaky, keeps_key_order=True)
    relay = Relay(store, publisher, settings(batch_size=5, max_in_flight_batches=3))
    await relay.drain(timeout=10)
    assert claims[:3] == [ids[0:5], ids[5:10], ids[10:15]], "claimed behind its own leases"
    assert store.published() == ids, "settled in write order"
    assert attempted[:2] == [ids[0:5], ids[5:10]]
    sent = [i for call in attempted for i in call]
    retried = [n for n, i in enumerate(sent) if i == ids[7]][1]
    assert sent.index(ids[10]) > retried, "the batch behind the failure was released unsent"
    assert (await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)).items == []


async def test_broker_outage_backs_off_exponentially_and_resets_after_success() -> None:
    store = InMemoryStore()
    store.enqueue("t", {"n": 1})
    calls: list[float] = []
    down_for = {"calls": 4}

    class Flaky(RecordingPublisher):
        async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
            calls.append(time.monotonic())
            if down_for["calls"]:
                down_for["calls"] -= 1
                raise BrokerUnavailable("connection refused")
            return await super().publish(messages)

    publisher = Flaky()
    relay = Relay(store, publisher, settings(outage=Backoff(base=0.1, factor=2, cap=0.3)))
    await relay.drain(timeout=10)
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    # 4 failures → pauses of 0.1, 0.2, 0.3 (cap), 0.3 before the 5th, successful call
    assert len(calls) == 5
    for gap, expected in zip(gaps, [0.1, 0.2, 0.3, 0.3], strict=True):
        assert gap >= expected * 0.9
    assert gaps[1] > gaps[0] * 1.5  # doubling, not a fixed retry loop
    assert relay.outage_failures == 0  # reset after the first success
    assert [m.attempts for m in publisher.messages] == [0]  # the outage cost no attempt


async def test_outage_counts_once_per_round_across_concurrent_batches() -> None:
    store = InMemoryStore()
    for n in range(40):
        store.enqueue("t", {"n": n})
    state = {"down": True}

    class Down(RecordingPublisher):
        async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
            if state["down"]:
                await asyncio.sleep(0.01)
                return [BrokerUnavailable("down")] * len(messages)
            return await super().publish(messages)

    relay = Relay(store, Down(), settings(batch_size=10, outage=Backoff(0.2, 2, 0.2)))
    task = asyncio.create_task(relay.run())
    await asyncio.sleep(0.1)
    assert relay.outage_failures == 1  # four batches failed together: one round, one pause
    state["down"] = False
    while (await store.stats()).pending:
        await asyncio.sleep(0.02)
    relay.stop()
    await task


async def test_graceful_stop_finishes_in_flight_batches() -> None:
    store = InMemoryStore()
    for n in range(20):
        store.enqueue("t", {"n": n})
    started = asyncio.Event()

    class Slow(RecordingPublisher):
        async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
            started.set()
            await asyncio.sleep(0.2)
            return await super().publish(messages)

    publisher = Slow()
    relay = Relay(store, publisher, settings(batch_size=20))
    task = asyncio.create_task(relay.run())
    await started.wait()
    relay.stop()
    counters = await task
    assert counters.published == 20 and len(publisher.messages) == 20
    stats = await store.stats()
    assert (stats.pending, stats.in_flight) == (0, 0)


async def test_stop_timeout_releases_the_batch_for_other_relays() -> None:
    store = InMemoryStore()
    ids = [store.enqueue("t", {"n": n}) for n in range(5)]
    started = asyncio.Event()

    class Hung(RecordingPublisher):
        async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
            started.set()
            await asyncio.sleep(3600)
            raise AssertionError("unreachable")

    relay = Relay(store, Hung(), settings(shutdown_timeout=0.1))
    task = asyncio.create_task(relay.run())
    await started.wait()
    relay.stop()
    counters = await task
    assert counters.released == 5
    stats = await store.stats()
    assert (stats.pending, stats.in_flight) == (5, 0)  # claimable at once, no attempt counted
    assert [m.attempts for m in store.pending_messages] == [0] * 5
    assert [m.id for m in store.pending_messages] == ids


async def test_a_publisher_bug_is_an_outage_not_the_messages_fault() -> None:
    store = InMemoryStore()
    ids = [store.enqueue("t", {"n": n}, key=str(n % 3)) for n in range(12)]
    broken = {"calls": 5}

    class NotOpenYet(RecordingPublisher):
        async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
            if broken["calls"]:
                broken["calls"] -= 1
                raise RuntimeError("publisher is not open")
            return await super().publish(messages)

    publisher = NotOpenYet()
    relay = Relay(store, publisher, settings(max_attempts=2, outage=Backoff(0.01, 2, 0.05)))
    counters = await relay.drain(timeout=10)
    assert broken["calls"] == 0  # the bug lasted five calls, more than max_attempts rounds
    assert sorted(m.id for m in publisher.messages) == sorted(ids)
    assert [m.attempts for m in publisher.messages] == [0] * 12  # no attempt was counted
    assert (await store.stats()).dead_letters == 0
    assert counters.dead_lettered == 0 and counters.retried == 0 and counters.outages >= 1


async def test_a_wrong_number_of_results_is_an_outage_too() -> None:
    store = InMemoryStore()
    message_id = store.enqueue("t", {"n": 1})
    wrong = {"calls": 4}

    class Miscounting(RecordingPublisher):
        async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
            if wrong["calls"]:
                wrong["calls"] -= 1
                return []
            return await super().publish(messages)

    publisher = Miscounting()
    relay = Relay(store, publisher, settings(max_attempts=1, outage=Backoff(0.01, 2, 0.05)))
    await relay.drain(timeout=10)
    assert [(m.id, m.attempts) for m in publisher.messages] == [(message_id, 0)]


class SweepFails(InMemoryStore):
    """A store whose sweep raises what a bug would (not a StoreError) a few times."""

    def __init__(self, errors: list[Exception], *, forever: Exception | None = None) -> None:
        super().__init__()
        self.errors = errors
        self.forever = forever
        self.sweeps = 0

    async def sweep(
        self, *, sweeper: str, interval: float, retention_seconds: float, batch_size: int
    ) -> SweepReport | None:
        self.sweeps += 1
        if self.forever is not None:
            raise self.forever
        if self.errors:
            raise self.errors.pop(0)
        return await super().sweep(
            sweeper=sweeper,
            interval=interval,
            retention_seconds=retention_seconds,
            batch_size=batch_size,
        )


async def test_a_dying_sweeper_is_restarted_and_leases_are_still_reaped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = SweepFails([RuntimeError("bug"), OverflowError("interval out of range")])
    orphan = store.enqueue("t", {"n": 1})
    # A relay that died holding a lease: only the sweeper can give the message back.
    await store.claim_batch(ClaimRequest(limit=1, lease_seconds=0.3, ordered=True, relay_id="dead"))
    publisher = RecordingPublisher()
    relay = Relay(store, publisher, settings(lease_seconds=0.2, heartbeat_interval=0.1))
    await relay.drain(timeout=10)
    assert [m.id for m in publisher.messages] == [orphan]
    assert store.errors == [] and store.sweeps >= 3  # it died twice and kept running
    deaths = [r for r in caplog.records if "background task sweeper died" in r.getMessage()]
    assert len(deaths) == 2 and all(r.exc_info for r in deaths)  # logged with the traceback


async def test_a_background_task_that_keeps_dying_stops_the_relay_loudly() -> None:
    store = SweepFails([], forever=RuntimeError("bug"))
    relay = Relay(store, RecordingPublisher(), settings(max_task_restarts=2))
    with pytest.raises(RelayFailed, match="sweeper died 3 times in a row") as failed:
        await asyncio.wait_for(relay.run(), timeout=10)
    assert isinstance(failed.value.__cause__, RuntimeError)
    assert store.sweeps == 3


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_relay_runs_once_at_a_time_and_not_again_after_a_stop(
    kind: str, tmp_path: Path
) -> None:
    # A second run() of one Relay replaced the first's heartbeat and sweeper, which were never
    # cancelled: the stopped relay heartbeated (listed live in stats) for good; and a run after
    # a stop returned at once, publishing nothing, without a word (a probe).
    async with contextlib.AsyncExitStack() as stack:
        store: InMemoryStore | SqliteStore = InMemoryStore()
        if kind == "sqlite":
            store = await stack.enter_async_context(SqliteStore(tmp_path / "outbox.db"))
            await store.migrate()
        await _runs_once_at_a_time(store)


async def _runs_once_at_a_time(store: InMemoryStore | SqliteStore) -> None:
    relay = Relay(store, RecordingPublisher(), FAST)
    running = asyncio.create_task(relay.run())
    await asyncio.sleep(0)  # (it has begun)
    with pytest.raises(RuntimeError, match="already running"):
        await asyncio.wait_for(relay.run(), timeout=5)
    with pytest.raises(RuntimeError, match="already running"):
        await relay.drain(timeout=5)
    relay.stop()
    await asyncio.wait_for(running, timeout=10)
    assert [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("outboxer-")] == []
    assert (await store.stats()).relays == []
    with pytest.raises(RuntimeError, match="make a new Relay"):
        await relay.drain(timeout=5)
    # A stop before the first run still makes it return at once (a signal during start-up).
    early = Relay(store, RecordingPublisher(), FAST)
    early.stop()
    await asyncio.wait_for(early.run(), timeout=10)


async def test_unordered_mode_publishes_a_whole_key_at_once() -> None:
    store = InMemoryStore()
    for n in range(30):
        store.enqueue("t", {"n": n}, key="one-key")
    batches: list[int] = []

    class Counting(RecordingPublisher):
        async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
            batches.append(len(messages))
            return await super().publish(messages)

    await Relay(store, Counting(), settings(ordered=False, batch_size=30)).drain(timeout=5)
    assert batches == [30]
    page = await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
    assert page.items == []


async def test_a_slow_settle_is_not_reported_as_a_lost_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Settling a batch of large rows may take longer than a third of the lease: the lease
    keeper's extension then finds the rows gone (the settle took them), which is no lost
    lease (a probe saw "80 of 80 messages in flight lost their lease" after every batch)."""

    class SlowSettle(InMemoryStore):
        async def settle(self, claim: Claim, settlement: Settlement) -> None:
            await super().settle(claim, settlement)  # the rows are gone ...
            await asyncio.sleep(0.25)  # ... before the settle returns

    store = SlowSettle()
    ids = [store.enqueue("orders", {"n": n}) for n in range(5)]
    publisher = RecordingPublisher()
    await Relay(store, publisher, settings(lease_seconds=0.3)).drain(timeout=10)
    assert sorted(m.id for m in publisher.messages) == sorted(ids)
    assert "lost their lease" not in caplog.text


async def test_a_broker_outage_of_more_than_1024_rounds_keeps_its_backoff() -> None:
    """Found by a probe: the pause grew as ``base * factor ** (rounds - 1)``, and 2.0 ** 1024
    overflows. With the defaults (capped at 60 s) a broker down for about 17 hours made every
    later round raise ``OverflowError``: no more pauses, a traceback per batch, and claims left
    to expire, so that healthy messages were taken for killers and dead-lettered."""
    store = InMemoryStore()
    message_id = store.enqueue("t", {"n": 1})
    down = {"rounds": 1100}

    class LongOutage(RecordingPublisher):
        async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
            if down["rounds"]:
                down["rounds"] -= 1
                raise BrokerUnavailable("connection refused")
            return await super().publish(messages)

    publisher = LongOutage()
    outage = Backoff(base=0.0001, factor=2, cap=0.0001)
    relay = Relay(store, publisher, settings(outage=outage, max_attempts=1))
    counters = await relay.drain(timeout=60)
    assert down["rounds"] == 0 and counters.outages == 1100
    assert [(m.id, m.attempts) for m in publisher.messages] == [(message_id, 0)]
    assert (await store.stats()).dead_letters == 0


async def test_a_retry_delay_past_the_float_range_is_the_cap() -> None:
    """Found by a probe: ``--retry-factor 100 --max-attempts 1000`` (both in range) overflowed
    at the 156th attempt (100 ** 155): the settle raised, the message was neither retried nor
    dead-lettered, and came back only when its lease expired."""
    store = InMemoryStore()
    message_id = store.enqueue("t", {"n": 1}, key="k")
    failures = {"left": 170}

    def flaky(message: Message) -> PublishError | None:
        if failures["left"]:
            failures["left"] -= 1
            return RetryablePublishError("try again")
        return None

    publisher = RecordingPublisher(fail=flaky)
    retry = Backoff(base=0.0001, factor=100, cap=0.0001)
    counters = await Relay(store, publisher, settings(retry=retry, max_attempts=1000)).drain(
        timeout=60
    )
    assert [(m.id, m.attempts) for m in publisher.messages] == [(message_id, 170)]
    assert counters.retried == 170 and counters.dead_lettered == 0


@pytest.mark.parametrize(
    ("base", "factor", "cap"), [(5.0, 2.0, 60.0), (5, 2, 60), (1.0, 100.0, 86400.0)]
)
def test_backoff_delays_stay_at_the_cap_for_any_number_of_failures(
    base: float, factor: float, cap: float
) -> None:
    backoff = Backoff(base=base, factor=factor, cap=cap)
    assert backoff.delay(0) == backoff.delay(1) == base
    for failures in (1025, 1026, 10_000, 10**9):
        delay = backoff.delay(failures)
        assert delay == cap and isinstance(delay, float)
    assert Backoff(base=5.0, factor=2.0, cap=60.0).delay(4) == 40.0
    assert Backoff(base=2.0, factor=1.0, cap=3.0).delay(10**9) == 2.0
