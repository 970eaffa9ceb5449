"""Handlers the consumer tests run, in-process and in ``outboxer consume`` subprocesses
(``--handlers tests.integration.consumer_handlers:registry``).

A ``Job`` writes one row to the effects table named by the message header ``effects`` through
the inbox transaction's connection, so the table shows exactly which deliveries took effect.
``fail="once"`` fails the first attempt; ``fail="always"`` fails until the message id is added
to :data:`FIXED` (the "bug fix" before a replay); ``sleep`` slows a job down so a test can kill
the consumer in the middle of a batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from dataclasses import dataclass

from outboxer.inbox import HandlerContext, HandlerRegistry

registry = HandlerRegistry()

#: Message ids whose ``fail="always"`` job has been "fixed" and now succeeds.
FIXED: set[str] = set()

_TABLE = re.compile(r'"[a-z0-9_]+"\.effects')


@dataclass(frozen=True)
class Job:
    n: int
    fail: str | None = None
    sleep: float = 0.0


@registry.handler()
async def run_job(job: Job, ctx: HandlerContext) -> None:
    table = ctx.message.headers["effects"]
    assert _TABLE.fullmatch(table), table
    await ctx.connection.execute(
        f"INSERT INTO {table} (consumer, message_id, attempt) VALUES ($1, $2, $3)",
        ctx.consumer,
        ctx.message.id,
        ctx.attempt,
    )
    if job.sleep:
        await asyncio.sleep(job.sleep)
    if job.fail == "once" and ctx.attempt == 1:
        raise RuntimeError(f"job {job.n} fails on its first attempt")
    if job.fail == "always" and ctx.message.id not in FIXED:
        raise RuntimeError(f"job {job.n} always fails")


#: Handlers that will not stop: ``--handlers tests.integration.consumer_handlers:stubborn``.
#: Each touches the file named by ``OUTBOXER_TEST_STARTED`` once it runs.
stubborn = HandlerRegistry()


def _started() -> None:
    with open(os.environ["OUTBOXER_TEST_STARTED"], "a") as marker:
        marker.write("started\n")


@stubborn.handler("SwallowsCancellation")
async def swallows_cancellation(payload: dict[str, object]) -> None:
    _started()
    while True:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(1000)


@stubborn.handler("BlocksTheLoop")
async def blocks_the_loop(payload: dict[str, object]) -> None:
    _started()
    while True:
        pass
