"""Seeded simulation of a consumer: the inbox under kills, stops, store faults and bad handlers.

Each seed builds one scenario (``tests/simulation/inbox_world.py``): a partitioned broker log
read by one or two consumer groups whose processes run the real ``run_consumer`` on the SQLite
store, on virtual
time, with processes killed (at random instants, inside a handler after its write, between a
commit and its acknowledgement) or stopped and restarted, store statements failing, commits whose
answer is lost, messages sent twice, slow, flaky, permanently failing and "broken until fixed"
handlers. After the faults stop, everything must be acknowledged and every failure settled;
then the bug is fixed and every dead letter replayed. The model checks: every message took
effect exactly once (permanent failures never, and they are the only dead letters), and of
each key the messages that never failed for good took effect in log order.

``OUTBOXER_SIM_SCENARIOS`` sets the number of seeds (default 600: about 32 s of one core, half
of it on each with ``-n 2``); ``OUTBOXER_SIM_SEED=N`` runs one seed (the reproduction line a
failure prints).
"""

from __future__ import annotations

import os

import pytest

from tests.simulation.conftest import scan
from tests.simulation.inbox_world import run_inbox_scenario

SCENARIOS = int(os.environ.get("OUTBOXER_SIM_SCENARIOS", 600))
CHUNKS = 4
ONE_SEED = os.environ.get("OUTBOXER_SIM_SEED")


def seeds(chunk: int) -> range | list[int]:
    if ONE_SEED is not None:
        return [int(ONE_SEED)] if chunk == 0 else []
    return range(chunk, SCENARIOS, CHUNKS)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_seeded_consumer_scenarios_keep_the_guarantees(chunk: int) -> None:
    events = scan(f"consumer chunk {chunk}", seeds(chunk), run_inbox_scenario, "consumer")
    if ONE_SEED is None:  # the faults the scenarios are for did happen
        for kind in (
            "process killed at a random instant",
            "process killed in a handler after its write",
            "process killed between a commit and its acknowledgement",
            "process stopped (SIGTERM) at a random instant",
            "commit done, answer lost",
            "handler failed after its write",
            "messages sent twice",
        ):
            assert events[kind] > 0, kind
