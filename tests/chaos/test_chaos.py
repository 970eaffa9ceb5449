"""Relays killed with SIGKILL (on PostgreSQL and MariaDB), a broker cut, PostgreSQL restarted:
nothing lost, per-key order of first deliveries equals write order, duplicates within the
documented bound.

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
from tests.conftest import Server, require_service
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
    client = aioredis.Redis()
    try:
        entries = await client.xrange(stream)
    finally:
        await client.aclose()
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
        deadline = time.monotonic() + 60
        while await client.xlen(redis_stream) < total // 4:
            assert time.monotonic() < deadline, "relays made no progress"
            await asyncio.sleep(0.05)
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
