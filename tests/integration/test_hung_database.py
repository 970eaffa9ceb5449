"""A database that stops answering (a half-open connection after a failover, a hung server):
simulated by a proxy in front of the real server that forwards nothing while its sockets stay
open. Statements are bounded by the URL's ``command_timeout``.

The hangs are short: the server's transaction behind a paused proxy stays open meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest

import outboxer
from outboxer.config import RelaySettings, TableNames
from outboxer.errors import StoreUnavailable
from outboxer.message import Message
from outboxer.relay import Relay
from outboxer.stores import open_store
from outboxer.stores.mysql.connection import MysqlDatabase, fetch_value
from outboxer.stores.postgres.connection import PostgresDatabase
from outboxer.testing import RecordingPublisher
from tests.tcp_proxy import TcpProxy


@pytest.fixture(params=["postgres", "mariadb"])
def database(request: pytest.FixtureRequest) -> tuple[str, int, str]:
    """(URL template with ``{port}``, server port, schema/database) of a fresh namespace."""
    if request.param == "postgres":
        schema = request.getfixturevalue("pg_schema")
        return "postgresql://root@127.0.0.1:{port}/test", 5432, schema
    name = request.getfixturevalue("mysql_database")
    return "mysql://root@127.0.0.1:{port}/" + name, 3306, name


@pytest.fixture
async def proxy(database: tuple[str, int, str]) -> AsyncIterator[TcpProxy]:
    async with TcpProxy("127.0.0.1", database[1]) as proxy:
        yield proxy  # (stop() resets every connection: no transaction outlives the test)


async def test_a_statement_the_database_never_answers_is_an_outage_named_by_its_timeout(
    database: tuple[str, int, str], proxy: TcpProxy
) -> None:
    url, _, schema = database
    store = open_store(
        url.format(port=proxy.port) + "?command_timeout=1", TableNames(schema=schema)
    )
    async with store:
        await store.migrate()
        assert (await store.stats()).pending == 0
        await proxy.pause()
        with pytest.raises(StoreUnavailable, match=r"within 1 s \(command_timeout\)"):
            await asyncio.wait_for(store.stats(), 10)
        await proxy.resume()
        # The timed-out connection was discarded: the store works again at once.
        assert (await asyncio.wait_for(store.stats(), 10)).pending == 0


async def test_a_new_connection_the_database_never_greets_is_an_outage_too(
    database: tuple[str, int, str], proxy: TcpProxy
) -> None:
    """Found by a probe on MariaDB: asyncmy's connect_timeout bounds the TCP connect only, so
    a connection the pool opened while the server (or a proxy) accepted and never answered
    waited forever: the relay froze in silence and could not stop."""
    url, _, schema = database
    options = "?command_timeout=1&connect_timeout=1"
    async with open_store(
        url.format(port=proxy.port) + options, TableNames(schema=schema)
    ) as store:
        await store.migrate()
        await proxy.pause()
        with pytest.raises(StoreUnavailable, match=r"within 1 s \(command_timeout\)"):
            await asyncio.wait_for(store.stats(), 10)
        # The pool's connection was discarded: the next one is opened, and never greeted.
        for _ in range(2):
            with pytest.raises(StoreUnavailable, match=r"within 1 s \((connect|command)_timeout"):
                await asyncio.wait_for(store.stats(), 10)
        await proxy.resume()
        assert (await asyncio.wait_for(store.stats(), 10)).pending == 0


def test_the_postgres_command_timeout_goes_to_the_pool_and_not_to_migrations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    names = TableNames()
    pg = PostgresDatabase("postgresql://h/app?command_timeout=5", names)
    assert pg.command_timeout == 5.0
    assert PostgresDatabase("postgresql://h/app?command_timeout=0", names).command_timeout is None
    connected: list[dict[str, Any]] = []

    async def connect(*args: Any, **kwargs: Any) -> Any:
        connected.append(kwargs)
        raise OSError("not connecting in a unit test")

    monkeypatch.setattr("asyncpg.connect", connect)

    async def migrate_connection() -> None:
        with pytest.raises(StoreUnavailable):
            async with pg.unbounded_transaction():
                pass

    asyncio.run(migrate_connection())
    assert connected[0]["command_timeout"] is None


async def test_a_mysql_statement_may_outlast_the_command_timeout_only_in_migrations(
    mysql_database: str,
) -> None:
    names = TableNames()
    assert MysqlDatabase(f"mysql://h/{mysql_database}", names).command_timeout == 60.0
    db = MysqlDatabase(f"mysql://root@127.0.0.1:3306/{mysql_database}?command_timeout=1", names)
    await db.open()
    try:
        async with db.unbounded_connection() as conn:
            assert await fetch_value(conn, "SELECT SLEEP(1.5)") == 0
        with pytest.raises(StoreUnavailable, match=r"within 1 s \(command_timeout\)"):
            async with db.connection() as conn:
                await fetch_value(conn, "SELECT SLEEP(1.5)")
        async with db.connection() as conn:  # the timed-out connection was discarded
            assert await fetch_value(conn, "SELECT 1") == 1
    finally:
        await db.close()


async def commit_messages(pg_url: str, pg_schema: str, count: int) -> None:
    """Commit ``count`` messages to the outbox in ``pg_schema`` (directly, not through the
    proxy)."""
    conn = await asyncpg.connect(pg_url)
    try:
        async with conn.transaction():
            await outboxer.Outbox(schema=pg_schema).enqueue_many_async(
                conn, [{"topic": "orders", "payload": {"n": n}} for n in range(count)]
            )
    finally:
        await conn.close()


async def test_a_relay_stops_in_bounded_time_while_the_database_does_not_answer(
    pg_url: str, pg_schema: str
) -> None:
    """Found by a probe: a relay stopped while PostgreSQL stopped answering took 22 s past its
    shutdown timeout, each step of the stop (handing the cut-short batch back, signing off)
    waiting for its own command or connect timeout. The stop now waits a few seconds for
    them, then leaves the claim to its lease's expiry (as after kill -9)."""
    async with TcpProxy("127.0.0.1", 5432) as proxy:
        url = f"postgresql://root@127.0.0.1:{proxy.port}/test?command_timeout=30&connect_timeout=30"
        async with open_store(url, TableNames(schema=pg_schema)) as store:
            await store.migrate()
            await commit_messages(pg_url, pg_schema, 5)
            publishing = asyncio.Event()

            class Stuck(RecordingPublisher):
                async def publish(self, messages: Sequence[Message]) -> Any:
                    publishing.set()
                    await asyncio.sleep(3600)

            settings = RelaySettings(shutdown_timeout=0.5, poll_interval=0.05)
            relay = Relay(store, Stuck(), settings)
            running = asyncio.create_task(relay.run())
            await asyncio.wait_for(publishing.wait(), 20)
            await proxy.pause()
            relay.stop()
            # 0.5 s, then at most 5 s of hand-back and 2 s of sign-off: not 30 s each
            await asyncio.wait_for(running, 15)


async def test_a_relay_stops_in_bounded_time_while_its_sweep_hangs(
    pg_url: str, pg_schema: str
) -> None:
    """Found by a full-suite run: a relay stopped while its sweep was inside its transaction,
    on a database that stopped answering, waited for the sweeper's cancellation, whose cleanup
    (the transaction's rollback) lasted until the command timeout. The stop now waits for that
    cleanup a bounded time, then cuts it, as for the claim and the hand-back."""
    async with TcpProxy("127.0.0.1", 5432) as proxy:
        url = f"postgresql://root@127.0.0.1:{proxy.port}/test?command_timeout=30&connect_timeout=30"
        async with open_store(url, TableNames(schema=pg_schema)) as store:
            await store.migrate()
            swept = asyncio.Event()
            sweep = store.sweep

            async def watched(**options: Any) -> Any:
                swept.set()
                return await sweep(**options)

            store.sweep = watched  # type: ignore[method-assign]
            settings = RelaySettings(shutdown_timeout=0.5, sweep_interval=0.1)
            relay = Relay(store, RecordingPublisher(), settings)
            running = asyncio.create_task(relay.run())
            await asyncio.wait_for(swept.wait(), 20)
            locker = await asyncpg.connect(pg_url)
            try:
                # The next sweep takes its lock, then waits for the dead letters' table
                await locker.execute("BEGIN")
                await locker.execute(
                    f"LOCK TABLE {pg_schema}.outbox_dead_letters IN ACCESS EXCLUSIVE MODE"
                )
                waiting = (
                    "SELECT count(*) FROM pg_locks WHERE NOT granted"
                    f" AND relation = '{pg_schema}.outbox_dead_letters'::regclass"
                )
                for _ in range(200):  # until a sweep waits for it, in its transaction
                    if await locker.fetchval(waiting):
                        break
                    await asyncio.sleep(0.05)
                assert await locker.fetchval(waiting)
                await proxy.pause()  # and now nothing it sends is answered
                relay.stop()
                # the claim's 2 s, the sweeper's 2 s, the sign-off's 2 s: not 30 s
                await asyncio.wait_for(running, 15)
            finally:
                await locker.close()


async def test_a_busy_relay_stops_in_bounded_time_while_its_claim_is_held(
    pg_url: str, pg_schema: str
) -> None:
    """Found by a probe: a busy relay is nearly always inside a claim, and a claim held by a
    database that stopped answering returned only at the command timeout (60 s by default):
    the stop waited for it before it began, and the CLI's watchdog exited 1. A claim still
    running 2 s after the stop is cut short now; its rows, if it committed unseen, come back at
    their lease's expiry (as after kill -9)."""
    async with TcpProxy("127.0.0.1", 5432) as proxy:
        url = f"postgresql://root@127.0.0.1:{proxy.port}/test?command_timeout=60"
        async with open_store(url, TableNames(schema=pg_schema)) as store:
            await store.migrate()
            await commit_messages(pg_url, pg_schema, 20_000)
            publisher = RecordingPublisher()
            settings = RelaySettings(shutdown_timeout=0.5, batch_size=50, ordered=False)
            relay = Relay(store, publisher, settings)
            running = asyncio.create_task(relay.run())
            for _ in range(400):
                if len(publisher.messages) >= 200:
                    break
                await asyncio.sleep(0.05)
            assert len(publisher.messages) >= 200
            await proxy.pause()
            await asyncio.sleep(1.0)  # the next claims are sent and never answered
            relay.stop()
            # the claim cut after 2 s, 0.5 s, hand-back (≤ 5 s), sign-off (≤ 2 s): not 60 s
            await asyncio.wait_for(running, 20)
