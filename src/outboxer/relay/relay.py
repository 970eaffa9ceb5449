"""The relay loop: wake → claim → publish → settle.

Throughput comes from never waiting when it need not: a batch is claimed in one statement and
published while the next batch is claimed (up to ``max_in_flight_batches`` at once); no database
transaction is open while the broker works; each batch is settled in one statement in the common
case. An idle relay polls adaptively: ``min_poll_interval`` after a claim found work, doubling
up to ``poll_interval`` while claims come back empty; a store with a doorbell (MySQL's probe of
the newest row) cuts the wait short. PostgreSQL has none since schema 6: a NOTIFY at every
inserting commit serialized the application's commits (docs/adr/0007-polling-wakeup.md).

What a failure does:

- ``None`` result: acknowledged → removed from the outbox.
- ``RetryablePublishError``: one attempt counted, retried after the per-message backoff;
  dead-lettered once ``max_attempts`` is reached. Other messages flow on.
- ``PermanentPublishError``: dead-lettered at once (retrying cannot help).
- ``BrokerUnavailable``: no attempt counted, the batch is released, and the whole relay pauses
  claiming along the outage backoff (5, 10, 20, 40, 60 s ...) until a publish succeeds.
- Ordered mode: a key's later messages in the batch behind a failed one are released (no
  attempt counted) even when the broker took them (a run pipelined in one call, for a publisher
  that keeps key order): they are published again after it, never settled ahead of it. With
  such a publisher a claim may also continue keys of this relay's batches in flight (chained
  batches, ADR 0008); a chained batch is published after them and sends nothing of a key that
  failed there.
- A batch in flight keeps its lease: it is extended every third of a lease until the batch is
  settled, so a slow publish is never taken over by another live relay.
- A message whose lease expired (its relay died or froze holding it) is claimed alone and
  published with nothing else in flight; after ``max_solo_deaths`` relay deaths while it was
  alone it is dead-lettered: a message whose publish kills the process cannot kill every relay
  forever, and a healthy message of a batch that died together is never counted.
- Anything else the publisher raises (or a wrong number of results) is a bug of the publisher or
  its lifecycle ("publisher is not open"), not of the messages: it is logged with its traceback
  and handled as an outage, so one bug never dead-letters the outbox.

Background tasks (heartbeat, sweeper) are supervised: a task that dies is logged with its
traceback and restarted after a backoff; one that keeps dying (``max_task_restarts`` deaths in a
row) stops the relay, and :meth:`Relay.run` raises :class:`~outboxer.errors.RelayFailed`.

Time is read from the running event loop (``loop.time()``), never from the wall clock, so a test
can run the relay on an event loop with virtual time (``tests/simulation``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import secrets
import socket
from collections.abc import Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from outboxer.config import RelaySettings
from outboxer.errors import (
    BrokerUnavailable,
    PermanentPublishError,
    PermissionDenied,
    PublishError,
    RelayFailed,
    RetryablePublishError,
    StoreError,
    error_summary,
    error_text,
)
from outboxer.message import Message
from outboxer.ports import (
    Claim,
    ClaimRequest,
    Publisher,
    RelayInfo,
    RelayStore,
    Retry,
    Settlement,
    failure_reason,
    keeps_key_order,
    log_last_sweep,
)
from outboxer.relay.failures import FailedPublish, FailureLog
from outboxer.relay.observer import (
    GuardedObserver,
    NoopObserver,
    PublishOutcome,
    RelayObserver,
    current_relay_id,
)

__all__ = ["Relay", "RelayCounters"]

log = logging.getLogger("outboxer.relay")

#: How long a stop waits for the batches it cut short to be handed back, and for the relay's
#: sign-off (its registry row): a stop takes at most ``shutdown_timeout`` + these + the store's
#: close (5 s), whatever the database does.
_HAND_BACK_SECONDS = 5.0
_SIGN_OFF_SECONDS = 2.0
#: How long a stop lets a claim in progress finish before cutting it short.
_CLAIM_GRACE_SECONDS = 2.0


@dataclass(slots=True)
class RelayCounters:
    """What a relay did since it started."""

    claimed: int = 0
    published: int = 0
    retried: int = 0
    dead_lettered: int = 0
    released: int = 0
    batches: int = 0
    outages: int = 0


@dataclass(eq=False, slots=True)
class _Chained:
    """A batch of an ordered relay that may continue key runs of batches it still has in
    flight (``ClaimRequest.behind``, ADR 0008).

    ``before`` maps each of its keys that an earlier batch in flight held when it was claimed to
    that batch: it publishes only after those batches' calls returned, and releases the
    messages of every key that failed there. ``failed`` is filled in before ``published`` is
    set: its keys with a message not published (failed, released, or never sent).
    """

    token: int
    keys: set[str]
    before: dict[str, _Chained] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    published: asyncio.Event = field(default_factory=asyncio.Event)
    #: Settled (or given up): forgotten before the next claim, after which its rows (if a settle
    #: was abandoned, they are still leased) block their keys again.
    done: bool = False

    async def wait_for_earlier(self) -> set[str]:
        """Wait until the calls of the batches this one continues returned; the keys that did
        not go through there."""
        for earlier in {id(b): b for b in self.before.values()}.values():
            await earlier.published.wait()
        return {key for key, earlier in self.before.items() if key in earlier.failed}


@dataclass(eq=False, slots=True)
class _Fence:
    """A pipelined call's results sorted by the fence of :meth:`Relay._publish_runs`: a key's
    messages behind its first failure (or behind an earlier batch's) are released whatever the
    broker answered."""

    failed: set[str]
    ahead: list[Message] = field(default_factory=list)
    ahead_results: list[PublishError | None] = field(default_factory=list)
    behind: list[str] = field(default_factory=list)
    #: Messages behind a failure that the broker accepted anyway: the duplicates to come.
    accepted_behind: int = 0

    @classmethod
    def of(
        cls,
        failed: set[str],
        messages: Sequence[Message],
        results: Sequence[PublishError | None],
    ) -> _Fence:
        """The fence of one call's results (``failed``: the keys stopped before it)."""
        if not failed and all(result is None for result in results):
            return cls(failed, list(messages), list(results))  # the usual case: nothing to fence
        fence = cls(failed)
        for message, result in zip(messages, results, strict=True):
            fence.add(message, result)
        return fence

    def add(self, message: Message, result: PublishError | None) -> None:
        key = message.key
        if key is not None and key in self.failed:
            self.behind.append(message.id)
            self.accepted_behind += result is None
            return
        if key is not None and result is not None:
            self.failed.add(key)
        self.ahead.append(message)
        self.ahead_results.append(result)


def _log_death(task: asyncio.Task[None]) -> None:
    """Done callback of a helper task: its unexpected end is logged, never silent."""
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s died", task.get_name(), exc_info=task.exception())


#: The longest ``Retry-After`` a broker may ask the relay to wait (seconds).
MAX_RETRY_AFTER = 3600.0


def _reason(error: BaseException) -> str:
    # A PublishError's text is written for operators; anything else, or one without text, gets
    # its type name: a dead letter's reason is never empty.
    text = error_text(error).strip()
    if not isinstance(error, PublishError) or not text:
        text = error_summary(error).strip()
    return failure_reason(text)  # (cut to MAX_REASON characters)


class Relay:
    """Moves messages from a store to a publisher until stopped.

    Args:
        store: Where messages wait (its lifecycle belongs to the caller).
        publisher: Where they go (entered and exited by the caller).
        settings: Batch size, window, retries, backoff, leases.
        observer: Told about claims, publish calls, outages and heartbeats (metrics); see
            :mod:`outboxer.relay.observer`. Default: nothing is reported.
    """

    def __init__(
        self,
        store: RelayStore,
        publisher: Publisher,
        settings: RelaySettings | None = None,
        *,
        observer: RelayObserver | None = None,
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.settings = settings or RelaySettings()
        self.observer: RelayObserver = (
            NoopObserver() if observer is None else GuardedObserver(observer)
        )
        host = socket.gethostname()
        self.relay_id = self.settings.relay_id or f"{host}:{os.getpid()}:{secrets.token_hex(3)}"
        self.info = RelayInfo(
            relay_id=self.relay_id,
            hostname=host,
            pid=os.getpid(),
            started_at=dt.datetime.now(dt.UTC),
            heartbeat_at=dt.datetime.now(dt.UTC),
        )
        self.counters = RelayCounters()
        self._failure_log = FailureLog(log, self.settings.max_attempts, self._now)
        # Ordered mode: a key's run of a batch in one call when the broker keeps its order, and
        # then the next rows of the keys in flight may be claimed too (chained batches).
        self._pipelines_runs = self.settings.ordered and keeps_key_order(publisher)
        self._claim_request = ClaimRequest(
            limit=self.settings.batch_size,
            lease_seconds=self.settings.lease_seconds,
            ordered=self.settings.ordered,
            relay_id=self.relay_id,
            hold_dead_keys=self.settings.hold_keys_after_dead_letter,
        )
        #: Ordered, pipelined (ADR 0008): the batches in flight by claim token, and those that
        #: took each key, in claim order.
        self._chains: dict[int, _Chained] = {}
        self._key_holders: dict[str, list[_Chained]] = {}
        #: The tokens the last claim could take rows behind (its request's ``behind``).
        self._claimed_behind: frozenset[int] = frozenset()
        self._window = asyncio.Semaphore(self.settings.max_in_flight_batches)
        self._in_flight: set[asyncio.Task[None]] = set()
        #: Tokens of the batches being settled: their rows leave as the settle commits.
        self._settling: set[int] = set()
        self._settled_batches = 0
        self._stop = asyncio.Event()
        self._outage_failures = 0
        self._outage_reason = ""
        self._outage_until = 0.0
        self._store_failures = 0
        self._background: dict[str, asyncio.Task[None]] = {}
        self._task_deaths: dict[str, int] = {}
        self._fatal: RelayFailed | PermissionDenied | None = None  # (the first wins)
        #: The task awaiting a claim statement (while it does), and whether a stop cut it.
        self._claiming: asyncio.Task[Any] | None = None
        self._claim_cut = False
        #: A run is going on; a run ended by a stop (the relay cannot run again).
        self._running = False
        self._stopped = False

    # -- public ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the relay to stop: no new claims; in-flight batches finish or are released."""
        if not self._stop.is_set():
            # A claim held by a database that stopped answering would hold the stop for its
            # command timeout (60 s by default): cut it short if it does not end soon (also
            # one the claim loop began just as the stop came: looked for when the grace ends).
            with contextlib.suppress(RuntimeError):  # (no running loop: nothing to cut)
                asyncio.get_running_loop().call_later(_CLAIM_GRACE_SECONDS, self._cut_claim)
        self._stop.set()

    def _cut_claim(self) -> None:
        if self._claiming is not None and not self._claiming.done():
            self._claim_cut = True
            self._claiming.cancel()

    @property
    def outage_failures(self) -> int:
        """Consecutive broker-unavailable rounds (0 while the broker is healthy)."""
        return self._outage_failures

    @property
    def outage_reason(self) -> str:
        """The error of the last broker-unavailable round ("" while the broker is healthy)."""
        return self._outage_reason if self._outage_failures else ""

    async def run(self) -> RelayCounters:
        """Relay until :meth:`stop` is called; returns the counters.

        One run (or drain) at a time; a relay that was stopped does not run again (both raise
        ``RuntimeError``): make a new ``Relay``.
        """
        return await self._run(until_empty=False)

    async def drain(self, timeout: float | None = None) -> RelayCounters:
        """Relay until nothing is left to publish now (for jobs, tests and migrations).

        Done when no message is in flight and every message still in the outbox was written
        for a later time and never tried (``available_at`` in the future, ``stats().scheduled``):
        those wait for a later run. Messages waiting for a retry are waited for (at most
        ``max_attempts`` attempts along the retry delays), and so is a broker outage. Raises
        ``TimeoutError`` after ``timeout`` seconds; :meth:`stop` ends it early.
        """
        async with asyncio.timeout(timeout):
            return await self._run(until_empty=True)

    # -- loop --------------------------------------------------------------------------------

    async def _run(self, *, until_empty: bool) -> RelayCounters:
        # One run at a time: a second one's heartbeat and sweeper replaced the first's in
        # _background, and those were never cancelled (a stopped relay heartbeating for good).
        if self._running:
            raise RuntimeError(
                "this Relay is already running (run() or drain()): one at a time; "
                "make another Relay to run two"
            )
        if self._stopped:  # (else the run would return at once, publishing nothing)
            raise RuntimeError("this Relay was stopped: make a new Relay to run again")
        self._running = True
        try:
            return await self._run_once(until_empty=until_empty)
        finally:
            self._running = False
            self._stopped = self._stop.is_set()

    async def _run_once(self, *, until_empty: bool) -> RelayCounters:
        relay_id_token = current_relay_id.set(self.relay_id)  # for logs; tasks inherit it
        self.observer.relay_started(self.info)
        log.info(
            "relay %s starting (batch %d, window %d, %s)",
            self.relay_id,
            self.settings.batch_size,
            self.settings.max_in_flight_batches,
            "ordered" if self.settings.ordered else "unordered",
        )
        await log_last_sweep(self.store, log)
        self._supervise("heartbeat", self._heartbeat_loop)
        self._supervise("sweeper", self._sweeper_loop)
        try:
            await self._claim_loop(until_empty)
        finally:
            await self._finish_in_flight()
            background = list(self._background.values())
            self._background.clear()
            # A sweep cancelled in its transaction rolls back, and the rollback waited for a
            # database that stopped answering for the command timeout (a full-suite run)
            await _cancel_within(background, _SIGN_OFF_SECONDS)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_SIGN_OFF_SECONDS):  # a nicety: bounded
                    await self.store.unregister(self.relay_id)
            self._failure_log.flush()
            self.observer.relay_stopped(self.info)
            log.info("relay %s stopped: %s", self.relay_id, self.counters)
            current_relay_id.reset(relay_id_token)
        if self._fatal is not None:
            raise self._fatal
        return self.counters

    # -- supervision of background tasks -----------------------------------------------------

    def _supervise(self, name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``loop`` as a background task that is restarted when it dies.

        The loops handle the failures they expect (``StoreError``) themselves; anything else
        ends the task, and :meth:`_background_ended` decides: restart after a backoff, or, when
        the task died ``max_task_restarts`` times in a row, stop the relay loudly.
        """
        if self._stop.is_set():
            return
        task = asyncio.create_task(loop(), name=f"outboxer-{name}")
        self._background[name] = task
        task.add_done_callback(lambda done: self._background_ended(name, loop, done))

    def _background_ended(
        self,
        name: str,
        loop: Callable[[], Coroutine[Any, Any, None]],
        task: asyncio.Task[None],
    ) -> None:
        if self._background.get(name) is task:
            del self._background[name]
        if task.cancelled():
            return  # the relay is stopping: it cancelled the task
        error: BaseException = task.exception() or RuntimeError("the task returned")
        if self._stop.is_set():
            return
        if isinstance(error, PermissionDenied):  # restarting cannot cure it
            self._stop_with(error)
            return
        deaths = self._task_deaths[name] = self._task_deaths.get(name, 0) + 1
        if deaths > self.settings.max_task_restarts:
            log.critical(
                "background task %s died %d times in a row: stopping the relay",
                name,
                deaths,
                exc_info=error,
            )
            failed = RelayFailed(
                f"background task {name} died {deaths} times in a row: {_reason(error)}"
            )
            failed.__cause__ = error
            self._stop_with(failed)
            return
        delay = self.settings.retry.delay(deaths)
        log.error(
            "background task %s died (%d in a row): restarting in %.1fs",
            name,
            deaths,
            delay,
            exc_info=error,
        )
        asyncio.get_running_loop().call_later(delay, self._supervise, name, loop)

    def _stop_with(self, error: RelayFailed | PermissionDenied) -> None:
        """Stop the relay; ``run``/``drain`` then raise ``error`` (the first such error)."""
        self._fatal = self._fatal or error
        self.stop()

    def _task_healthy(self, name: str) -> None:
        """A background loop completed a round: its deaths are no longer "in a row"."""
        self._task_deaths.pop(name, None)

    async def _claim(self) -> Claim | None:
        """One claim; ``None`` during a broker outage or after a store failure, once its pause
        has been waited out."""
        settings = self.settings
        wait = self._outage_until - self._now()
        if wait > 0:
            await self._sleep(wait)
            return None
        started = self._now()
        request = self._claim_request
        if self._pipelines_runs:
            request = replace(request, behind=self._live_chains())
            self._claimed_behind = request.behind
        self._claiming = asyncio.current_task()
        try:
            claim = await self.store.claim_batch(request)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._claim_cut and task is not None and task.uncancel() == 0:
                # Cut short by a stop: a claim that committed unseen comes back when its lease
                # expires, as after kill -9 (docs/operations.md).
                return None
            raise
        except StoreError as exc:
            self._claiming = None  # (nothing to cut in the pause below: a stop ends it)
            self.observer.store_unavailable("claim")
            self._store_failures += 1
            delay = settings.outage.delay(self._store_failures)
            log.warning("store unavailable (%s): retrying in %.1fs", exc, delay)
            await self._sleep(delay)
            return None
        finally:
            self._claiming = None
        self._store_failures = 0
        self.observer.claimed(len(claim.messages), self._now() - started)
        return claim

    async def _drained(self) -> bool:
        """Nothing in flight here and nothing left to publish (``drain`` ends)."""
        return not self._in_flight and await self._outbox_empty()

    def _start_delivery(self, claim: Claim) -> None:
        """Publish and settle ``claim`` in a task of its own (one of the window's slots)."""
        self.counters.claimed += len(claim.messages)
        chained: _Chained | None = None
        if self._pipelines_runs and not claim.isolated:
            keys = {m.key for m in claim.messages if m.key is not None}
            chained = self._chains[claim.token] = _Chained(claim.token, keys)
            behind = self._claimed_behind
            for key in keys:
                holders = self._key_holders.setdefault(key, [])
                # The latest the claim could take rows behind: it waits for (and fences behind)
                # the ones before it. A holder left out of the claim's ``behind`` held no row of
                # the key then (its rows would have blocked the key): nothing to wait for.
                earlier = [h for h in holders if h.token in behind]
                if earlier:
                    chained.before[key] = earlier[-1]
                holders.append(chained)
        task = asyncio.create_task(self._deliver(claim, chained))
        self._in_flight.add(task)
        task.add_done_callback(self._delivered)
        self.observer.in_flight(len(self._in_flight))

    async def _claim_loop(self, until_empty: bool) -> None:
        settings = self.settings
        idle = settings.min_poll_interval
        saturated = False
        while not self._stop.is_set():
            await self._window.acquire()
            started = False
            try:
                busy, settled = len(self._in_flight), self._settled_batches
                claim = await self._claim()
                if claim is None:
                    continue
                if claim.messages:
                    idle = settings.min_poll_interval
                    if busy:
                        saturated = False  # work was found beside batches in flight
                    self._start_delivery(claim)
                    started = True
                    if claim.isolated:
                        # Crash isolation: nothing else is claimed until it is settled.
                        await self._wait_for_in_flight()
                        continue
                    if len(claim.messages) == settings.batch_size and not saturated:
                        continue  # a full batch: more is probably waiting, claim again now
                else:
                    if busy:
                        # Ordered mode with few keys: every key waits behind a batch in
                        # flight; claiming again before one settles only rescans blocked rows.
                        saturated = True
                    if self._settled_batches != settled:
                        continue  # a batch settled meanwhile and may have unblocked keys
                    if until_empty and await self._drained():
                        return
            finally:
                if not started:
                    self._window.release()
            # A short, empty or saturated claim. While batches are in flight, their settlement
            # is what makes more work claimable (ordered mode: their keys' next messages), so
            # wait for one of them; otherwise poll adaptively: the shortest wait while work was
            # recent, doubling up to poll_interval, which bounds how late an idle relay sees a
            # commit (no wake-up can be lost: every wait ends with a claim that sees every
            # committed row). A store's doorbell may end the wait early.
            if self._in_flight:
                await self._sleep(settings.poll_interval, in_flight=True)
            elif await self._sleep(idle, doorbell=True):
                # Something committed. It may still be behind the commit-order gate (an older
                # transaction is running), so look again soon rather than after a full poll.
                idle = settings.min_poll_interval
            else:
                idle = min(idle * 2, settings.poll_interval)

    def _delivered(self, task: asyncio.Task[None]) -> None:
        self._settled_batches += 1
        self._in_flight.discard(task)
        self._window.release()
        self.observer.in_flight(len(self._in_flight))
        error = None if task.cancelled() else task.exception()
        if isinstance(error, PermissionDenied):
            # The settle was refused, and would be again: publishing on would only repeat
            # these messages each time their lease expires.
            self._stop_with(error)
        elif error is not None:
            log.error("delivery task failed", exc_info=error)

    @staticmethod
    def _now() -> float:
        # The event loop's clock (monotonic), so that a loop with virtual time drives the relay.
        return asyncio.get_running_loop().time()

    async def _outbox_empty(self) -> bool:
        stats = await self.store.stats()
        later = stats.left_for_later(ordered=self.settings.ordered)
        return stats.pending == later and stats.in_flight == 0

    async def _sleep(
        self, seconds: float, *, doorbell: bool = False, in_flight: bool = False
    ) -> bool:
        """Sleep, returning early on stop, on the store's doorbell or when a batch finishes.

        Returns True when the doorbell rang.
        """
        own: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._stop.wait())]
        if doorbell:
            own.append(asyncio.ensure_future(self.store.wait_for_messages(seconds)))
        others: set[asyncio.Task[None]] = set(self._in_flight) if in_flight else set()
        try:
            await asyncio.wait(
                [*own, *others], timeout=seconds, return_when=asyncio.FIRST_COMPLETED
            )
            # A doorbell that failed (the LISTEN connection died with the database) is no ring:
            # polling carries on, and the next wait opens a new listener.
            return (
                doorbell
                and own[1].done()
                and not own[1].cancelled()
                and own[1].exception() is None
                and own[1].result() is True
            )
        finally:
            for waiter in own:
                waiter.cancel()
            await asyncio.gather(*own, return_exceptions=True)

    async def _finish_in_flight(self) -> None:
        if not self._in_flight:
            return
        _, pending = await asyncio.wait(
            set(self._in_flight), timeout=self.settings.shutdown_timeout
        )
        # Each releases its claim when cancelled. A database that stops answering would hold
        # each hand-back for its command (or connect) timeout: the stop waits this long for
        # them, then leaves the rest to the lease's expiry, as after kill -9 (a probe: 22 s past
        # --shutdown-timeout).
        await _cancel_within(pending, _HAND_BACK_SECONDS)

    async def _heartbeat_loop(self) -> None:
        """Keep this relay's registry row fresh so ``stats`` shows it live."""
        while True:
            try:
                await self.store.heartbeat(self.info)
                self.observer.heartbeat(True)
            except StoreError as exc:
                self.observer.heartbeat(False)
                log.warning("heartbeat failed: %s", exc)
            self._task_healthy("heartbeat")
            await asyncio.sleep(self.settings.heartbeat_interval)

    async def _sweeper_loop(self) -> None:
        """Every half lease, take back expired leases; every sweep interval, one relay of all
        (the store's lock decides which) runs the sweep and persists its report."""
        settings = self.settings
        tick = min(settings.lease_seconds / 2, settings.sweep_interval)
        while True:
            try:
                released = await self.store.release_expired_leases()
                if released:
                    log.warning("took back %d messages whose lease expired", released)
                report = await self.store.sweep(
                    sweeper=self.relay_id,
                    interval=settings.sweep_interval,
                    retention_seconds=settings.dead_letter_retention,
                    batch_size=settings.sweep_batch_size,
                )
                if report is not None:
                    log.info("sweep done: %s", report.to_json())
            except StoreError as exc:
                self.observer.store_unavailable("sweep")
                log.warning("sweep failed: %s", exc)
            else:
                self._task_healthy("sweeper")
            await asyncio.sleep(tick)

    # -- one batch ---------------------------------------------------------------------------

    async def _deliver(self, claim: Claim, chained: _Chained | None = None) -> None:
        keeper = asyncio.create_task(self._keep_lease(claim), name="outboxer-lease")
        keeper.add_done_callback(_log_death)
        try:
            if claim.isolated:
                await self._deliver_alone(claim)
            else:
                await self._publish_and_settle(claim, chained)
        finally:
            keeper.cancel()
            if chained is not None:
                if not chained.published.is_set():  # never published (stopped): all failed
                    chained.failed = chained.keys
                    chained.published.set()
                chained.done = True

    def _live_chains(self) -> frozenset[int]:
        """Forget the chained batches that are done, and return the tokens of the others.

        Called before each claim, never during one: a batch that ends while a claim runs may
        have rows that claim took behind it, so it stays known (its ``failed`` keys fence them)
        until the claim's batch is registered.
        """
        for token, chained in list(self._chains.items()):
            if chained.done:
                del self._chains[token]
                for key in chained.keys:
                    holders = self._key_holders[key]
                    holders.remove(chained)
                    if not holders:
                        del self._key_holders[key]
        # Not behind a batch whose publish returned with failed keys: a row of such a key
        # claimed behind it is released at once (it may not overtake the failure), and
        # claimed again at once, and so on without a pause until that batch settles (a
        # settle retried against a failing store: a spin that burned a core, and a livelock on
        # the simulation's virtual clock). Left out, its rows block their keys until it settles.
        return frozenset(
            token
            for token, chained in self._chains.items()
            if not (chained.failed and chained.published.is_set())
        )

    async def _deliver_alone(self, claim: Claim) -> None:
        """Crash isolation: publish a suspect (a message whose lease expired: its relay died or
        froze holding it) with nothing else in flight, so that if its publish kills this
        process, it died alone and the store counts a solo death. After ``max_solo_deaths`` of
        them it is dead-lettered instead of published."""
        others = self._in_flight - {asyncio.current_task()}
        if others:
            await asyncio.wait(others)
        if claim.solo_deaths < self.settings.max_solo_deaths:
            await self._publish_and_settle(claim)
            return
        [message] = claim.messages
        reason = (
            f"the relay died {claim.solo_deaths} times while publishing this message alone "
            "(crash, OOM or kill)"
        )
        log.error("dead-lettered message %s: %s", message.id, reason)
        self.observer.published([message], ["dead_letter"], 0.0)
        self.counters.dead_lettered += 1
        await self._settle(claim, Settlement(dead=[(message.id, reason)]))

    async def _wait_for_in_flight(self) -> None:
        """Wait until no batch is in flight (or the relay stops)."""
        while self._in_flight and not self._stop.is_set():
            await self._sleep(self.settings.poll_interval, in_flight=True)

    async def _keep_lease(self, claim: Claim) -> None:
        """Extend the batch's lease every third of a lease until it is settled.

        A publish slower than the lease (a slow webhook or handler) would otherwise be taken
        back by a sweeper and published again by another, live relay. A relay that dies stops
        extending, so its batch is taken back at most one lease after its last extension.
        """
        lease = self.settings.lease_seconds
        while True:
            await asyncio.sleep(lease / 3)
            try:
                held = await self.store.extend_lease(claim, lease)
            except StoreError as exc:
                self.observer.store_unavailable("extend_lease")
                log.warning("could not extend the lease of a batch in flight: %s", exc)
                continue
            # (a batch being settled loses its rows to its own settle: not a lost lease)
            if held < len(claim.messages) and claim.token not in self._settling:
                log.warning(
                    "%d of %d messages in flight lost their lease before it was extended: "
                    "another relay may publish them too",
                    len(claim.messages) - held,
                    len(claim.messages),
                )

    async def _publish_and_settle(self, claim: Claim, chained: _Chained | None = None) -> None:
        settlement = Settlement()
        try:
            if not self.settings.ordered:
                started = self._now()
                results = await self._publish(claim.messages)
                self._classify(claim.messages, results, settlement, self._now() - started)
            elif self._pipelines_runs:
                await self._publish_runs(claim.messages, settlement, chained)
            else:
                await self._publish_in_waves(claim.messages, settlement)
        except asyncio.CancelledError:
            # Shutdown ran out of time: settle what is known, hand the rest back at once so
            # another relay can take it without waiting for the lease to expire.
            settled = settlement.settled_ids()
            rest = [m.id for m in claim.messages if m.id not in settled]
            self._release(settlement, rest)
            await asyncio.shield(self._settle(claim, settlement))
            raise
        self.counters.batches += 1
        await self._settle(claim, settlement)

    async def _publish_runs(
        self, messages: Sequence[Message], settlement: Settlement, chained: _Chained | None
    ) -> None:
        """Publish a claim in one call, key runs included, for a publisher that keeps key order.

        The broker stores the messages of one key in the order of the call, so a run needs no
        round trip per message. But it may accept message k+1 of a key that it was sent right
        behind a message k that failed (a nack, a rejected record, a connection that dropped and
        came back): k+1 must not count as published ahead of k, or a retry of k would land
        after it. So every message of a key behind its first failure is released, whatever its
        result (no attempt counted): it stays in the outbox behind k and is published again
        after k succeeds or is dead-lettered. A copy the broker accepted is then a duplicate,
        at most the rest of that key's run in this batch (docs/guarantees.md).

        A chained batch (its keys continue runs of batches still in flight here) first waits
        until those batches' calls returned, and releases, unsent, the messages of every key
        that did not go through there: the same fence, across batches.
        """
        failed = await chained.wait_for_earlier() if chained is not None else set()
        if failed:
            unsent = [m.id for m in messages if m.key is not None and m.key in failed]
            messages = [m for m in messages if m.key is None or m.key not in failed]
            self._release(settlement, unsent)
        started = self._now()
        results = await self._publish(messages)
        seconds = self._now() - started
        fence = _Fence.of(failed, messages, results)
        self._classify(fence.ahead, fence.ahead_results, settlement, seconds)
        self._release(settlement, fence.behind)
        if chained is not None:
            keys: set[str] = set()
            if len(settlement.published) < len(messages):
                published = set(settlement.published)
                keys = {m.key for m in messages if m.key is not None and m.id not in published}
            chained.failed = fence.failed | keys
            chained.published.set()
        if fence.accepted_behind:
            log.warning(
                "%d messages were accepted by the broker behind a failed message of their key: "
                "they stay in the outbox and are published again after it (duplicates)",
                fence.accepted_behind,
            )

    def _release(self, settlement: Settlement, ids: Sequence[str]) -> None:
        """Hand ``ids`` back unpublished, no attempt counted (they stay behind their key)."""
        settlement.released.extend(ids)
        self.counters.released += len(ids)

    async def _publish_in_waves(self, messages: Sequence[Message], settlement: Settlement) -> None:
        """Publish a claim whose keys may have runs of several messages, keeping key order.

        Wave *n* holds the *n*-th message of every key (unkeyed messages all go in the first),
        so each publish call has at most one message per key and can be pipelined freely. When a
        message fails, the rest of its key is released untouched: it waits behind the failed
        message, which stays the head of its key.
        """
        waves: list[list[Message]] = []
        depth: dict[str, int] = {}
        for message in messages:
            n = 0
            if message.key is not None:
                n = depth.get(message.key, 0)
                depth[message.key] = n + 1
            if n == len(waves):
                waves.append([])
            waves[n].append(message)
        blocked: set[str | None] = set()
        for n, wave in enumerate(waves):
            todo = [m for m in wave if m.key not in blocked]
            held = [m.id for m in wave if m.key in blocked]
            self._release(settlement, held)
            started = self._now()
            results = await self._publish(todo)
            outage = self._classify(todo, results, settlement, self._now() - started)
            blocked.update(m.key for m, r in zip(todo, results, strict=True) if r is not None)
            if outage:
                rest = [m.id for later in waves[n + 1 :] for m in later]
                self._release(settlement, rest)
                return

    async def _publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
        if not messages:
            return []
        try:
            results = await self.publisher.publish(messages)
        except PublishError as exc:
            return [exc] * len(messages)
        except Exception as exc:
            # A bug of the publisher or of its lifecycle, not the messages' fault: counting an
            # attempt would dead-letter the whole outbox in max_attempts rounds. Handled as an
            # outage (no attempt, the relay pauses) and logged with the traceback.
            log.exception("publisher raised unexpectedly: handled as an outage")
            outage = BrokerUnavailable(f"publisher failed unexpectedly: {exc!r}")
            return [outage] * len(messages)
        if len(results) != len(messages):
            log.error(
                "publisher returned %d results for %d messages: handled as an outage",
                len(results),
                len(messages),
            )
            return [BrokerUnavailable("publisher returned a wrong number of results")] * len(
                messages
            )
        return results

    def _classify(
        self,
        messages: Sequence[Message],
        results: Sequence[PublishError | None],
        settlement: Settlement,
        seconds: float,
    ) -> bool:
        """Add each message's fate to ``settlement``; True when the broker was unavailable.

        ``seconds`` is how long the publish call took (for the observer).
        """
        outage: BrokerUnavailable | None = None
        published = retried = dead = released = 0
        outcomes: list[PublishOutcome] = []
        failed: list[FailedPublish] = []
        for message, result in zip(messages, results, strict=True):
            if result is None:
                settlement.published.append(message.id)
                published += 1
                outcomes.append("published")
            elif isinstance(result, BrokerUnavailable):
                settlement.released.append(message.id)
                released += 1
                outage = result
                outcomes.append("broker_unavailable")
            elif (
                isinstance(result, PermanentPublishError)
                or message.attempts + 1 >= self.settings.max_attempts
            ):
                reason = _reason(result)
                settlement.dead.append((message.id, reason))
                failed.append(FailedPublish(message, message.attempts + 1, reason))
                dead += 1
                outcomes.append("dead_letter")
            else:
                delay = self.settings.retry.delay(message.attempts + 1)
                if isinstance(result, RetryablePublishError) and result.retry_after:
                    delay = max(delay, min(result.retry_after, MAX_RETRY_AFTER))
                reason = _reason(result)
                settlement.retries.append(Retry(message.id, delay, reason))
                failed.append(FailedPublish(message, message.attempts + 1, reason, delay))
                retried += 1
                outcomes.append("retry")
        self.observer.published(messages, outcomes, seconds)
        self._failure_log.batch(failed)
        counters = self.counters
        counters.published += published
        counters.retried += retried
        counters.dead_lettered += dead
        counters.released += released
        if outage is not None:
            self._broker_down(outage)
            return True
        if published and self._outage_failures:
            log.warning("broker is back after %d failed rounds", self._outage_failures)
            self._outage_failures = 0
            self.observer.outage(0, 0.0)
        return False

    def _broker_down(self, error: BrokerUnavailable) -> None:
        now = self._now()
        if now < self._outage_until:
            return  # another batch of the same round already backed off
        self._outage_failures += 1
        self._outage_reason = _reason(error)
        self.counters.outages += 1
        delay = self.settings.outage.delay(self._outage_failures)
        self._outage_until = now + delay
        self.observer.outage(self._outage_failures, delay)
        # Once per state change: the first failed round is a warning, the rounds after it (up
        # to one a minute for as long as the outage lasts) are debug lines, and "broker is back"
        # closes the outage. The outage gauge shows it meanwhile.
        log.log(
            logging.WARNING if self._outage_failures == 1 else logging.DEBUG,
            "broker unavailable (%s): pausing %.1fs (backing off up to %.0fs until it is back)",
            error,
            delay,
            self.settings.outage.cap,
        )

    async def _settle(self, claim: Claim, settlement: Settlement) -> None:
        """Settle, retrying while the database is away and the lease still holds."""
        deadline = self._now() + self.settings.lease_seconds
        failures = 0
        self._settling.add(claim.token)
        try:
            while True:
                try:
                    await self.store.settle(claim, settlement)
                    return
                except StoreError as exc:
                    self.observer.store_unavailable("settle")
                    failures += 1
                    delay = min(0.1 * 2**failures, 5.0)
                    if self._now() + delay > deadline:
                        # The lease runs out: another relay will publish these again (the
                        # duplicates the at-least-once contract allows after a failure).
                        log.error("could not settle batch, lease will expire: %s", exc)
                        return
                    await asyncio.sleep(delay)
        finally:
            self._settling.discard(claim.token)


async def _cancel_within(tasks: Collection[asyncio.Task[Any]], seconds: float) -> None:
    """Cancel ``tasks`` and wait for them to end, giving their cleanup (a hand-back, a
    rollback: each a round trip to a database that may not answer) at most ``seconds``, then
    cancelling that too."""
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    _, stuck = await asyncio.wait(tasks, timeout=seconds)
    for task in stuck:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
