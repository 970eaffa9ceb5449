"""Running a consumer: a broker adapter feeds batches to an :class:`~outboxer.inbox.inbox.Inbox`.

The broker adapters (``outboxer.brokers.<name>.consumer``: kafka, rabbitmq, nats, redis) all
follow one rule: **a batch is acknowledged to the broker only after** ``deliver(batch)``
**returned**, i.e. after the outcome of every message of the batch (handled, duplicate, failure
recorded, ...) committed in the database. A crash anywhere before that makes the broker deliver
the batch again, and the inbox turns the messages already committed into duplicates. If
``deliver`` raises :class:`~outboxer.inbox.inbox.ConsumerStopping` (stop requested while the
database is down) the adapter acknowledges nothing and returns.

:func:`run_consumer` runs an adapter together with the inbox's re-drive loop (failed
consumptions) and the shared sweep, until ``inbox.stop()`` (SIGTERM/SIGINT in the CLI): the
adapter stops fetching, the batch in progress finishes and is acknowledged, connections close.
A batch that has not finished within ``shutdown_timeout`` is abandoned (its transactions roll
back, nothing is acknowledged, the broker delivers it again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from outboxer.inbox.inbox import Inbox, InboxCounters
from outboxer.message import Message
from outboxer.ports import SweeperStore, log_last_sweep

__all__ = ["BrokerConsumer", "Deliver", "run_consumer"]

log = logging.getLogger("outboxer.consumer")

#: Stores the outcome of every message of a batch; returns when they are committed.
Deliver = Callable[[Sequence[Message]], Awaitable[object]]


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
    background = [asyncio.create_task(inbox.run_redrives(), name="outboxer-redrive")]
    if sweeper is not None:
        background.append(asyncio.create_task(inbox.run_sweeps(sweeper), name="outboxer-sweep"))
    try:
        async with broker:
            reader = asyncio.create_task(
                broker.run(inbox.receive_batch, stop), name="outboxer-read"
            )
            stopping = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait({reader, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if reader not in done:
                try:
                    await asyncio.wait_for(asyncio.shield(reader), shutdown_timeout)
                except TimeoutError:
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
            if not reader.cancelled():
                reader.result()  # an adapter failure (not a stop) is the consumer's
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        log.info("consumer %r stopped: %s", inbox.consumer, inbox.counters.to_json())
    return inbox.counters
