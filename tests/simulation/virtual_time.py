"""Virtual time for the simulation: an event loop whose clock jumps, and SQLite without threads.

:class:`VirtualTimeLoop` never sleeps. When every task waits, its selector is asked to block
until the next timer; instead it moves the clock to that timer at once. Hours of relay life (leases,
backoffs, sweeps) take milliseconds, and a run depends only on its seed: nothing is decided by
how fast the machine is.

:class:`InlineConnection` is aiosqlite without its worker thread, so that SQLite calls do not
make the schedule depend on thread timing either. Each call runs at once in the loop's thread and
never suspends: a store's transaction is never open across a task switch.
"""

from __future__ import annotations

import asyncio
import selectors
import sqlite3
from typing import Any

import aiosqlite


class SimulationStuck(RuntimeError):
    """Every task waits for something no timer will ever bring: a deadlock."""


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[Any]:
        # Nothing in a simulation does real I/O (no threads, no signals, no sockets): the
        # selector is never asked about file descriptors, it only moves the clock.
        if timeout is not None and timeout <= 0:
            return []
        if timeout is None:
            raise SimulationStuck("no task is ready and no timer is scheduled")
        assert self.loop is not None
        self.loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is virtual and jumps to the next timer."""

    def __init__(self) -> None:
        self._virtual_now = 0.0
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self._virtual_now

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> Any:
        # asyncio fires a timer up to its clock resolution early. On a real clock time moves
        # on anyway; here it would not, and a loop waiting for "a bit more" (a wait of 1e-15 s)
        # would fire at the same instant forever. So a timer lies at least that far ahead.
        when = max(when, self._virtual_now + self._clock_resolution)
        return super().call_at(when, callback, *args, context=context)

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds


class InlineConnection(aiosqlite.Connection):
    """An aiosqlite connection that runs each call at once in the calling (loop) thread."""

    def __init__(self, path: str) -> None:
        super().__init__(lambda: sqlite3.connect(path, isolation_level=None), iter_chunk_size=64)
        self._connection = self._connector()

    async def _execute(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    async def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        self._running = False
