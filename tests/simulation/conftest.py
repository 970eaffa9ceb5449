"""What every simulation shares."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest


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
