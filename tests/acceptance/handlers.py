"""Handlers the acceptance tests load with ``--broker inprocess://tests.acceptance.handlers:registry``.

Each delivered message id is appended to the file named by ``OUTBOXER_TEST_SINK`` (one line per
delivery, so duplicates are visible); ``OUTBOXER_TEST_DELAY`` slows each delivery down so a test
can kill the relay mid-stream. Messages of type ``Poison`` always fail; a message of type
``Killer`` kills the relay process (``os._exit``), as a segfault or an OOM kill would; one of type
``Stubborn`` never lets its handler end (it swallows its cancellation).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

from outboxer import HandlerRegistry, Message

registry = HandlerRegistry()


def _record(message: Message) -> None:
    delay = float(os.environ.get("OUTBOXER_TEST_DELAY", "0"))
    if delay:
        time.sleep(delay)
    with open(os.environ["OUTBOXER_TEST_SINK"], "a") as sink:
        sink.write(message.id + "\n")


@registry.handler(topic="orders")
def deliver(message: Message) -> None:
    _record(message)


@registry.handler("Poison")
def reject(message: Message) -> None:
    raise ValueError("this payload is always rejected")


@registry.handler("Killer")
def kill_the_process(message: Message) -> None:
    os._exit(1)  # no cleanup at all: the relay dies holding its claims


@registry.handler("Stubborn")
async def swallow_cancellation(message: Message) -> None:
    """Touches the sink, then never ends: it swallows every cancellation."""
    _record(message)
    while True:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(1000)
