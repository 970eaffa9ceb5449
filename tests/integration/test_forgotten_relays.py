"""The sweep forgets relays silent for a day (killed with ``kill -9``, their host gone): their
rows in the relays table would otherwise pile up with every crash. A relay heard from within
the day stays, live or not."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from outboxer.relay import Relay
from outboxer.testing import InMemoryStore, RecordingPublisher

#: Each SQL store's way to make a relay's last heartbeat two days old.
AGE = {
    "pg_store": "UPDATE {relays} SET heartbeat_at = now() - interval '2 days' WHERE relay_id = $1",
    "mysql_store": "UPDATE {relays} SET heartbeat_at = UTC_TIMESTAMP(6) - INTERVAL 2 DAY "
    "WHERE relay_id = %s",
    "sqlite_store": "UPDATE {relays} SET heartbeat_at = heartbeat_at - 172800 WHERE relay_id = ?",
}


async def _relays(store: Any) -> set[str]:
    return {row["relay_id"] for row in await store.execute("SELECT relay_id FROM {relays}")}


@pytest.fixture(params=list(AGE))
def sql_store(request: pytest.FixtureRequest) -> tuple[Any, str]:
    return request.getfixturevalue(request.param), request.param


async def test_the_sweep_forgets_relays_silent_for_a_day(sql_store: tuple[Any, str]) -> None:
    store, store_fixture = sql_store
    gone, alive = (Relay(store, RecordingPublisher()).info for _ in range(2))
    for relay in (gone, alive):
        await store.heartbeat(relay)
    aged = [[gone.relay_id]] if store_fixture == "mysql_store" else [gone.relay_id]
    await store.execute(AGE[store_fixture], *aged)
    assert await _relays(store) == {gone.relay_id, alive.relay_id}
    assert await store.sweep(sweeper="s", interval=0, retention_seconds=0, batch_size=10)
    assert await _relays(store) == {alive.relay_id}


async def test_the_in_memory_store_forgets_them_too() -> None:
    now = [dt.datetime(2026, 1, 1, tzinfo=dt.UTC)]
    store = InMemoryStore(clock=lambda: now[0])
    gone = Relay(store, RecordingPublisher()).info
    await store.heartbeat(gone)
    now[0] += dt.timedelta(hours=23)
    alive = Relay(store, RecordingPublisher()).info
    await store.heartbeat(alive)
    await store.sweep(sweeper="s", interval=0, retention_seconds=0, batch_size=10)
    assert set(store._relays) == {gone.relay_id, alive.relay_id}  # silent for 23 h: kept
    now[0] += dt.timedelta(hours=2)  # the first is silent for 25 h, the other for 2 h
    await store.sweep(sweeper="s", interval=0, retention_seconds=0, batch_size=10)
    assert set(store._relays) == {alive.relay_id}
