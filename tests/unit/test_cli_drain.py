"""``outboxer relay --drain``: the line it ends with when the drain cannot finish."""

from __future__ import annotations

import asyncio

import pytest

from outboxer.cli.relay import _drain
from outboxer.errors import StoreUnavailable


class TimedOutRelay:
    """A relay whose drain ran out of time while its database was down."""

    outage_failures = 0
    outage_reason = None

    async def drain(self, timeout: float) -> None:
        raise TimeoutError


class DownStore:
    async def stats(self) -> None:
        raise StoreUnavailable('MySQL unavailable: (2003, "Can\'t connect to MySQL server")')


def test_a_drain_timed_out_with_the_database_down_says_it_did_not_finish(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The count of what is left cannot be read: the line still says the drain did not
    finish (it used to be the driver's error alone, as if the drain had not been running)."""
    with pytest.raises(SystemExit) as exited:
        asyncio.run(_drain(TimedOutRelay(), DownStore(), 15))
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "drain did not finish within 15 s; what is left is unknown: MySQL unavailable" in err
