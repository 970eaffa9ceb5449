"""Child processes of the example tests (services, relays, consumers) and waiting on events.

Each :class:`Process` writes its output to a log file that failures quote; :func:`wait` polls
for the event a test needs (an HTTP answer, a log line, a row) instead of sleeping.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.acceptance.conftest import ROOT


class Process:
    """A child process started from the repository root, its output in ``log``."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as sink:
            self.process = subprocess.Popen(
                args,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )

    def output(self, tail: int | None = None) -> str:
        """What it printed so far: the last ``tail`` characters, or all of it."""
        text = self.log.read_text(errors="replace")
        return text if tail is None else text[-tail:]

    def counters(self) -> dict[str, int]:
        """The counters a relay (``name=N``) or consumer (``'name': N``) logged on a graceful
        stop, from its last ``stopped:`` line."""
        line = next(x for x in reversed(self.output().splitlines()) if " stopped: " in x)
        pairs = re.findall(r"['\"]?(\w+)['\"]?[=:] ?(\d+)", line.partition(" stopped: ")[2])
        return {name: int(value) for name, value in pairs}

    def stop(self) -> int:
        """SIGTERM, and the exit code once it has stopped (killed after 30 s)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)


async def wait(
    check: Callable[[], Any], what: str | Callable[[], str], timeout: float = 30.0
) -> Any:
    """Until ``check()`` (a plain or async function) returns something true, which is returned;
    on timeout the failure names ``what`` (or what ``what()`` says then, e.g. a process log)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out waiting for {what if isinstance(what, str) else what()}"
            )
        await asyncio.sleep(0.05)
