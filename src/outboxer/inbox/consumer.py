"""Running a consumer: a broker adapter feeds batches to an :class:`~outboxer.inbox.inbox.Inbox`.

The broker adapters (``outboxer.brokers.<name>.consumer``: kafka, rabbitmq, nats, redis) all
follow one rule: **a batch is acknowledged to the broker only after** ``deliver(batch)``
**returned**, i.e. after the outcome of every message of the batch (handled, duplicate, failure
recorded, ...) committed in the database, and after every batch fetched before it was
acknowledged. A crash anywhere before that makes the broker deliver the batch again, and the
inbox turns the messages already committed into duplicates. While the inbox stores a batch the
adapter fetches the next one and hands it over (:class:`Deliveries`: two batches in flight), so
the database's round trips overlap the broker's; the inbox keeps each key's order across them.
If ``deliver`` raises :class:`~outboxer.inbox.inbox.ConsumerStopping` (stop requested while the
database is down) the adapter acknowledges neither that batch nor any after it, and returns.

:func:`run_consumer` runs an adapter together with the inbox's re-drive loop (failed
consumptions) and the shared sweep, until ``inbox.stop()`` (SIGTERM/SIGINT in the CLI): the
adapter stops fetching, the batches in progress finish and are acknowledged, connections close.
A batch that has not finished within ``shutdown_timeout`` is abandoned (its transactions roll
back, nothing is acknowledged, the broker delivers it again). A batch that fails for another
reason than an outage (which the inbox retries in place) — a bug, a value the database refuses,
a handler that ended the inbox's transaction — stops the consumer at once: nothing more is read
or acknowledged and :func:`run_consumer` raises the error, also when the adapter has no further
batch to hand over. A re-drive whose handler ended the transaction stops it too (gracefully).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from outboxer.inbox.inbox import ConsumerStopping, Inbox, InboxCounters
from outboxer.message import Message
from outboxer.ports import SweeperStore, log_last_sweep

__all__ = ["BrokerConsumer", "Deliver", "Deliveries", "opened", "run_consumer"]

_Client = TypeVar("_Client")

log = logging.getLogger("outboxer.consumer")

#: Stores the outcome of every message of a batch; returns when they are committed.
Deliver = Callable[[Sequence[Message]], Awaitable[object]]
#: Acknowledges one batch to the broker (reports its own failures: a batch not acknowledged is
#: delivered again, and the inbox drops what it stored).
Acknowledge = Callable[[], Awaitable[object]]


class BrokerConsumer(Protocol):
    """Reads messages from a broker for one consumer and acknowledges them after delivery.

    ``async with`` connects (creating the broker-side group/queue/durable if needed) and closes.
    """

    async def __aenter__(self) -> BrokerConsumer: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def run(self, deliver: Deliver, stop: asyncio.Event) -> None:
        """Fetch batches until ``stop`` is set; ``await deliver(batch)``, then acknowledge the
        batch. Reconnects by itself after broker outages."""
        ...


def opened(client: _Client | None, adapter: object) -> _Client:
    """The client of a broker adapter that ``run`` needs open (``async with adapter:``)."""
    if client is None:
        raise RuntimeError(f"{type(adapter).__name__} is not open (use 'async with')")
    return client


class Deliveries:
    """Delivers up to ``depth`` batches at once and acknowledges them in the order they were
    fetched, each only after it and every batch before it are stored.

    A broker adapter fetches the next batch while the inbox stores the previous one, so the
    database's round trips overlap the broker's instead of adding to them. The inbox keeps the
    order of each key across the batches in flight (a chunk waits for the chunks of earlier
    batches holding its keys), and acknowledgements are in order, so a cumulative one (a Kafka
    offset, a RabbitMQ multiple-ack) never covers a batch that is not stored.

    Usage: ``async with Deliveries(deliver) as deliveries:`` around an adapter's loop, and
    ``if not await deliveries.submit(batch, acknowledge): return`` for each batch. Leaving the
    block waits for the batches in flight to be stored and acknowledged; leaving it with an
    exception (a cancellation too) abandons them.
    """

    def __init__(self, deliver: Deliver, depth: int = 2) -> None:
        self._deliver = deliver
        self._depth = depth
        self._in_flight: collections.deque[asyncio.Task[bool]] = collections.deque()

    async def __aenter__(self) -> Deliveries:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            await self.finish()
        else:
            await self.abandon()

    async def submit(self, batch: Sequence[Message], acknowledge: Acknowledge) -> bool:
        """Start storing ``batch``; ``acknowledge`` runs once it and the batches submitted
        before it are stored and acknowledged. Waits while ``depth`` batches are in flight.

        Returns ``False`` when a batch could not be stored because the consumer is stopping
        (:class:`~outboxer.inbox.inbox.ConsumerStopping`): it and every batch after it stay
        unacknowledged, the adapter stops."""
        while len(self._in_flight) >= self._depth:
            if not await self._settle_oldest():
                return False
        previous = self._in_flight[-1] if self._in_flight else None
        # The task's first step (before any await) takes the batch's turn on its keys: tasks
        # start in the order they are created, so batches queue in the order they came.
        task = asyncio.create_task(self._store_and_acknowledge(batch, acknowledge, previous))
        self._in_flight.append(task)
        return True

    async def finish(self) -> bool:
        """Wait until every batch in flight is stored and acknowledged; ``False`` as for
        :meth:`submit`."""
        while self._in_flight:
            if not await self._settle_oldest():
                return False
        return True

    async def _settle_oldest(self) -> bool:
        task = self._in_flight.popleft()
        try:
            stored = await task
        except BaseException:
            await self.abandon()  # a failure (or cancellation) ends every batch after it
            raise
        if not stored:
            await self.abandon()
        return stored

    async def abandon(self) -> None:
        """Cancel the batches in flight (their transactions roll back, nothing more is
        acknowledged: the broker delivers them again)."""
        tasks, self._in_flight = list(self._in_flight), collections.deque()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _store_and_acknowledge(
        self,
        batch: Sequence[Message],
        acknowledge: Acknowledge,
        previous: asyncio.Task[bool] | None,
    ) -> bool:
        try:
            await self._deliver(batch)
        except ConsumerStopping:
            return False
        # shield: this task's cancellation must not cancel the previous batch's
        if previous is not None and not await asyncio.shield(previous):
            return False
        await acknowledge()
        return True


async def run_consumer(
    inbox: Inbox,
    broker: BrokerConsumer,
    *,
    sweeper: SweeperStore | None = None,
    shutdown_timeout: float = 30.0,
) -> InboxCounters:
    """Consume until :meth:`Inbox.stop <outboxer.inbox.inbox.Inbox.stop>` is called; returns
    the inbox's counters.

    Args:
        inbox: The consumer's inbox (store, handlers, settings).
        broker: An adapter that is not entered yet; entered and closed here.
        sweeper: The store to run the shared sweep on (usually the inbox's store); ``None``
            leaves sweeping to others.
        shutdown_timeout: Seconds the batch in progress may take after ``stop``.
    """
    log.info("consumer %r starting", inbox.consumer)
    if sweeper is not None:
        await log_last_sweep(sweeper, log)
    stop = inbox.stopping
    failed: list[Exception] = []

    def redrives_ended(task: asyncio.Task[None]) -> None:
        # The re-drive loop ends only with an error retrying would repeat (a handler that
        # ended the inbox's transaction): the consumer stops reading and raises it.
        error = None if task.cancelled() else task.exception()
        if isinstance(error, Exception):
            if not failed:
                failed.append(error)
            stop.set()

    background = [asyncio.create_task(inbox.run_redrives(), name="outboxer-redrive")]
    background[0].add_done_callback(redrives_ended)
    if sweeper is not None:
        background.append(asyncio.create_task(inbox.run_sweeps(sweeper), name="outboxer-sweep"))

    async def deliver(batch: Sequence[Message]) -> object:
        try:
            return await inbox.receive_batch(batch)
        except ConsumerStopping:
            raise
        except Exception as exc:
            # Not an outage (retried in place) but a bug or a value the database refuses.
            # The adapter would learn of it only when it settles this batch, after handing
            # over more: with nothing more to read the consumer would sit alive and idle.
            # Reading stops now (nothing more is acknowledged) and the failure is the
            # consumer's.
            if not failed:
                failed.append(exc)
                reader.cancel()
            raise

    try:
        async with broker:
            reader = asyncio.create_task(broker.run(deliver, stop), name="outboxer-read")
            stopping = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait({reader, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if reader not in done:
                # asyncio.wait, not wait_for: the reader cancelled by a failed batch (above)
                # must not raise CancelledError here
                finished, _ = await asyncio.wait({reader}, timeout=shutdown_timeout)
                if not finished:
                    log.warning(
                        "consumer %r: the batch in progress did not finish within %.0f s; it "
                        "is abandoned (not acknowledged: the broker delivers it again)",
                        inbox.consumer,
                        shutdown_timeout,
                    )
                    reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await reader
            stopping.cancel()
            if failed:
                raise failed[0]
            if not reader.cancelled():
                reader.result()  # an adapter failure (not a stop) is the consumer's
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        log.info("consumer %r stopped: %s", inbox.consumer, inbox.counters.to_json())
    return inbox.counters
