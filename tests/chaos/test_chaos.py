"""Relays killed with SIGKILL (on PostgreSQL and MariaDB), a broker cut, PostgreSQL and MariaDB
restarted: nothing lost, per-key order of first deliveries equals write order, duplicates within
the documented bound.

The broker is Redis Streams behind a TCP proxy the test can cut; the relays are real
``outboxer relay`` processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

import outboxer
from outboxer.config import TableNames
from outboxer.stores.mysql import MysqlStore
from outboxer.stores.postgres import PostgresStore
from tests.conftest import Server, redis_stream_entries, require_service
from tests.services import START
from tests.tcp_proxy import TcpProxy

OUTBOXER = str(Path(sys.executable).parent / "outboxer")
ROOT = Path(__file__).resolve().parents[2]
BATCH, WINDOW = 200, 2


async def write_messages(pg_url: str, schema: str, stream: str, count: int, keys: int) -> None:
    """``count`` messages, key = n % keys, committed in write order (500 per transaction)."""
    outbox = outboxer.Outbox(schema=schema)
    conn = await asyncpg.connect(pg_url)
    try:
        for start in range(0, count, 500):
            messages = [
                {"topic": stream, "payload": {"n": n, "k": n % keys}, "key": f"k{n % keys}"}
                for n in range(start, min(count, start + 500))
            ]
            async with conn.transaction():
                await outbox.enqueue_many_async(conn, messages)
    finally:
        await conn.close()


def relay_args(pg_url: str, schema: str, broker: str) -> list[str]:
    """Small batches, a short lease and a fast outage backoff: many kills in a short run."""
    return [
        "--database-url", pg_url, "--schema", schema, "--broker", broker,
        "--batch-size", str(BATCH), "--window", str(WINDOW), "--lease-seconds", "3",
        "--outage-base", "0.5", "--outage-cap", "2", "--poll-interval", "0.2",
    ]  # fmt: skip


class Relays:
    """N ``outboxer relay`` processes that can be killed and restarted."""

    def __init__(self, args: list[str], count: int, log_dir: Path) -> None:
        self.args, self.log_dir = args, log_dir
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXER_")}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.kills = 0
        for n in range(count):
            self.procs.append(self._start(n))

    def _start(self, n: int) -> subprocess.Popen[bytes]:
        with (self.log_dir / f"relay-{n}-{time.monotonic_ns()}.log").open("wb") as log:
            return subprocess.Popen(
                [OUTBOXER, "--log-level", "WARNING", "relay", *self.args, "--relay-id", f"r{n}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=ROOT,
            )

    def kill_and_restart(self, n: int) -> None:
        self.procs[n].kill()
        self.procs[n].wait()
        self.kills += 1
        self.procs[n] = self._start(n)

    def log_lines(self) -> list[str]:
        """What the relays logged, every process of each one in turn."""
        logs = sorted(self.log_dir.glob("relay-*.log"))
        return [line for log in logs for line in log.read_text().splitlines()]

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
async def redis_stream() -> AsyncIterator[str]:
    require_service("Redis", "127.0.0.1", 6379)
    name = f"chaos-{os.urandom(6).hex()}"
    yield name
    client = aioredis.Redis()
    await client.delete(name)
    await client.aclose()


async def first_delivery_orders(stream: str) -> tuple[dict[str, list[int]], int, int]:
    """Per key, the ``n`` of each message in order of its first appearance in the stream."""
    entries = await redis_stream_entries(stream)
    seen: set[str] = set()
    orders: dict[str, list[int]] = defaultdict(list)
    for _, fields in entries:
        message_id = fields[b"id"].decode()
        if message_id in seen:
            continue
        seen.add(message_id)
        body = json.loads(fields[b"payload"])
        orders[fields[b"key"].decode()].append(body["n"])
    return orders, len(entries), len(seen)


async def wait_published(client: aioredis.Redis, stream: str, count: int) -> None:
    """Wait (up to 60 s) until the relays have put ``count`` messages on the stream."""
    deadline = time.monotonic() + 60
    while await client.xlen(stream) < count:
        assert time.monotonic() < deadline, "relays made no progress"
        await asyncio.sleep(0.05)


async def wait_drained(store: PostgresStore | MysqlStore, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        stats = await store.stats()
        if stats.pending == 0 and stats.in_flight == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not drained in {timeout}s: {stats.to_json()}")
        await asyncio.sleep(0.2)


async def test_four_relays_killed_at_random_with_a_broker_outage(
    server: Server, redis_stream: str, tmp_path: Path
) -> None:
    """On PostgreSQL and on MariaDB."""
    total, keys = 40_000, 200
    store = server.store
    for start in range(0, total, 500):  # committed in write order, 500 per transaction
        await server.write(
            [
                {"topic": redis_stream, "payload": {"n": n, "k": n % keys}, "key": f"k{n % keys}"}
                for n in range(start, min(total, start + 500))
            ]
        )
    async with TcpProxy("127.0.0.1", 6379) as proxy:
        relays = Relays(
            relay_args(server.url, server.schema, f"redis://127.0.0.1:{proxy.port}/0"),
            4,
            tmp_path,
        )
        rng = random.Random(7)
        started, outage_done = time.monotonic(), False
        try:
            while (await store.stats()).pending + (await store.stats()).in_flight > 0:
                if time.monotonic() - started > 240:
                    raise AssertionError("chaos run did not finish in 240 s")
                await asyncio.sleep(rng.uniform(1.0, 2.5))
                relays.kill_and_restart(rng.randrange(4))
                stats = await store.stats()
                if not outage_done and stats.pending < total * 2 // 3:
                    await proxy.cut()  # the broker disappears for 5 s mid-run
                    await asyncio.sleep(5)
                    await proxy.restore()
                    outage_done = True
            await wait_drained(store, 60)
        finally:
            relays.stop()
    stats = await store.stats()
    assert outage_done, "the broker outage happened mid-run"
    assert stats.dead_letters == 0
    orders, deliveries, distinct = await first_delivery_orders(redis_stream)
    assert distinct == total, f"lost {total - distinct} messages"
    for key, ns in orders.items():
        assert ns == sorted(ns), f"key {key}: first deliveries out of write order"
    duplicates = deliveries - distinct
    bound = relays.kills * WINDOW * BATCH
    print(
        f"\n4 relays, {total} messages, {keys} keys, {relays.kills} kill -9, one 5 s broker "
        f"outage: {duplicates} duplicates (bound {relays.kills} kills × {WINDOW} × {BATCH} = "
        f"{bound}), {time.monotonic() - started:.1f} s"
    )
    assert duplicates <= bound


async def test_postgresql_restart_mid_run_loses_nothing(
    pg_url: str, pg_schema: str, redis_stream: str, tmp_path: Path
) -> None:
    total = 20_000
    async with PostgresStore(pg_url, TableNames(schema=pg_schema)) as store:
        await store.migrate()
        await write_messages(pg_url, pg_schema, redis_stream, total, 100)
    relays = Relays(
        relay_args(pg_url, pg_schema, "redis://127.0.0.1:6379/0"),
        2,
        tmp_path,
    )
    try:
        client = aioredis.Redis()
        await wait_published(client, redis_stream, total // 4)
        await client.aclose()
        version = os.listdir("/etc/postgresql")[0]
        restart = await asyncio.create_subprocess_exec(
            "pg_ctlcluster",
            "--skip-systemctl-redirect",
            version,
            "main",
            "restart",
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(restart.communicate(), 120)
        assert restart.returncode == 0, err.decode()
        async with PostgresStore(pg_url, TableNames(schema=pg_schema)) as store:
            await wait_drained(store, 120)
            stats = await store.stats()
    finally:
        relays.stop()
    codes = [proc.returncode for proc in relays.procs]
    assert codes == [0] * len(codes), f"relays survived the restart: exit codes {codes}"
    assert stats.dead_letters == 0
    orders, deliveries, distinct = await first_delivery_orders(redis_stream)
    assert distinct == total
    for key, ns in orders.items():
        assert ns == sorted(ns), f"key {key}: out of order"
    print(f"\nPostgreSQL restarted mid-run: {deliveries - distinct} duplicates")


async def mariadb_answers() -> bool:
    proc = await asyncio.create_subprocess_exec(
        "mariadb-admin", "-uroot", "-h127.0.0.1", "--connect-timeout=2", "ping",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    return await proc.wait() == 0


async def stop_mariadb() -> None:
    """Shut MariaDB down and wait until it is gone. (Not with the init script: its stop and its
    status checks log in through /etc/mysql/debian.cnf, which this machine does not have.)"""
    proc = await asyncio.create_subprocess_exec(
        "mariadb-admin", "-uroot", "-h127.0.0.1", "shutdown",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, f"mariadb-admin shutdown: {out.decode()}"
    deadline = time.monotonic() + 120
    while await mariadb_answers():
        assert time.monotonic() < deadline, "MariaDB did not stop"
        await asyncio.sleep(0.2)


async def start_mariadb() -> None:
    """Start MariaDB with the command the suite tells to run (tests/services.py START); return
    once it answers."""
    proc = await asyncio.create_subprocess_exec(
        *START["MariaDB"].split(),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,  # the server outlives this test
    )  # fmt: skip
    assert await asyncio.wait_for(proc.wait(), 60) == 0, f"{START['MariaDB']} failed"
    deadline = time.monotonic() + 120
    while not await mariadb_answers():
        assert time.monotonic() < deadline, f"{START['MariaDB']} did not start MariaDB"
        await asyncio.sleep(0.2)


async def test_mariadb_restart_mid_run_loses_nothing(
    mysql_url: str, mysql_database: str, mysql_store: MysqlStore, redis_stream: str, tmp_path: Path
) -> None:
    """MariaDB shut down under two ordered relays, down for 5 s, then started with the suite's
    START command: the relays ride it out in the same processes, and nothing is lost or
    reordered; duplicates stay within what the relays had in flight."""
    total, keys = 20_000, 100
    server = Server(mysql_url, mysql_database, mysql_store)
    for start in range(0, total, 500):  # committed in write order, 500 per transaction
        await server.write(
            [
                {"topic": redis_stream, "payload": {"n": n, "k": n % keys}, "key": f"k{n % keys}"}
                for n in range(start, min(total, start + 500))
            ]
        )
    relays = Relays(relay_args(mysql_url, mysql_database, "redis://127.0.0.1:6379/0"), 2, tmp_path)
    try:
        client = aioredis.Redis()
        await wait_published(client, redis_stream, total // 4)
        try:
            await stop_mariadb()
            published = await client.xlen(redis_stream)  # when MariaDB went away
            await asyncio.sleep(5)
        finally:
            await start_mariadb()
        restarted = time.monotonic()
        # The store opened before the restart: its pool must not hand out dead connections.
        await wait_drained(mysql_store, 120)
        recovered = time.monotonic() - restarted
        stats = await mysql_store.stats()
        alive = [proc.poll() is None for proc in relays.procs]
        await client.aclose()
    finally:
        relays.stop()
    assert alive == [True, True], "a relay exited during the restart"
    codes = [proc.returncode for proc in relays.procs]
    assert codes == [0, 0], f"relays survived the restart: exit codes {codes}"
    assert stats.dead_letters == 0
    orders, deliveries, distinct = await first_delivery_orders(redis_stream)
    assert distinct == total, f"lost {total - distinct} messages"
    for key, ns in orders.items():
        assert ns == sorted(ns), f"key {key}: first deliveries out of write order"
    duplicates = deliveries - distinct
    bound = len(relays.procs) * WINDOW * BATCH  # what the relays held when MariaDB went away
    logged = relays.log_lines()
    assert not [line for line in logged if "Traceback" in line], "\n".join(logged)
    print(
        f"\nMariaDB stopped 5 s mid-run with {total - published} of {total} messages left: drained "
        f"{recovered:.1f} s after it answered again, "
        f"{duplicates} duplicates (bound {bound}); the relays logged:\n" + "\n".join(logged[:20])
    )
    assert duplicates <= bound
