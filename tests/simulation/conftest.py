"""What every simulation shares."""

from __future__ import annotations

import collections
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest


class Outcome(Protocol):
    violations: list[str]
    tally: collections.Counter[str]
    messages: int
    virtual_seconds: float


def scan(
    label: str, seeds: Iterable[int], run: Callable[[int, Path], Any], reproduce: str
) -> collections.Counter[str]:
    """Run ``run(seed, workdir)`` for each seed, print what happened, fail with a reproduction
    line (``OUTBOXER_SIM_SEED=N pytest tests/simulation -k <reproduce>``) for each seed that
    broke a guarantee; returns the events of all the seeds, by kind."""
    started = time.monotonic()
    outcomes: list[Outcome] = []
    failures: list[str] = []
    # SQLite files in memory when the machine has a tmpfs: the scenarios commit a lot.
    where = "/dev/shm" if Path("/dev/shm").is_dir() else None
    for seed in seeds:
        with tempfile.TemporaryDirectory(dir=where) as workdir:
            outcome = run(seed, Path(workdir))
        outcomes.append(outcome)
        if outcome.violations:
            failures.append(
                f"seed {seed}: {'; '.join(outcome.violations[:5])}\n"
                f"    reproduce: OUTBOXER_SIM_SEED={seed} pytest tests/simulation -k {reproduce}"
            )
    events: collections.Counter[str] = collections.Counter()
    for outcome in outcomes:
        events.update(outcome.tally)
    print(
        f"\n{label}: {len(outcomes)} scenarios, "
        f"{sum(o.messages for o in outcomes)} messages, "
        f"{sum(o.virtual_seconds for o in outcomes) / 3600:.0f} virtual hours in "
        f"{time.monotonic() - started:.1f} s; violations: {len(failures)}; "
        + ", ".join(f"{kind}: {n}" for kind, n in sorted(events.items()))
    )
    assert not failures, "\n".join(failures)
    return events


@pytest.fixture(autouse=True)
def quiet_outboxer() -> Iterator[None]:
    """Relays and consumers log every injected fault; thousands of scenarios would drown the
    output (one seed, ``OUTBOXER_SIM_SEED``, keeps the logs: they tell what happened)."""
    outboxer = logging.getLogger("outboxer")
    level = outboxer.level
    if os.environ.get("OUTBOXER_SIM_SEED") is None:
        outboxer.setLevel(logging.CRITICAL + 1)
    yield
    outboxer.setLevel(level)
