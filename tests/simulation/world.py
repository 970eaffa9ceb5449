"""One simulated scenario: relays, a store and a broker under injected faults, then a check.

A scenario is a pure function of its seed. It runs on :class:`VirtualTimeLoop` in three phases:

1. **storm**: a writer commits messages at random times while 1-3 relay "processes" publish them
   and faults are injected at random points: a relay is killed (it simply never runs again: its
   calls never return, as after ``kill -9``) before or after any store or publisher call, or
   at a random instant; a relay freezes for longer than its lease (a GC pause, a partition) and
   wakes up; the store refuses a call, is slow, or commits a settle but loses the answer; the
   publisher reports an outage, raises an unexpected exception (a bug), is slow, or fails single
   messages (retryable). Killed relays are restarted, as a supervisor would.
2. **calm**: faults stop (a message's own nature does not: a rejected message stays rejected,
   and a message that kills the relay keeps killing it); the outbox must drain.
3. **check** against a model of what was written (:func:`check`).

Every message carries its ``uid`` (one per write) and its *nature* in its payload: ``healthy``
(the broker takes it, after at most ``max_attempts - 1`` retryable failures), ``permanent``
(always rejected), ``retry-forever`` (always a retryable failure), or ``killer`` (publishing it
kills the relay process).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime as dt
import json
import random
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from outboxer.config import Backoff, RelaySettings
from outboxer.errors import (
    BrokerUnavailable,
    ConfigurationError,
    PermanentPublishError,
    PermissionDenied,
    PublishError,
    RetryablePublishError,
    StoreUnavailable,
)
from outboxer.message import Message
from outboxer.outbox import Outbox
from outboxer.ports import Claim, ClaimRequest, DeadLetter, DeadLetterFilter, Settlement
from outboxer.relay import Relay
from outboxer.stores.sqlite import SqliteStore
from outboxer.testing import InMemoryStore
from tests.simulation.virtual_time import InlineConnection

#: Virtual time 0 is this instant (stores need a wall clock for leases and delays).
EPOCH = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)

#: Messages whose publish kills the relay (crash isolation dead-letters them).
KILLERS = True


@dataclasses.dataclass(slots=True)
class Faults:
    """Probabilities of each fault per call while the storm lasts."""

    active: bool = True
    store_error: float = 0.0
    store_slow: float = 0.0
    lost_settle: float = 0.0
    kill_in_store: float = 0.0
    outage: float = 0.0
    bug: float = 0.0
    slow_publish: float = 0.0
    kill_in_publish: float = 0.0
    retryable: float = 0.0
    denied: float = 0.0


@dataclasses.dataclass(slots=True)
class Written:
    uid: int
    id: str
    key: str | None
    nature: str


class Life:
    """One relay process: alive, frozen until a time, or killed (its calls never return).

    ``alone`` is the uid of the message it last published alone (None after a larger batch):
    an incident then (a kill, a freeze, a failed or slow store call) may cost that message its
    lease while alone, which crash isolation counts as a solo death, so it is tallied in
    ``incidents_alone``.
    """

    def __init__(self, incidents_alone: collections.Counter[int]) -> None:
        self.dead = False
        self.frozen_until = 0.0
        self.reaping = False
        self.died = asyncio.Event()
        self.alone: int | None = None
        self.incidents_alone = incidents_alone

    def incident(self) -> None:
        if self.alone is not None:
            self.incidents_alone[self.alone] += 1

    def kill(self) -> None:
        if not self.dead:
            self.incident()
        self.dead = True
        self.died.set()

    def freeze(self, until: float) -> None:
        self.incident()
        self.frozen_until = until

    async def gate(self) -> None:
        """Pass only while alive (a frozen process resumes later; a killed one never does)."""
        loop = asyncio.get_running_loop()
        while self.frozen_until > loop.time() and not self.dead:
            await asyncio.sleep(self.frozen_until - loop.time())
        if self.dead:
            if self.reaping:  # the scenario is over: end the tasks of the dead process
                raise asyncio.CancelledError
            await asyncio.Future()  # forever: a killed process does nothing more


class Tally(collections.Counter[str]):
    """Injected faults and notable events, by kind."""


class Injector:
    """What the faulty store and publisher of one relay share: its life, the dice, the tally."""

    def __init__(
        self, life: Life, rng: random.Random, faults: Faults, tally: Tally, lease: float
    ) -> None:
        self.life = life
        self.rng = rng
        self.faults = faults
        self.tally = tally
        self.lease = lease

    async def slow_down(self, kind: str, longest: float) -> None:
        self.tally[kind] += 1
        self.life.incident()
        await asyncio.sleep(self.rng.uniform(0, longest))
        await self.life.gate()

    async def kill(self, kind: str) -> bool:
        """Kill the relay now (this returns never), or return True: kill it after the call."""
        self.tally[kind] += 1
        if self.rng.random() < 0.5:
            self.life.kill()
            await self.life.gate()
        return True


class FaultyStore(Injector):
    """A relay's view of the store: faults injected around every call of the inner store."""

    def __init__(self, inner: Any, *args: Any) -> None:
        super().__init__(*args)
        self.inner = inner

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        life, rng, f = self.life, self.rng, self.faults
        await life.gate()
        kill_after = False
        if f.active:
            if rng.random() < f.store_error:
                self.tally["store error"] += 1
                life.incident()
                raise StoreUnavailable(f"injected: {name} refused")
            if f.denied and rng.random() < f.denied:  # (no draw without it: old seeds replay)
                # A grant revoked for a moment: the relay stops, its supervisor restarts it.
                self.tally["statement refused: no privilege"] += 1
                life.incident()
                raise PermissionDenied(f"injected: {name} denied")
            if rng.random() < f.store_slow:
                await self.slow_down("slow store call", 1.5 * self.lease)
            if rng.random() < f.kill_in_store:
                kill_after = await self.kill("relay killed at a store call")
        result = await getattr(self.inner, name)(*args, **kwargs)
        if name == "release_expired_leases":
            self.tally["messages taken back after a lease expired"] += result
        if kill_after:  # the call took effect, the relay never learns it
            life.kill()
        await life.gate()
        if name == "settle" and f.active and rng.random() < f.lost_settle:
            self.tally["settle committed, answer lost"] += 1
            raise StoreUnavailable("injected: connection lost after commit")
        return result

    async def claim_batch(self, request: ClaimRequest) -> Claim:
        result: Claim = await self._call("claim_batch", request)
        return result

    async def settle(self, claim: Claim, settlement: Settlement) -> None:
        await self._call("settle", claim, settlement)

    async def extend_lease(self, claim: Claim, lease_seconds: float) -> int:
        result: int = await self._call("extend_lease", claim, lease_seconds)
        return result

    async def release_expired_leases(self) -> int:
        result: int = await self._call("release_expired_leases")
        return result

    async def sweep(self, **kwargs: Any) -> Any:
        return await self._call("sweep", **kwargs)

    async def heartbeat(self, relay: Any) -> None:
        await self._call("heartbeat", relay)

    async def unregister(self, relay_id: str) -> None:
        await self._call("unregister", relay_id)

    async def last_sweep(self) -> Any:
        await self.life.gate()
        return await self.inner.last_sweep()

    async def stats(self) -> Any:
        await self.life.gate()
        return await self.inner.stats()

    async def wait_for_messages(self, timeout: float) -> bool:
        await self.life.gate()
        woke: bool = await self.inner.wait_for_messages(timeout)
        await self.life.gate()
        return woke


class Broker:
    """What the outside world saw: every acknowledged publish, in order (uids).

    ``behind`` holds the positions in ``deliveries`` of messages the broker took behind a failed
    message of their key in the same call (only a publisher that keeps key order gets several
    messages of a key in one call): the relay must not count those as published, so each needs
    another delivery after its predecessor.
    """

    def __init__(self) -> None:
        self.deliveries: list[int] = []
        self.behind: set[int] = set()
        self.retryable_left: dict[int, int] = {}


class FaultyPublisher(Injector):
    """A relay's publisher: decides each message by its nature, injects faults per call."""

    def __init__(
        self, broker: Broker, retry_budget: int, keeps_key_order: bool, *args: Any
    ) -> None:
        super().__init__(*args)
        self.broker = broker
        self.retry_budget = retry_budget
        # Like Kafka, RabbitMQ, NATS and Redis: a call is pipelined in order, and a message is
        # still taken behind a failed one of its key (the relay gets a key's run in one call).
        self.keeps_key_order = keeps_key_order

    async def __aenter__(self) -> FaultyPublisher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
        life, rng, f = self.life, self.rng, self.faults
        await life.gate()
        life.alone = json.loads(messages[0].payload)["uid"] if len(messages) == 1 else None
        kill_after = False
        if f.active:
            if rng.random() < f.outage:
                self.tally["broker outage"] += 1
                raise BrokerUnavailable("injected: connection refused")
            if rng.random() < f.bug:
                self.tally["publisher bug (unexpected exception)"] += 1
                raise RuntimeError("injected: publisher is not open")
            if rng.random() < f.slow_publish:
                await self.slow_down("slow publish", 3 * self.lease)
            if rng.random() < f.kill_in_publish:
                kill_after = await self.kill("relay killed while publishing")
        results: list[PublishError | None] = []
        failed_keys: set[str] = set()
        for message in messages:
            body = json.loads(message.payload)
            uid, nature = body["uid"], body["nature"]
            if nature == "killer":
                self.tally["relay killed by a killer message"] += 1
                life.kill()
                await life.gate()
            if nature == "permanent":
                results.append(PermanentPublishError("rejected by the broker"))
            elif nature == "retry-forever":
                results.append(RetryablePublishError("always fails"))
            elif (
                f.active
                and self.broker.retryable_left.setdefault(uid, self.retry_budget) > 0
                and rng.random() < f.retryable
            ):
                self.tally["retryable failure of a healthy message"] += 1
                self.broker.retryable_left[uid] -= 1
                results.append(RetryablePublishError("injected: try again"))
            else:
                if message.key in failed_keys:
                    self.broker.behind.add(len(self.broker.deliveries))
                self.broker.deliveries.append(uid)
                results.append(None)
            if results[-1] is not None and message.key is not None:
                failed_keys.add(message.key)
        if kill_after:
            life.kill()
        await life.gate()
        return results


@dataclasses.dataclass
class Outcome:
    seed: int
    store: str
    violations: list[str]
    tally: Tally
    messages: int
    virtual_seconds: float


class Scenario:
    """The random choices of one seed, and the run."""

    def __init__(self, seed: int, store_kind: str, workdir: Path) -> None:
        self.seed = seed
        self.store_kind = store_kind
        self.workdir = workdir
        rng = self.rng = random.Random(seed)
        self.tally = Tally()
        lease = rng.choice([3.0, 10.0, 30.0])
        self.max_attempts = rng.randint(3, 6)
        self.settings = RelaySettings(
            batch_size=rng.randint(1, 8),
            max_in_flight_batches=rng.randint(1, 3),
            ordered=rng.random() < 0.85,
            max_attempts=self.max_attempts,
            lease_seconds=lease,
            heartbeat_interval=lease / 3,
            retry=Backoff(base=rng.uniform(0.2, 2.0), factor=2, cap=20.0),
            outage=Backoff(base=rng.uniform(0.5, 2.0), factor=2, cap=10.0),
            poll_interval=rng.choice([1.0, 5.0]),
            min_poll_interval=0.05,
            shutdown_timeout=rng.uniform(0.5, 5.0),
            sweep_interval=rng.uniform(5.0, 60.0),
        )
        self.relays = rng.randint(1, 3)
        self.storm_seconds = rng.uniform(20.0, 200.0)
        self.message_count = rng.randint(5, 60)
        self.keys = [f"k{n}" for n in range(rng.randint(1, 6))]
        p = rng.random
        self.faults = Faults(
            store_error=p() * 0.1,
            store_slow=p() * 0.05,
            lost_settle=p() * 0.1,
            kill_in_store=p() * 0.02,
            outage=p() * 0.1,
            bug=p() * 0.05,
            slow_publish=p() * 0.1,
            kill_in_publish=p() * 0.05,
            retryable=p() * 0.3,
        )
        self.random_kills = rng.randint(0, 3)
        self.freezes = rng.randint(0, 2)
        self.natures = {
            "permanent": p() * 0.1,
            "retry-forever": p() * 0.05,
            "killer": p() * 0.05 if KILLERS and rng.random() < 0.3 else 0.0,
        }
        self.reuse_ids = p() * 0.3
        # Drawn apart from the scenario's stream, so that the seeds of a waves broker replay
        # the schedules they had before this choice existed.
        self.keeps_key_order = random.Random(seed * 7919 + 17).random() < 0.5
        denied = random.Random(seed * 104729 + 3)  # (apart too, for the same reason)
        self.faults.denied = denied.random() * 0.02 if denied.random() < 0.25 else 0.0
        self.broker = Broker()
        self.written: list[Written] = []
        self.lives: list[Life] = []
        self.tasks: list[asyncio.Task[Any]] = []
        self.stores: list[Any] = []
        self.relay_errors: list[str] = []
        self.incidents_alone: collections.Counter[int] = collections.Counter()

    # -- the run -----------------------------------------------------------------------------

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def run(self) -> Outcome:
        self.outbox = await self._open_store()
        violations: list[str] = []
        try:
            storm_over = asyncio.Event()
            calm = asyncio.Event()
            slots = [
                asyncio.create_task(self._slot(n, storm_over, calm)) for n in range(self.relays)
            ]
            writer = asyncio.create_task(self._write())
            chaos = asyncio.create_task(self._chaos())
            await asyncio.sleep(self.storm_seconds)
            await writer
            chaos.cancel()
            self.faults.active = False
            storm_over.set()
            drained = await self._wait_drained(budget=3600.0)
            if not drained:
                stats = await self.outbox.stats()
                violations.append(
                    f"stuck: the outbox did not drain within a virtual hour after the faults "
                    f"stopped (pending {stats.pending}, in flight {stats.in_flight})"
                )
            calm.set()
            await asyncio.gather(*slots)
            violations += self.relay_errors
            violations += await self.check()
        finally:
            await self._clear_away()
        return Outcome(
            self.seed,
            self.store_kind,
            violations,
            self.tally,
            len(self.written),
            self.now(),
        )

    async def _open_store(self) -> Any:
        if self.store_kind == "memory":
            if not hasattr(self, "_memory"):
                loop = asyncio.get_running_loop()
                self._memory = InMemoryStore(
                    clock=lambda: EPOCH + dt.timedelta(seconds=loop.time())
                )
            return self._memory
        store = SimSqliteStore(self.workdir / "outbox.db", clock=self._epoch_seconds)
        await store.open()
        if not self.stores:
            await store.migrate()
        self.stores.append(store)
        return store

    def _epoch_seconds(self) -> float:
        return EPOCH.timestamp() + self.now()

    async def _write(self) -> None:
        """Commit the messages at random instants of the first 80% of the storm."""
        rng = self.rng
        times = sorted(rng.uniform(0, 0.8 * self.storm_seconds) for _ in range(self.message_count))
        writer = (
            sqlite3.connect(self.workdir / "outbox.db", isolation_level=None)
            if self.store_kind == "sqlite"
            else None
        )
        try:
            for uid, at in enumerate(times):
                await asyncio.sleep(max(0.0, at - self.now()))
                nature = "healthy"
                for candidate, chance in self.natures.items():
                    if rng.random() < chance:
                        nature = candidate
                key = rng.choice(self.keys) if rng.random() < 0.9 else None
                message_id = f"m{uid}"
                if self.written and rng.random() < self.reuse_ids:
                    # Ids may be reused: most interesting is the id of a dead letter.
                    message_id = rng.choice(self.written).id
                delay = rng.uniform(0, 30) if rng.random() < 0.05 else 0.0
                available = EPOCH + dt.timedelta(seconds=self.now() + delay)
                payload = {"uid": uid, "nature": nature}
                for attempt_id in (message_id, f"m{uid}"):
                    try:
                        self._enqueue(writer, attempt_id, key, payload, available)
                    except (ConfigurationError, sqlite3.IntegrityError):
                        continue  # that id is still in the outbox
                    self.written.append(Written(uid, attempt_id, key, nature))
                    self.tally["messages written"] += 1
                    self.tally["ids reused"] += attempt_id != f"m{uid}"
                    break
        finally:
            if writer is not None:
                writer.close()

    def _enqueue(
        self,
        writer: sqlite3.Connection | None,
        message_id: str,
        key: str | None,
        payload: dict[str, Any],
        available: dt.datetime,
    ) -> None:
        options = {"key": key, "id": message_id, "available_at": available}
        if writer is None:
            self._memory.enqueue("t", payload, **options)
        else:
            writer.execute("BEGIN")
            try:
                Outbox().enqueue(writer, "t", payload, **options)
            except BaseException:
                writer.execute("ROLLBACK")
                raise
            writer.execute("COMMIT")

    async def _slot(self, n: int, storm_over: asyncio.Event, calm: asyncio.Event) -> None:
        """One relay process slot: start a relay; when it is killed, start another."""
        generation = 0
        while not calm.is_set():
            generation += 1
            life = Life(self.incidents_alone)
            self.lives.append(life)
            dice = (life, self.rng, self.faults, self.tally, self.settings.lease_seconds)
            store = FaultyStore(await self._open_store(), *dice)
            publisher = FaultyPublisher(
                self.broker, self.max_attempts - 1, self.keeps_key_order, *dice
            )
            settings = dataclasses.replace(self.settings, relay_id=f"relay{n}.{generation}")
            relay = Relay(store, publisher, settings)
            run = asyncio.create_task(relay.run())
            self.tasks.append(run)
            ended = asyncio.create_task(calm.wait())
            died = asyncio.create_task(life.died.wait())
            await asyncio.wait([run, ended, died], return_when=asyncio.FIRST_COMPLETED)
            ended.cancel()
            died.cancel()
            if run.done():
                if isinstance(run.exception(), PermissionDenied):  # stopped, as it should
                    if calm.is_set():
                        return
                    await asyncio.sleep(self.rng.uniform(0.0, 5.0))  # restarted, grant back
                    continue
                if run.exception() is not None:
                    self.relay_errors.append(
                        f"relay {settings.relay_id} failed: {run.exception()!r}"
                    )
                return
            if life.dead:
                await asyncio.sleep(self.rng.uniform(0.0, 5.0))  # the supervisor restarts it
                continue
            # Calm is over: stop gracefully (most of the time) or kill.
            if self.rng.random() < 0.7:
                relay.stop()
                died = asyncio.create_task(life.died.wait())
                await asyncio.wait([run, died], timeout=3600, return_when=asyncio.FIRST_COMPLETED)
                died.cancel()
                if not run.done() and not life.dead:
                    self.relay_errors.append(f"relay {settings.relay_id} did not stop")
                elif run.done() and not isinstance(run.exception(), PermissionDenied | type(None)):
                    self.relay_errors.append(
                        f"relay {settings.relay_id} failed: {run.exception()!r}"
                    )
            else:
                life.kill()
            return

    def _failed(self, relay_id: str | None, run: asyncio.Task[Any]) -> None:
        if run.exception() is not None:
            self.relay_errors.append(f"relay {relay_id} failed: {run.exception()!r}")

    async def _chaos(self) -> None:
        """Kill or freeze relays at random instants of the storm."""
        rng = self.rng
        events = [("kill", rng.uniform(0, self.storm_seconds)) for _ in range(self.random_kills)]
        events += [("freeze", rng.uniform(0, self.storm_seconds)) for _ in range(self.freezes)]
        for kind, at in sorted(events, key=lambda e: e[1]):
            await asyncio.sleep(max(0.0, at - self.now()))
            alive = [life for life in self.lives if not life.dead]
            if not alive:
                continue
            life = rng.choice(alive)
            if kind == "kill":
                self.tally["relay killed at a random instant"] += 1
                life.kill()
            else:
                self.tally["relay frozen past its lease"] += 1
                lease = self.settings.lease_seconds
                life.freeze(self.now() + rng.uniform(lease, 3 * lease))

    async def _wait_drained(self, budget: float) -> bool:
        deadline = self.now() + budget
        while self.now() < deadline:
            stats = await self.outbox.stats()
            if stats.pending == 0 and stats.in_flight == 0:
                return True
            await asyncio.sleep(5.0)
        return False

    async def _clear_away(self) -> None:
        """End the tasks of killed relays (they wait forever) and close the connections."""
        for life in self.lives:
            life.reaping = True
            life.kill()
        loop = asyncio.get_running_loop()
        for _ in range(10):
            others = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
            if not others:
                break
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
        for store in self.stores:
            await store.close()

    # -- the model ---------------------------------------------------------------------------

    async def check(self) -> list[str]:
        """Compare what happened with what must have happened."""
        violations: list[str] = []
        dead: dict[str, DeadLetter] = {}
        cursor = None
        while True:
            page = await self.outbox.list_dead_letters(DeadLetterFilter(), limit=500, cursor=cursor)
            dead.update((d.id, d) for d in page.items)
            cursor = page.next_cursor
            if cursor is None:
                break
        dead_uid = {i: json.loads(d.payload)["uid"] for i, d in dead.items()}
        by_uid = {w.uid: w for w in self.written}
        # In ordered mode a copy taken behind a failed message of its key does not count: the
        # relay must publish the message again after its predecessor.
        behind = self.broker.behind if self.settings.ordered else set()
        counted = [u for n, u in enumerate(self.broker.deliveries) if n not in behind]
        delivered = set(counted)
        for d in dead.values():
            w = by_uid[dead_uid[d.id]]
            # Crash isolation may take a healthy message for a killer only if it really was
            # alone in max_solo_deaths incidents (kills, freezes, store failures).
            unlucky = self.incidents_alone[w.uid] >= self.settings.max_solo_deaths
            if w.nature == "healthy" and not ("died" in d.failure_reason and unlucky):
                violations.append(
                    f"healthy message {w.id} (uid {w.uid}) was dead-lettered: {d.failure_reason}"
                )
            if w.nature == "healthy" and unlucky:
                self.tally["healthy message dead-lettered after incidents while alone"] += 1
            if not d.failure_reason:
                violations.append(f"dead letter {d.id} has no reason")
            if w.nature == "killer" and "died" not in d.failure_reason:
                violations.append(f"killer message {d.id} dead-lettered for: {d.failure_reason}")
        for w in self.written:
            if w.nature == "healthy":
                if w.uid not in delivered and dead_uid.get(w.id) != w.uid:
                    what = (
                        "out of order: only delivered behind a failed message of its key, "
                        "never again after it"
                        if w.uid in self.broker.deliveries
                        else "lost: never delivered"
                    )
                    violations.append(f"{what}: healthy message {w.id} (uid {w.uid})")
                continue
            if w.uid in self.broker.deliveries:
                violations.append(f"{w.nature} message {w.id} (uid {w.uid}) was delivered")
            # Failing for good: its dead letter, or the one of a later write of the same id.
            latest = dead_uid.get(w.id)
            if latest is None or latest < w.uid:
                violations.append(f"lost: {w.nature} message {w.id} (uid {w.uid}) never dead")
        first: dict[int, int] = {}
        for position, uid in enumerate(counted):
            first.setdefault(uid, position)
        if self.settings.ordered:
            for key in self.keys:
                order = [first[w.uid] for w in self.written if w.key == key and w.uid in first]
                if order != sorted(order):
                    uids = [w.uid for w in self.written if w.key == key and w.uid in first]
                    shown = sorted(uids, key=lambda u: first[u])
                    violations.append(f"key {key} delivered out of order: {shown}")
        duplicates = len(counted) - len(first)
        self.tally["duplicate deliveries"] += duplicates
        self.tally["copies taken behind a failed message of their key"] += len(behind)
        bound = self.tally["messages taken back after a lease expired"]
        if duplicates > bound:
            violations.append(
                f"{duplicates} duplicates, more than the {bound} messages whose lease expired"
            )
        return violations


class SimSqliteStore(SqliteStore):
    """The SQLite store on an :class:`InlineConnection` (no thread: a deterministic schedule)."""

    async def _connect(self) -> Any:
        return InlineConnection(self.path)


def run_scenario(seed: int, store_kind: str, workdir: Path) -> Outcome:
    """Run one seed on a fresh virtual-time loop."""
    from tests.simulation.virtual_time import VirtualTimeLoop

    loop = VirtualTimeLoop()
    try:
        scenario = Scenario(seed, store_kind, workdir)
        return loop.run_until_complete(scenario.run())
    finally:
        loop.close()
