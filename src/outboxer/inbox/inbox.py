"""The idempotent-processing core: deliveries in, handlers run once per consumer, outcomes out.

An :class:`Inbox` belongs to one *consumer* (a name: the service or handler group that
processes a stream of messages). For every message a broker delivers it runs the registry's
handlers inside one database transaction of the store (:class:`~outboxer.ports.InboxStore`)
that also records the pair (consumer, message id); :mod:`outboxer.inbox.consume` decides:

- the pair is already there → a duplicate: nothing runs, the broker message is acknowledged;
- the handlers succeed → their writes (made through ``ctx.connection``) and the pair commit
  together, then the broker message is acknowledged;
- a handler raises → its writes are undone (a savepoint), the failure is recorded with the
  whole message, and the broker message is acknowledged: the failure no longer depends on the
  broker. The consumer's re-drive loop runs it again after ``retry.delay(attempts)`` (1 s, 2 s,
  4 s, ... by default); after ``max_attempts`` (or at once for a
  :class:`~outboxer.inbox.registry.PermanentHandlerError`) the message becomes a dead letter
  with direction ``consume``;
- a keyed message whose key has an earlier message still failing for this consumer waits
  behind it (stored, acknowledged, re-driven in arrival order): a failure blocks its own key,
  never the others.

Only when the database itself is unreachable is nothing committed: the message is retried in
place (outage backoff) and not acknowledged, so the broker keeps it.

This module imports no driver: stores and broker adapters are passed in.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import socket
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from outboxer.config import (
    DAY,
    MAX_SECONDS,
    SETTING,
    Backoff,
    Setting,
    check_fields,
    count,
    duration,
    setting,
)
from outboxer.errors import (
    ConfigurationError,
    HandlerEndedTransaction,
    OutboxerError,
    PermanentPublishError,
    PermissionDenied,
    StoreError,
    error_summary,
)
from outboxer.inbox.consume import consume, redrive_consume_failures
from outboxer.inbox.registry import (
    HandlerRegistry,
    PermanentHandlerError,
    cancelled_itself,
    exited,
)
from outboxer.message import Message
from outboxer.ports import ConsumeFailure, ConsumeOutcome, InboxStore, SweeperStore

__all__ = [
    "ConsumerStopping",
    "DeliveryOutcome",
    "Inbox",
    "InboxCounters",
    "InboxSettings",
    "validate_consumer_name",
]

log = logging.getLogger("outboxer.inbox")

#: What one more chunk of a batch costs (s): its transaction's three round trips of client and
#: database CPU, 0.1-0.5 ms each on the development VM as its load varies (see ``Inbox._chunks``).
_CHUNK_COST = 0.001

#: What :meth:`Inbox.receive` reports: a store outcome, or ``ignored`` (no handler for it).
DeliveryOutcome = ConsumeOutcome | Literal["ignored"]

_CONSUMER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,199}")


def validate_consumer_name(name: str) -> str:
    """Return ``name`` if it can name an inbox consumer, a Kafka group, a RabbitMQ queue, a
    Redis consumer group and (sanitized) a NATS durable; else raise ``ConfigurationError``."""
    if not isinstance(name, str) or not _CONSUMER_NAME.fullmatch(name):
        raise ConfigurationError(
            f"invalid consumer name {name!r}: use 1-200 letters, digits, '_', '.', ':' or '-', "
            "starting with a letter or digit"
        )
    return name


class ConsumerStopping(OutboxerError):
    """The consumer was asked to stop while a delivery could not be stored (database down):
    the broker adapter must not acknowledge the batch; the broker delivers it again later."""


@dataclass(frozen=True, slots=True)
class InboxSettings:
    """How a consumer processes, retries and forgets.

    Attributes:
        consumer: The inbox name (see :func:`validate_consumer_name`); also the broker-side
            group/queue/durable name of the consumer adapters.
        max_attempts: Failed attempts after which a message becomes a consume dead letter.
        retry: Delay before re-driving a failed consumption, by attempts so far.
        retention: Seconds an inbox row is kept after its message was handled (or given up).
            It must exceed the longest time the broker may deliver the message again (see
            docs/inbox.md): a redelivery after that would run the handlers again.
        concurrency: Messages of different keys processed at the same time; messages of one
            key are processed one after the other, in delivery order.
        redrive_interval: How often due failed consumptions are looked for, in seconds.
        redrive_batch_size: Failed consumptions re-driven per round.
        outage: Pause between attempts to store a delivery while the database is down.
        batch_transactions: Commit the messages of a chunk (the part of a batch one
            connection handles, see :meth:`Inbox.receive_batch`) in one transaction (the
            default): one round trip records the whole chunk in the inbox, one commits it, and
            a handler that takes the context (so may write) runs in a savepoint, one round trip
            more. ``False`` commits each message on its own (``--transaction-per-message``):
            a crash before a commit then repeats the external side effects (e-mails, HTTP
            calls) of the message in progress only, not of every handler of the chunk that
            had run, at the cost of a transaction per message. Database effects are
            exactly-once either way.
        sweep_interval: How often this consumer offers to run the sweep (one instance of all
            relays and consumers runs it, see ``SweeperStore.sweep``); 0 disables.
        sweep_batch_size: Dead letters purged per sweep (the sweep's ``batch_size``).
        dead_letter_retention: Dead letters older than this are purged by the sweep; 0 keeps.
    """

    consumer: str = field(  # required: field(), not setting(), so type checkers know
        metadata={
            SETTING: Setting(
                "Inbox name; also the Kafka group, RabbitMQ queue, NATS durable prefix and "
                "Redis group. Default: the handlers module.",
                option="--consumer-name",
            )
        }
    )
    max_attempts: int = count(
        5,
        help="Failed attempts after which a message becomes a consume dead letter.",
        env="OUTBOXER_CONSUME_MAX_ATTEMPTS",
        maximum=1000,
    )
    retry: Backoff = setting(
        default_factory=lambda: Backoff(base=1.0, factor=2.0, cap=300.0),
        help="Delay before re-driving a failed consumption, by attempts",
        env="OUTBOXER_CONSUME_RETRY",
    )
    retention: float = duration(
        7 * DAY,
        help="Seconds an inbox row is kept; must exceed the broker's redelivery horizon.",
        option="--inbox-retention",
        maximum=MAX_SECONDS,
    )
    concurrency: int = count(
        8,
        help="Messages of different keys handled at once (one key: one at a time, in order).",
        env="OUTBOXER_CONSUME_CONCURRENCY",
        maximum=256,
    )
    redrive_interval: float = duration(
        1.0,
        help="How often due failed consumptions are re-driven (s).",
        option="--retry-interval",
        env="OUTBOXER_CONSUME_RETRY_INTERVAL",
        maximum=3600,
    )
    redrive_batch_size: int = count(
        50,
        help="Failed consumptions re-driven per round.",
        option="--retry-batch-size",
        env="OUTBOXER_CONSUME_RETRY_BATCH_SIZE",
    )
    outage: Backoff = setting(
        default_factory=Backoff,
        help="Pause between attempts to store a delivery while the database is down",
        env="OUTBOXER_CONSUME_OUTAGE",
    )
    batch_transactions: bool = setting(
        True,
        help="One inbox transaction per message instead of per batch chunk: a crash then "
        "repeats the external side effects of one message only; slower (see docs/inbox.md).",
        option="--transaction-per-message",
        negate=True,
    )
    sweep_interval: float = duration(
        60.0,
        help="How often this consumer offers to run the shared sweep (s); 0: leave it to others.",
        zero=True,
    )
    sweep_batch_size: int = count(50, help="Dead letters purged per sweep.")
    dead_letter_retention: float = duration(
        30 * DAY,
        help="Seconds dead letters are kept before the sweep purges them; 0 keeps them.",
        zero=True,
        maximum=MAX_SECONDS,
    )

    def __post_init__(self) -> None:
        validate_consumer_name(self.consumer)
        check_fields(self, "inbox")


@dataclass(slots=True)
class InboxCounters:
    """What a consumer did since it started (first deliveries and re-drives)."""

    handled: int = 0
    duplicate: int = 0
    waiting: int = 0
    retrying: int = 0
    dead: int = 0
    ignored: int = 0
    redriven: int = 0

    def count(self, outcome: DeliveryOutcome) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)

    def add(self, outcomes: Sequence[DeliveryOutcome]) -> None:
        """Count a chunk's outcomes (one attribute update per kind, not per message)."""
        for outcome, n in Counter(outcomes).items():
            setattr(self, outcome, getattr(self, outcome) + n)

    def to_json(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class _KeyTurn:
    """A chunk's place in the order of its keys (see ``Inbox._take_keys``)."""

    keys: set[str]
    after: set[asyncio.Future[bool]]
    stored: asyncio.Future[bool]


class Inbox:
    """Runs a registry's handlers for one consumer, at most once per message id, through a store.

    Args:
        store: Where the inbox lives (PostgreSQL, SQLite, or the in-memory fake).
        registry: The handlers; messages without a handler are acknowledged and ignored (a
            consumer may subscribe to a topic that carries types it does not handle).
        settings: Consumer name, retries, retention, concurrency.
    """

    def __init__(
        self, store: InboxStore, registry: HandlerRegistry, settings: InboxSettings
    ) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings
        self.counters = InboxCounters()
        #: Set by :meth:`stop`: consumers stop fetching, waits for the database give up.
        self.stopping = asyncio.Event()
        self._slots = asyncio.Semaphore(settings.concurrency)
        #: Key → whether the last chunk holding it (of a batch still in flight) got stored:
        #: a later batch's chunk with that key waits for it, so keys keep their order when a
        #: broker adapter delivers its next batch before the previous one is done.
        self._keys: dict[str, asyncio.Future[bool]] = {}
        #: Mean seconds the handlers of a message took (recent batches weigh most); ``None``
        #: until a batch was handled. It decides how many chunks a batch is split into.
        self._handler_seconds: float | None = None
        self._handler_time = 0.0  # handler seconds and messages since the last batch ended
        self._handler_runs = 0

    def stop(self) -> None:
        """Ask the consumer running this inbox to stop gracefully (see ``run_consumer``)."""
        self.stopping.set()

    @property
    def consumer(self) -> str:
        return self.settings.consumer

    # -- deliveries ----------------------------------------------------------------------------

    async def receive(self, message: Message) -> DeliveryOutcome:
        """Process one delivered message; returns once its outcome is committed.

        Raises:
            StoreError: the database failed; nothing was committed (do not acknowledge).
        """
        [outcome] = await self._store_chunk([message])
        return outcome

    async def receive_batch(self, messages: Sequence[Message]) -> list[DeliveryOutcome]:
        """Process a batch a broker delivered; returns when every outcome is committed.

        Messages of one key run one after the other in batch order; different keys (and
        unkeyed messages) run concurrently: the batch's keys are split into up to
        ``concurrency`` chunks, each processed on one database connection in one transaction
        (or one per message, see ``InboxSettings.batch_transactions``). While the database is
        down a chunk is retried in place with the outage
        backoff (messages it had committed come back as duplicates).

        Raises:
            ConsumerStopping: stop was requested while the database was down; some messages
                of the batch may not be stored: acknowledge none of them.
        """
        outcomes: list[DeliveryOutcome | None] = [None] * len(messages)
        # Taken before the first await: a batch delivered after this one queues behind it.
        chunks = [(c, self._take_keys([messages[i] for i in c])) for c in self._chunks(messages)]

        async def chunk(indexes: list[int], keys: _KeyTurn) -> None:
            try:
                for earlier in keys.after:
                    # shield: a cancelled chunk must not cancel the turn other chunks await
                    if not await asyncio.shield(earlier):
                        raise ConsumerStopping(
                            "an earlier batch with a key of this one was not stored; this one "
                            "is left to the broker as well, so that the key keeps its order"
                        )
                # The semaphore bounds connections across batches delivered at the same time
                # too (the next batch of the adapter, one per NATS subject).
                async with self._slots:
                    results = await self._store_until_stored([messages[i] for i in indexes])
                keys.stored.set_result(True)
            finally:
                self._give_keys(keys)
            for index, outcome in zip(indexes, results, strict=True):
                outcomes[index] = outcome

        if len(chunks) == 1:
            await chunk(*chunks[0])
        else:
            # Every chunk runs to its end (no cancellation of a handler half-way through when
            # another chunk gives up), then the first error, if any, is the batch's.
            results = await asyncio.gather(*(chunk(*c) for c in chunks), return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            for error in errors:
                if not isinstance(error, ConsumerStopping):
                    raise error
            if errors:
                raise errors[0]
        self._learn_handler_time()
        return [outcome for outcome in outcomes if outcome is not None]

    def _learn_handler_time(self) -> None:
        if not self._handler_runs:
            return
        mean = self._handler_time / self._handler_runs
        self._handler_time, self._handler_runs = 0.0, 0
        previous = self._handler_seconds
        self._handler_seconds = mean if previous is None else 0.7 * previous + 0.3 * mean

    def _take_keys(self, chunk: Sequence[Message]) -> _KeyTurn:
        """The chunk's turn on its keys: after the chunks of earlier batches still holding
        any of them."""
        keys = {message.key for message in chunk if message.key is not None}
        turn = _KeyTurn(
            keys=keys,
            after={self._keys[key] for key in keys if key in self._keys},
            stored=asyncio.get_running_loop().create_future(),
        )
        for key in turn.keys:
            self._keys[key] = turn.stored
        return turn

    def _give_keys(self, turn: _KeyTurn) -> None:
        if not turn.stored.done():
            turn.stored.set_result(False)  # not stored: later batches of its keys wait no more
        for key in turn.keys:
            if self._keys.get(key) is turn.stored:
                del self._keys[key]

    def _chunks(self, messages: Sequence[Message]) -> list[list[int]]:
        """Indexes of ``messages`` in up to ``concurrency`` chunks; all messages of a key in
        one chunk, every chunk in batch order. Keys go to the least loaded chunk.

        Each chunk is a transaction of its own (three round trips, a commit to flush) that
        lets its handlers wait on I/O beside the other chunks'. How many pay off depends on how
        long handlers take: *k* chunks of *n* messages whose handlers take *h* seconds each
        cost about ``k * _CHUNK_COST + n * h / k``, least near ``k = sqrt(n * h / _CHUNK_COST)``.
        Handlers that return at once get one chunk; slow ones ``concurrency``; the first batch
        (nothing measured yet) ``concurrency`` too."""
        count = self.settings.concurrency
        # A transaction per message (not batch_transactions) costs its round trips per message
        # whatever the chunks: every connection helps then.
        if self._handler_seconds is not None and self.settings.batch_transactions:
            work = len(messages) * self._handler_seconds  # handler seconds in the batch
            best = math.sqrt(work / _CHUNK_COST)
            # the whole number of chunks nearest the minimum of k * cost + work / k
            low = max(1, math.floor(best))
            if low * _CHUNK_COST + work / low > (low + 1) * _CHUNK_COST + work / (low + 1):
                low += 1
            count = min(count, low)
        if count == 1:
            return [list(range(len(messages)))] if messages else []
        lanes: dict[object, list[int]] = defaultdict(list)
        for index, message in enumerate(messages):
            lanes[message.key if message.key is not None else (None, index)].append(index)
        count = min(count, len(lanes))
        chunks: list[list[int]] = [[] for _ in range(count)]
        for lane in sorted(lanes.values(), key=len, reverse=True):
            min(chunks, key=len).extend(lane)
        return [sorted(c) for c in chunks if c]

    async def _store_chunk(self, messages: Sequence[Message]) -> list[DeliveryOutcome]:
        """One store call for the messages that have handlers; ``ignored`` for the rest."""
        route = self.registry.route
        handled = [m for m in messages if route(m) is not None]
        outcomes: list[DeliveryOutcome] = []
        if handled:
            outcomes += await consume(
                self.store,
                self.consumer,
                handled,
                self._run_handlers,
                on_failure=self._judge,
                retention_seconds=self.settings.retention,
                single_transaction=self.settings.batch_transactions,
                may_write=self.registry.wants_context,
            )
        if len(handled) < len(messages):
            results = iter(outcomes)
            outcomes = []
            for message in messages:
                if route(message) is not None:
                    outcomes.append(next(results))
                else:
                    log.debug(
                        "no handler for %s (type %r, topic %r)",
                        message.id,
                        message.type,
                        message.topic,
                    )
                    outcomes.append("ignored")
        self.counters.add(outcomes)
        return outcomes

    async def _store_until_stored(self, messages: Sequence[Message]) -> list[DeliveryOutcome]:
        failures = 0
        while True:
            try:
                return await self._store_chunk(messages)
            except StoreError as exc:
                failures += 1
                delay = self.settings.outage.delay(failures)
                log.warning(
                    "cannot store %d message(s) for consumer %r (%s); retrying in %.0f s",
                    len(messages),
                    self.consumer,
                    exc,
                    delay,
                )
                if await self._stopped_within(delay):
                    raise ConsumerStopping(
                        "stopping while the database is down; the unacknowledged messages stay "
                        "with the broker"
                    ) from exc

    async def _stopped_within(self, seconds: float) -> bool:
        try:
            async with asyncio.timeout(seconds):
                await self.stopping.wait()
        except TimeoutError:
            return False
        return True

    # -- handlers ------------------------------------------------------------------------------

    async def _run_handlers(self, message: Message, connection: Any, attempt: int) -> None:
        route = self.registry.route(message)
        if route is None:  # not routed when the chunk was split: nothing to run
            return
        started = time.perf_counter()
        try:
            await route.start(message, connection, self.consumer, attempt)
        except asyncio.CancelledError as exc:
            # Nobody cancelled the handler: it awaited something cancelled elsewhere (a task
            # of a shared client). Left to propagate, this would pass for a stop and end the
            # batch, nothing recorded or acknowledged: it is the message's failure instead.
            failure = cancelled_itself(exc)
            if failure is None:
                raise  # the consumer is stopping or abandoning the batch
            raise failure from exc
        except Exception:
            raise
        except BaseException as exc:  # SystemExit, KeyboardInterrupt, a handler's own
            raise exited(exc) from exc
        finally:
            self._handler_time += time.perf_counter() - started
            self._handler_runs += 1

    def _not_here(self, message: Message) -> Exception | None:
        """The error of a re-drive this instance cannot make: no handler for the message here
        (another instance's handlers, a rolling deploy). A failed attempt like any other,
        never taken for handled."""
        if self.registry.route(message) is not None:
            return None
        return LookupError(
            f"no handler for type {message.type!r} on topic {message.topic!r} in this instance"
        )

    def _judge(self, message: Message, attempts: int, error: Exception) -> ConsumeFailure:
        reason = f"consumer {self.consumer!r}: {error_summary(error)}"
        permanent = isinstance(error, PermanentHandlerError | PermanentPublishError)
        # Logged as it is stored (ConsumeFailure: cut, control characters escaped)
        if permanent or attempts >= self.settings.max_attempts:
            failure = ConsumeFailure(reason, None)
            log.error(
                "message %s (key %r, type %r) moved to dead letter after %d attempts: %s",
                message.id,
                message.key,
                message.type,
                attempts,
                failure.reason,
                extra={"message_ids": [message.id]},
            )
            return failure
        failure = ConsumeFailure(reason, self.settings.retry.delay(attempts))
        log.warning(
            "message %s (key %r, type %r) failed, attempt %d of %d; retrying in %.3gs: %s",
            message.id,
            message.key,
            message.type,
            attempts,
            self.settings.max_attempts,
            failure.retry_in,
            failure.reason,
            extra={"message_ids": [message.id]},
        )
        return failure

    # -- re-drives and the sweep ---------------------------------------------------------------

    async def redrive(self) -> list[ConsumeOutcome]:
        """Re-drive this consumer's due failed consumptions (one batch); returns the outcomes."""
        outcomes = await redrive_consume_failures(
            self.store,
            self.consumer,
            self._run_handlers,
            on_failure=self._judge,
            retention_seconds=self.settings.retention,
            limit=self.settings.redrive_batch_size,
            may_write=self.registry.wants_context,
            not_here=self._not_here,
        )
        for outcome in outcomes:
            self.counters.redriven += 1
            self.counters.count(outcome)
        return outcomes

    async def run_redrives(self) -> None:
        """Re-drive due failures until cancelled: every ``redrive_interval``, and at once
        again while something was re-driven (messages waiting behind a key that just got
        unblocked are due at once, so a backlog drains without waiting a round each).
        Outages (paced by the outage backoff) and other errors are logged and the loop goes
        on; it ends only with a :class:`~outboxer.errors.HandlerEndedTransaction` or a
        :class:`~outboxer.errors.PermissionDenied`, which retrying would repeat."""
        errors = 0  # unexpected ones in a row
        outages = 0  # database failures in a row
        while True:
            try:
                outcomes = await self.redrive()
                errors = 0
                if outages:
                    log.info("re-drives of failed consumptions work again")
                    outages = 0
            except StoreError as exc:
                # The database is down: paced by the outage backoff, as deliveries are, not
                # every redrive_interval (a line and a connection attempt a second, or a
                # hundred with --retry-interval 0.01, for the whole outage).
                outages += 1
                delay = max(self.settings.redrive_interval, self.settings.outage.delay(outages))
                log.warning(
                    "re-drive of failed consumptions failed: %s; retrying in %.3g s", exc, delay
                )
                await asyncio.sleep(delay)
                continue
            except (HandlerEndedTransaction, PermissionDenied):
                # A bug in a handler that every retry would repeat (and with it whatever the
                # handler committed), or a role without a privilege: the consumer stops with
                # it (see run_consumer). The failure stays, re-driven after the restart.
                raise
            except Exception:
                # Not an outage: a bug, a handler that broke its connection. Ending the loop
                # would leave the consumer running without re-drives, silently (no failure
                # retried, keys waiting behind one blocked for good): log it loudly, go on.
                errors += 1
                delay = self.settings.outage.delay(errors)
                log.exception(
                    "re-drive of failed consumptions failed unexpectedly (%d in a row); "
                    "retrying in %.0f s",
                    errors,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            if "handled" in outcomes or "dead" in outcomes:
                continue  # a key may have become unblocked
            await asyncio.sleep(self.settings.redrive_interval)

    async def run_sweeps(self, store: SweeperStore) -> None:
        """Offer to run the shared sweep every ``sweep_interval`` until cancelled; the store's
        lock lets one instance (relay or consumer) sweep at a time. It counts the consume
        retries and failures, purges expired inbox rows and old dead letters."""
        if not self.settings.sweep_interval:
            return
        sweeper = f"consumer:{self.consumer}:{socket.gethostname()}:{os.getpid()}"
        while True:
            try:
                report = await store.sweep(
                    sweeper=sweeper,
                    interval=self.settings.sweep_interval,
                    retention_seconds=self.settings.dead_letter_retention,
                    batch_size=self.settings.sweep_batch_size,
                )
                if report is not None:
                    log.info("sweep done: %s", report.to_json())
            except (StoreError, PermissionDenied) as exc:  # (the sweep's privileges: docs/
                log.warning("sweep failed: %s", exc)  # operations.md; consuming goes on)
            except Exception:  # not an outage; ending the loop would stop sweeping silently
                log.exception(
                    "sweep failed unexpectedly; offered again in %.0f s",
                    self.settings.sweep_interval,
                )
            await asyncio.sleep(self.settings.sweep_interval)
