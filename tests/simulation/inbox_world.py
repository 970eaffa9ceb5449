"""One simulated consumer scenario: a broker log, consumer processes and the inbox under faults.

The relay's simulation (``world.py``) checks the sending side; this one the receiving side, on
the same virtual time and the real SQLite store (the in-memory store has no transactions, so a
kill there loses by design what a database keeps). A scenario is a pure function of its seed:

1. **storm**: messages are appended to a partitioned log (Kafka's model: a key stays in its
   partition, a consumer group commits an offset per partition) at random instants, some twice (a
   publisher's duplicate: the same id again, later in the log). One or two consumer groups read it
   (each with its own inbox rows, failures and offsets, and its own handler behaviour: a message
   both give up on is one consume dead letter, which a replay re-drives to both); per group, one
   process at a time runs the real :func:`~outboxer.inbox.run_consumer` on it: its adapter fetches
   batches and acknowledges them (commits offsets) through
   :class:`~outboxer.inbox.consumer.Deliveries`, as the real adapters do. Faults: the process is
   killed (every task of it cancelled: its open transaction rolls back, nothing more is
   acknowledged) at random instants, inside a handler after its write, or between a commit and the
   acknowledgement, and restarted from the committed offsets; a store statement fails (the
   transaction is lost) or a commit's answer is lost; handlers are slow, fail a few times and then
   succeed ("flaky"), fail for good (``PermanentHandlerError``), or fail until a bug is fixed
   ("broken"). Handlers write their effect through ``ctx.connection``, in the inbox's transaction,
   and sometimes fail after it.
2. **calm**: faults stop; everything in the log must be acknowledged and every failure settled.
   Then the bug is fixed and the operator replays every dead letter.
3. **check**, per consumer group: every flaky or healthy message took effect exactly once, broken
   ones exactly once (after the replay), permanent ones never and are the only dead letters (one
   per message); of each key the messages that never failed for good took effect in log order.
   A kill cancels every task of the process rather than stopping it dead: a kill runs no code
   where a cancellation runs cleanup, and the model holds because commits and acknowledgements
   are never made in cleanup.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import inspect
import json
import random
from collections.abc import AsyncIterator, Coroutine, Sequence
from pathlib import Path
from typing import Any

from outboxer.config import Backoff
from outboxer.errors import StoreError, StoreUnavailable
from outboxer.inbox import (
    HandlerContext,
    HandlerRegistry,
    Inbox,
    InboxSettings,
    PermanentHandlerError,
    run_consumer,
)
from outboxer.inbox.consumer import Deliver, Deliveries
from outboxer.message import Message
from outboxer.ports import DeadLetterFilter
from tests.simulation.world import SimSqliteStore, Tally

GROUPS = ("a", "b")

#: The consumer process a task belongs to (tasks inherit it from the task that made them).
PROCESS: contextvars.ContextVar[Process | None] = contextvars.ContextVar("process", default=None)


@dataclasses.dataclass(slots=True)
class Sent:
    uid: int
    key: str | None
    #: Per consumer group: healthy, flaky (fails ``failures`` attempts, then succeeds),
    #: permanent, broken (fails until the bug is fixed).
    natures: dict[str, str]
    failures: dict[str, int]


@dataclasses.dataclass(slots=True)
class Faults:
    active: bool = True
    store_error: float = 0.0
    lost_commit: float = 0.0
    kill_in_handler: float = 0.0
    kill_at_ack: float = 0.0
    fail_after_write: float = 0.0


class Process:
    """One consumer process: its tasks, and a kill that cancels every one of them."""

    def __init__(self, name: str, group: str) -> None:
        self.name = name
        self.group = group
        self.tasks: set[asyncio.Task[Any]] = set()
        self.killed = False
        self.inbox: Inbox | None = None  # asked to stop (SIGTERM) through it
        self.stopped = False

    def kill(self) -> None:
        self.killed = True
        for task in list(self.tasks):
            task.cancel()

    async def reaped(self) -> None:
        """Wait until every task of the killed process has ended (cleanup may start more)."""
        while True:
            alive = [t for t in self.tasks if not t.done()]
            if not alive:
                return
            for task in alive:
                task.cancel()
            await asyncio.gather(*alive, return_exceptions=True)


def task_factory(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
) -> asyncio.Task[Any]:
    """Every task joins the process of the task that created it."""
    task = asyncio.Task(coro, loop=loop, **kwargs)
    process = PROCESS.get()
    if process is not None:
        process.tasks.add(task)
        task.add_done_callback(process.tasks.discard)
        if process.killed:
            task.cancel()
    return task


class Log:
    """The broker: partitions of messages and each consumer group's committed offsets."""

    def __init__(self, partitions: int, groups: Sequence[str]) -> None:
        self.partitions: list[list[Message]] = [[] for _ in range(partitions)]
        self.committed = {group: [0] * partitions for group in groups}

    def behind(self, group: str) -> list[int]:
        """Messages not acknowledged yet, per partition."""
        committed = self.committed[group]
        return [len(p) - c for p, c in zip(self.partitions, committed, strict=True)]


class SimBroker:
    """A consumer adapter on :class:`Log`: batches from the committed offsets, acknowledged in
    order after they are stored (``Deliveries``), as ``outboxer.brokers.*.consumer`` do."""

    def __init__(self, scenario: InboxScenario, process: Process) -> None:
        self.scenario = scenario
        self.process = process

    async def __aenter__(self) -> SimBroker:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def run(self, deliver: Deliver, stop: asyncio.Event) -> None:
        s = self.scenario
        log, rng = s.log, s.rng
        committed = log.committed[self.process.group]
        positions = list(committed)
        turn = 0
        async with Deliveries(deliver) as deliveries:
            while not stop.is_set():
                for step in range(len(positions)):
                    p = (turn + step) % len(positions)
                    if positions[p] < len(log.partitions[p]):
                        break
                else:
                    await asyncio.sleep(s.poll_interval)
                    continue
                turn = p + 1
                start = positions[p]
                batch = log.partitions[p][start : start + s.batch_size]
                positions[p] = start + len(batch)
                s.tally["batches delivered"] += 1
                s.tally["messages delivered"] += len(batch)

                async def acknowledge(p: int = p, end: int = positions[p]) -> None:
                    if s.faults.active and rng.random() < s.faults.kill_at_ack:
                        s.tally["process killed between a commit and its acknowledgement"] += 1
                        self.process.kill()
                        await asyncio.sleep(0)  # the cancellation lands here
                    committed[p] = max(committed[p], end)

                if not await deliveries.submit(batch, acknowledge):
                    return


class FaultyStore:
    """The process's store: a statement fails (its transaction is lost) or a commit's answer is
    lost, at random; everything else as the inner store."""

    def __init__(self, inner: Any, scenario: InboxScenario) -> None:
        self.inner = inner
        self.scenario = scenario

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @contextlib.asynccontextmanager
    async def inbox_session(self) -> AsyncIterator[Any]:
        async with self.inner.inbox_session() as session:
            yield _FaultySession(session, self.scenario)


class _Faulty:
    def __init__(self, inner: Any, scenario: InboxScenario) -> None:
        self.inner = inner
        self.scenario = scenario

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name == "run_handler" or not inspect.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            s = self.scenario
            if s.faults.active and s.rng.random() < s.faults.store_error:
                s.tally["store statement failed"] += 1
                raise StoreUnavailable(f"injected: {name} failed")
            return await attr(*args, **kwargs)

        return call


class _FaultySession(_Faulty):
    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        s = self.scenario
        async with self.inner.transaction() as tx:
            yield _Faulty(tx, s)
        if s.faults.active and s.rng.random() < s.faults.lost_commit:
            s.tally["commit done, answer lost"] += 1
            raise StoreUnavailable("injected: connection lost after commit")


@dataclasses.dataclass
class InboxOutcome:
    seed: int
    violations: list[str]
    tally: Tally
    messages: int
    virtual_seconds: float


class InboxScenario:
    """The random choices of one seed, and the run."""

    def __init__(self, seed: int, workdir: Path) -> None:
        self.seed = seed
        self.workdir = workdir
        rng = self.rng = random.Random(seed)
        self.tally = Tally()
        self.max_attempts = rng.randint(2, 5)
        # One consumer group, or two reading the same log (each with its own inbox rows,
        # failures and offsets; a message both give up on is one consume dead letter).
        self.groups = GROUPS[: rng.randint(1, 2)]
        self.tally[f"scenarios with {len(self.groups)} consumer group(s)"] += 1
        self.settings = InboxSettings(
            consumer="sim-a",
            max_attempts=self.max_attempts,
            retry=Backoff(base=rng.uniform(0.1, 2.0), factor=2, cap=10.0),
            retention=86400.0,
            concurrency=rng.randint(1, 4),
            redrive_interval=rng.uniform(0.2, 2.0),
            redrive_batch_size=rng.randint(1, 10),
            outage=Backoff(base=rng.uniform(0.2, 2.0), factor=2, cap=10.0),
            batch_transactions=rng.random() < 0.7,
            sweep_interval=rng.uniform(5.0, 60.0),
            dead_letter_retention=0.0,
        )
        self.batch_size = rng.randint(1, 8)
        self.poll_interval = rng.choice([0.1, 1.0])
        self.log = Log(rng.randint(1, 3), self.groups)
        self.keys = [f"k{n}" for n in range(rng.randint(1, 6))]
        self.storm_seconds = rng.uniform(20.0, 200.0)
        self.message_count = rng.randint(5, 60)
        p = rng.random
        self.faults = Faults(
            store_error=p() * 0.05,
            lost_commit=p() * 0.1,
            kill_in_handler=p() * 0.03,
            kill_at_ack=p() * 0.05,
            fail_after_write=p() * 0.5,
        )
        self.natures = {"flaky": p() * 0.4, "permanent": p() * 0.1, "broken": p() * 0.1}
        self.duplicates = p() * 0.2
        self.slow_handlers = p() * 0.3
        self.random_kills = rng.randint(0, 4)
        self.stops = rng.randint(0, 2)  # SIGTERM: stop gracefully, then restarted
        self.replays = rng.randint(0, 2)  # the operator replays every dead letter, bug or not
        self.shutdown_timeout = rng.uniform(0.5, 10.0)
        self.sent: list[Sent] = []
        self.fixed = False
        self.processes: list[Process] = []
        self.errors: list[str] = []
        self.current: dict[str, Process] = {}

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    # -- the run -----------------------------------------------------------------------------

    async def run(self) -> InboxOutcome:
        asyncio.get_running_loop().set_task_factory(task_factory)
        path = self.workdir / "inbox.db"
        store = SimSqliteStore(path, clock=self._epoch_seconds)
        await store.open()
        await store.migrate()
        # The operator's connection: a write it cannot make now (a consumer's transaction is
        # open across a slow handler) fails at once and is tried again a virtual second later,
        # instead of blocking the only thread in SQLite's busy handler.
        await store.execute("PRAGMA busy_timeout = 0")
        await store.execute(
            "CREATE TABLE effects (seq INTEGER PRIMARY KEY AUTOINCREMENT, consumer TEXT, "
            "uid INTEGER, attempt INTEGER)"
        )
        self.store = store
        violations: list[str] = []
        try:
            calm = asyncio.Event()
            slots = [asyncio.create_task(self._slot(group, calm)) for group in self.groups]
            writer = asyncio.create_task(self._write())
            chaos = asyncio.create_task(self._chaos())
            await asyncio.sleep(self.storm_seconds)
            await writer
            chaos.cancel()
            self.faults.active = False
            if not await self._wait_settled(budget=3600.0):
                violations.append(await self._stuck("after the faults stopped"))
            # The bug is fixed; the operator replays every dead letter.
            self.fixed = True
            await self._replay()
            if not await self._wait_settled(budget=3600.0):
                violations.append(await self._stuck("after the replay"))
            calm.set()
            await asyncio.gather(*slots)
            violations += self.errors
            violations += await self.check()
        finally:
            for process in self.processes:
                process.kill()
                await process.reaped()
            await store.close()
        return InboxOutcome(self.seed, violations, self.tally, len(self.sent), self.now())

    def _epoch_seconds(self) -> float:
        from tests.simulation.world import EPOCH

        return EPOCH.timestamp() + self.now()

    async def _write(self) -> None:
        """Append the messages at random instants of the first 80% of the storm; some twice."""
        rng = self.rng
        times = sorted(rng.uniform(0, 0.8 * self.storm_seconds) for _ in range(self.message_count))
        copies: list[tuple[float, Message, int]] = []
        for uid, at in enumerate(times):
            await asyncio.sleep(max(0.0, at - self.now()))
            natures, failures = {}, {}
            for group in self.groups:
                natures[group] = "healthy"
                for candidate, chance in self.natures.items():
                    if rng.random() < chance:
                        natures[group] = candidate
                flaky = natures[group] == "flaky"
                failures[group] = rng.randint(1, self.max_attempts - 1) if flaky else 0
            key = rng.choice(self.keys) if rng.random() < 0.9 else None
            partitions = len(self.log.partitions)
            partition = self.keys.index(key) % partitions if key else rng.randrange(partitions)
            payload = json.dumps({"uid": uid}).encode()
            message = Message(id=f"m{uid}", topic="t", payload=payload, key=key, type="T")
            self.sent.append(Sent(uid, key, natures, failures))
            self.log.partitions[partition].append(message)
            self.tally["messages sent"] += 1
            if rng.random() < self.duplicates:
                later = at + rng.uniform(0, 0.2 * self.storm_seconds)
                copies.append((later, message, partition))
        for at, message, partition in sorted(copies, key=lambda c: c[0]):
            await asyncio.sleep(max(0.0, at - self.now()))
            self.log.partitions[partition].append(message)
            self.tally["messages sent twice"] += 1

    def _registry(self, group: str) -> HandlerRegistry:
        registry = HandlerRegistry()
        rng, faults, tally = self.rng, self.faults, self.tally

        async def handle(payload: dict[str, Any], ctx: HandlerContext) -> None:
            sent = self.sent[payload["uid"]]  # (uids are positions)
            if rng.random() < self.slow_handlers:
                await asyncio.sleep(rng.uniform(0.0, 3.0))
            nature = sent.natures[group]
            failing = (
                (nature == "flaky" and ctx.attempt <= sent.failures[group])
                or nature == "permanent"
                or (nature == "broken" and not self.fixed)
            )
            error: Exception = RuntimeError(f"{nature} failure")
            if nature == "permanent":
                error = PermanentHandlerError("cannot be handled")
            if failing and rng.random() >= faults.fail_after_write:
                tally["handler failed"] += 1
                raise error
            await ctx.connection.execute(
                "INSERT INTO effects (consumer, uid, attempt) VALUES (?, ?, ?)",
                (group, sent.uid, ctx.attempt),
            )
            if faults.active and rng.random() < faults.kill_in_handler:
                tally["process killed in a handler after its write"] += 1
                process = PROCESS.get()
                assert process is not None
                process.kill()
                await asyncio.sleep(0)  # the cancellation lands here
            if failing:  # the write above must be undone (the handler's savepoint)
                tally["handler failed after its write"] += 1
                raise error

        registry.register(handle, topic="t")
        return registry

    async def _slot(self, group: str, calm: asyncio.Event) -> None:
        """A consumer group's process slot: run a process; when it is killed, start another."""
        generation = 0
        settings = dataclasses.replace(self.settings, consumer=f"sim-{group}")
        while True:
            generation += 1
            process = Process(f"consumer {group}.{generation}", group)
            self.processes.append(process)
            store = SimSqliteStore(self.workdir / "inbox.db", clock=self._epoch_seconds)
            await store.open()
            # Two groups' processes write at once: a write one cannot make now (the other's
            # transaction is open across a slow handler) is a database error, retried after
            # the outage backoff, instead of a wait in SQLite's busy handler (real time, the
            # only thread).
            await store.execute("PRAGMA busy_timeout = 0")
            registry = self._registry(group)
            inbox = process.inbox = Inbox(FaultyStore(store, self), registry, settings)
            token = PROCESS.set(process)
            try:
                run = asyncio.create_task(
                    run_consumer(
                        inbox,
                        SimBroker(self, process),
                        sweeper=store,
                        shutdown_timeout=self.shutdown_timeout,
                    )
                )
            finally:
                PROCESS.reset(token)
            self.current[group] = process
            ended = asyncio.create_task(calm.wait())
            await asyncio.wait([run, ended], return_when=asyncio.FIRST_COMPLETED)
            ended.cancel()
            if process.stopped and not run.done():  # stopping, and calm came meanwhile
                await asyncio.wait([run], timeout=3600)
                inbox.stop()
                await asyncio.wait([run], timeout=3600)
                if not run.done():
                    self.errors.append(f"{process.name} did not stop")
            if run.done() and not run.cancelled() and run.exception() is not None:
                self.errors.append(f"{process.name} failed: {run.exception()!r}")
            process.kill()
            await process.reaped()
            await store.close()
            if calm.is_set():
                return
            if not (process.killed and run.cancelled()) and not process.stopped:
                self.errors.append(f"{process.name} ended by itself")
                return
            await asyncio.sleep(self.rng.uniform(0.0, 5.0))  # the supervisor restarts it

    async def _chaos(self) -> None:
        """Kill the process, or ask it to stop (SIGTERM), at random instants of the storm."""
        rng = self.rng
        events = [("kill", rng.uniform(0, self.storm_seconds)) for _ in range(self.random_kills)]
        events += [("stop", rng.uniform(0, self.storm_seconds)) for _ in range(self.stops)]
        events += [("replay", rng.uniform(0, self.storm_seconds)) for _ in range(self.replays)]
        for kind, at in sorted(events, key=lambda e: e[1]):
            await asyncio.sleep(max(0.0, at - self.now()))
            if kind == "replay":  # before the bug is fixed: they fail again
                self.tally["dead letters replayed during the storm"] += await self._replay()
                continue
            process = self.current.get(rng.choice(self.groups))
            if process is None or process.killed or process.stopped:
                continue
            if kind == "kill":
                self.tally["process killed at a random instant"] += 1
                process.kill()
            else:
                self.tally["process stopped (SIGTERM) at a random instant"] += 1
                process.stopped = True
                assert process.inbox is not None
                process.inbox.stop()
                asyncio.get_running_loop().call_later(
                    self.shutdown_timeout + 60.0, self._must_have_stopped, process
                )

    async def _replay(self) -> int:
        """The operator replays every dead letter; returns how many."""
        while True:
            try:
                replayed = await self.store.replay_dead_letters(DeadLetterFilter())
            except StoreError:  # the database is locked by a consumer's transaction
                self.tally["operator's replay refused: database locked"] += 1
                await asyncio.sleep(1.0)
                continue
            self.tally["dead letters replayed"] += len(replayed)
            return len(replayed)

    def _must_have_stopped(self, process: Process) -> None:
        if process.tasks and not process.killed:
            self.errors.append(f"{process.name} still ran a minute past its shutdown timeout")

    async def _settled(self) -> bool:
        if any(any(self.log.behind(group)) for group in self.groups):
            return False
        stats = await self.store.stats()
        return not any(f.retrying or f.waiting for f in stats.consume_failures)

    async def _wait_settled(self, budget: float) -> bool:
        deadline = self.now() + budget
        while self.now() < deadline:
            if await self._settled():
                return True
            await asyncio.sleep(5.0)
        return False

    async def _stuck(self, when: str) -> str:
        stats = await self.store.stats()
        behind = {group: self.log.behind(group) for group in self.groups}
        return (
            f"stuck {when}: not acknowledged per partition {behind}, "
            f"failures {[f.to_json() for f in stats.consume_failures]}"
        )

    # -- the model ---------------------------------------------------------------------------

    async def check(self) -> list[str]:
        violations: list[str] = []
        rows = await self.store.execute("SELECT consumer, uid FROM effects ORDER BY seq")
        effects = [(row[0], row[1]) for row in rows]
        dead = []
        cursor = None
        while True:
            page = await self.store.list_dead_letters(DeadLetterFilter(), limit=500, cursor=cursor)
            dead += page.items
            cursor = page.next_cursor
            if cursor is None:
                break
        counts = collections.Counter(effects)
        dead_uids = {json.loads(d.payload)["uid"] for d in dead}
        for d in dead:
            if d.direction != "consume":
                violations.append(f"a {d.direction} dead letter {d.id} in a consumer's database")
        if len(dead_uids) < len(dead):
            violations.append("two consume dead letters of one message")
        for s in self.sent:
            for group, nature in s.natures.items():
                expected = 0 if nature == "permanent" else 1
                if counts[group, s.uid] != expected:
                    violations.append(
                        f"{nature} message m{s.uid} took effect {counts[group, s.uid]} times in "
                        f"consumer {group}, not {expected}"
                    )
            permanent = "permanent" in s.natures.values()
            if permanent != (s.uid in dead_uids):
                what = "is not" if permanent else "is"
                violations.append(f"message m{s.uid} {s.natures} {what} a dead letter")
        # Per consumer and key, in log order: the messages that never failed for good there.
        for group in self.groups:
            position = {uid: n for n, (g, uid) in enumerate(effects) if g == group}
            for key in self.keys:
                done = [
                    s.uid
                    for s in self.sent
                    if s.key == key
                    and s.natures[group] in ("healthy", "flaky")
                    and s.uid in position
                ]
                if [position[u] for u in done] != sorted(position[u] for u in done):
                    shown = sorted(done, key=lambda u: position[u])
                    violations.append(f"key {key} took effect out of order in {group}: {shown}")
        self.tally["effects"] += len(effects)
        return violations


def run_inbox_scenario(seed: int, workdir: Path) -> InboxOutcome:
    """Run one seed on a fresh virtual-time loop."""
    from tests.simulation.virtual_time import VirtualTimeLoop

    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(InboxScenario(seed, workdir).run())
    finally:
        loop.close()
