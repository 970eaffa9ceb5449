"""``outboxer relay`` end to end, for every broker (Kafka, RabbitMQ, NATS, Redis, HTTP webhooks)
and every server database (PostgreSQL, MariaDB): real processes, real brokers.

For each pair: thousands of messages are delivered exactly once when nothing fails. For each
broker (on one of the two databases, both covered): when the broker disappears behind a TCP
proxy for ~20 s while messages keep coming, everything is delivered after it returns and the
relay's attempts during the cut follow the outage backoff (1 s, 2 s, 4 s, 4 s, … with
`--outage-base 1 --outage-cap 4`) instead of a hot loop. The outage is the broker's: the
database only holds the backlog, so running it on every pair cost ~2.5 min of the suite for
nothing more."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import asyncpg
import nats
import pika
import pytest
import redis.asyncio as aioredis
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

import outboxer
from outboxer.config import TableNames
from outboxer.stores.mysql import MysqlStore
from outboxer.stores.postgres import PostgresStore
from tests.conftest import mysql_connect, redis_stream_entries, require_service, unique_name
from tests.http_receiver import HttpReceiver
from tests.tansu import TansuBroker, create_topic, free_port
from tests.tcp_proxy import TcpProxy

OUTBOXER = str(Path(sys.executable).parent / "outboxer")
ROOT = Path(__file__).resolve().parents[2]


class Broker(Protocol):
    """One broker as these tests need it."""

    target: tuple[str, int]

    async def prepare(self, topic: str, via: int | None = None) -> None:
        """Create the destination; ``via`` is the port of a proxy in front of the broker."""
        ...

    def url(self, port: int) -> str: ...
    async def delivered_ids(self, topic: str, expected: int) -> list[str]: ...
    async def cleanup(self) -> None: ...


class RedisBroker:
    target = ("127.0.0.1", 6379)

    def __init__(self) -> None:
        require_service("Redis", *self.target)
        self.streams: list[str] = []

    async def prepare(self, topic: str, via: int | None = None) -> None:
        self.streams.append(topic)

    def url(self, port: int) -> str:
        return f"redis://127.0.0.1:{port}/0"

    async def delivered_ids(self, topic: str, expected: int) -> list[str]:
        return [f[b"id"].decode() for _, f in await redis_stream_entries(topic)]

    async def cleanup(self) -> None:
        client = aioredis.Redis()
        with contextlib.suppress(Exception):
            await client.delete(*self.streams)
        await client.aclose()


class NatsBroker:
    target = ("127.0.0.1", 4222)

    def __init__(self) -> None:
        require_service("NATS", *self.target)
        self.streams: list[str] = []

    async def prepare(self, topic: str, via: int | None = None) -> None:
        nc = await nats.connect("nats://127.0.0.1:4222")
        try:
            name = unique_name("S")
            await nc.jetstream().add_stream(name=name, subjects=[topic])
            self.streams.append(name)
        finally:
            await nc.close()

    def url(self, port: int) -> str:
        return f"nats://127.0.0.1:{port}"

    async def delivered_ids(self, topic: str, expected: int) -> list[str]:
        nc = await nats.connect("nats://127.0.0.1:4222")
        try:
            js = nc.jetstream()
            sub = await js.pull_subscribe(topic)
            ids: list[str] = []
            with contextlib.suppress(nats.errors.TimeoutError, TimeoutError):
                while True:
                    for msg in await sub.fetch(500, timeout=1):
                        ids.append((msg.headers or {})["Nats-Msg-Id"])
                        await msg.ack()
            await sub.unsubscribe()
            return ids
        finally:
            await nc.close()

    async def cleanup(self) -> None:
        nc = await nats.connect("nats://127.0.0.1:4222")
        for name in self.streams:
            with contextlib.suppress(Exception):
                await nc.jetstream().delete_stream(name)
        await nc.close()


class RabbitBroker:
    target = ("127.0.0.1", 5672)

    def __init__(self) -> None:
        require_service("RabbitMQ", *self.target)
        self.exchange = unique_name("ex")
        self.queues: dict[str, str] = {}

    def _channel(self) -> tuple[Any, Any]:
        conn = pika.BlockingConnection(pika.ConnectionParameters(*self.target, heartbeat=0))
        return conn, conn.channel()

    def _prepare(self, topic: str) -> None:
        conn, ch = self._channel()
        try:
            ch.exchange_declare(self.exchange, exchange_type="topic", durable=True)
            queue = f"q-{topic}"
            ch.queue_declare(queue, durable=False, auto_delete=False)
            ch.queue_bind(queue, self.exchange, routing_key=topic)
            self.queues[topic] = queue
        finally:
            conn.close()

    async def prepare(self, topic: str, via: int | None = None) -> None:
        await asyncio.to_thread(self._prepare, topic)

    def url(self, port: int) -> str:
        return f"amqp://guest:guest@127.0.0.1:{port}/?exchange={self.exchange}"

    def _read(self, topic: str) -> list[str]:
        conn, ch = self._channel()
        ids: list[str] = []
        try:
            while True:
                method, properties, _ = ch.basic_get(self.queues[topic], auto_ack=True)
                if method is None:
                    return ids
                ids.append(properties.message_id)
        finally:
            conn.close()

    async def delivered_ids(self, topic: str, expected: int) -> list[str]:
        return await asyncio.to_thread(self._read, topic)

    def _cleanup(self) -> None:
        conn, ch = self._channel()
        for queue in self.queues.values():
            ch.queue_delete(queue)
        ch.exchange_delete(self.exchange)
        conn.close()

    async def cleanup(self) -> None:
        await asyncio.to_thread(self._cleanup)


class KafkaBroker:
    """A Tansu of its own per test: behind a proxy it must advertise the proxy's port, or the
    clients would bypass the proxy after the first metadata request."""

    def __init__(self) -> None:
        self.tansu: TansuBroker | None = None
        self.target = ("127.0.0.1", free_port())

    async def prepare(self, topic: str, via: int | None = None) -> None:
        self.tansu = TansuBroker(self.target[1], advertised_port=via)
        await asyncio.to_thread(self.tansu.start)
        await asyncio.to_thread(create_topic, self.tansu.bootstrap, topic, 3)

    def url(self, port: int) -> str:
        return f"kafka://127.0.0.1:{port}"

    def _read(self, topic: str) -> list[str]:
        assert self.tansu is not None
        consumer = Consumer(
            {
                "bootstrap.servers": self.tansu.bootstrap,
                "group.id": topic,
                "enable.auto.commit": False,
                "logger": logging.getLogger("kafka"),
            }
        )
        try:
            metadata = consumer.list_topics(topic, timeout=10)
            partitions = [
                TopicPartition(topic, p, OFFSET_BEGINNING)
                for p in metadata.topics[topic].partitions
            ]
            consumer.assign(partitions)
            ids: list[str] = []
            idle_since = time.monotonic()
            while time.monotonic() - idle_since < 3:
                msg = consumer.poll(0.2)
                if msg is None or msg.error():
                    continue
                idle_since = time.monotonic()
                ids.append(dict(msg.headers() or [])["ce_id"].decode())
            return ids
        finally:
            consumer.close()

    async def delivered_ids(self, topic: str, expected: int) -> list[str]:
        return await asyncio.to_thread(self._read, topic)

    async def cleanup(self) -> None:
        if self.tansu is not None:
            await asyncio.to_thread(self.tansu.stop)


class HttpBroker:
    """A recording webhook receiver in the test's own loop; the relay POSTs to it."""

    def __init__(self) -> None:
        self.receiver = HttpReceiver()
        self.target = ("127.0.0.1", 0)

    async def start(self) -> None:
        await self.receiver.start()
        self.target = ("127.0.0.1", self.receiver.port)

    async def prepare(self, topic: str, via: int | None = None) -> None:
        return None

    def url(self, port: int) -> str:
        return f"http://127.0.0.1:{port}/hooks"

    async def delivered_ids(self, topic: str, expected: int) -> list[str]:
        return [r.header("ce-id") or "" for r in self.receiver.requests]

    async def cleanup(self) -> None:
        await self.receiver.stop()


BROKERS = {
    "http": HttpBroker,
    "redis": RedisBroker,
    "nats": NatsBroker,
    "rabbitmq": RabbitBroker,
    "kafka": KafkaBroker,
}


@pytest.fixture(params=sorted(BROKERS))
async def broker(request: pytest.FixtureRequest) -> AsyncIterator[Broker]:
    end: Broker = BROKERS[request.param]()
    start = getattr(end, "start", None)
    if start is not None:
        await start()
    yield end
    await end.cleanup()


class Database:
    """The outbox database of a test: its URL and schema for the relay's command line, a store
    of it for the test, and the application's writes."""

    def __init__(self, url: str, schema: str) -> None:
        self.url, self.schema = url, schema

    def store(self) -> PostgresStore | MysqlStore:
        names = TableNames(schema=self.schema)
        return (
            MysqlStore(self.url, names)
            if self.url.startswith("mysql")
            else PostgresStore(self.url, names)
        )

    def args(self) -> list[str]:
        return ["--database-url", self.url, "--schema", self.schema]

    async def write(self, topic: str, start: int, count: int) -> list[str]:
        """Commit ``count`` messages of 50 keys in one transaction."""
        outbox = outboxer.Outbox(schema=self.schema)
        batch = [
            {"topic": topic, "payload": {"n": n}, "key": f"k{n % 50}", "type": "Numbered"}
            for n in range(start, start + count)
        ]
        if self.url.startswith("mysql"):
            conn = await mysql_connect(self.schema)
            try:
                await conn.begin()
                ids = await outbox.enqueue_many_async(conn, batch)
                await conn.commit()
                return ids
            finally:
                conn.close()
        pg = await asyncpg.connect(self.url)
        try:
            async with pg.transaction():
                return await outbox.enqueue_many_async(pg, batch)
        finally:
            await pg.close()


@pytest.fixture(params=["postgres", "mariadb"])
def database(request: pytest.FixtureRequest) -> Database:
    if request.param == "mariadb":
        return Database(
            request.getfixturevalue("mysql_url"), request.getfixturevalue("mysql_database")
        )
    return Database(request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema"))


@contextlib.contextmanager
def relay_process(args: list[str], log: Path, level: str = "info") -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXER_")}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [OUTBOXER, "--log-level", level, "relay", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def drained(store: PostgresStore | MysqlStore, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (stats := await store.stats()).pending + stats.in_flight:
        assert time.monotonic() < deadline, f"not drained: {stats.to_json()}"
        await asyncio.sleep(0.1)


async def test_thousands_delivered_exactly_once(
    broker: Broker, database: Database, topic: str, tmp_path: Path
) -> None:
    await broker.prepare(topic)
    async with database.store() as store:
        await store.migrate()
        ids = await database.write(topic, 0, 5000)
        args = [*database.args(), "--broker", broker.url(broker.target[1])]
        with relay_process(args, tmp_path / "relay.log") as proc:
            await drained(store, 60)
        assert proc.returncode == 0
        stats = await store.stats()
    assert stats.dead_letters == 0, (tmp_path / "relay.log").read_text()[-2000:]
    delivered = await broker.delivered_ids(topic, len(ids))
    assert sorted(delivered) == sorted(ids), "every message exactly once"


#: Each broker's outage on one database; both databases take part.
OUTAGE_PAIRS = [
    ("http", "postgres"),
    ("kafka", "mariadb"),
    ("nats", "postgres"),
    ("rabbitmq", "mariadb"),
    ("redis", "postgres"),
]


@pytest.mark.parametrize(("broker", "database"), OUTAGE_PAIRS, indirect=True)
async def test_broker_outage_of_20_seconds_loses_nothing_and_backs_off(
    broker: Broker, database: Database, topic: str, tmp_path: Path
) -> None:
    log = tmp_path / "relay.log"
    async with database.store() as store, TcpProxy(*broker.target) as proxy:
        await broker.prepare(topic, via=proxy.port)
        await store.migrate()
        args = [
            *database.args(),
            "--broker",
            broker.url(proxy.port),
            "--outage-base",
            "1",
            "--outage-cap",
            "4",
        ]
        with relay_process(args, log, level="debug"):  # every backoff round, not only the first
            ids = await database.write(topic, 0, 1500)
            await drained(store, 60)
            await proxy.cut()
            cut_at = time.monotonic()
            ids += await database.write(topic, 1500, 1500)  # keeps coming
            await asyncio.sleep(20)
            during = await store.stats()  # a batch may be in flight: claimed, not yet released
            await proxy.restore()
            await drained(store, 90)
            recovered = time.monotonic() - cut_at
        stats = await store.stats()
        delivered = await broker.delivered_ids(topic, len(ids))  # through the proxy (Kafka)
    text = log.read_text()
    pauses = [float(p) for p in re.findall(r"broker unavailable .*: pausing ([\d.]+)s", text)]
    print(
        f"\n{broker.__class__.__name__}: pauses during the cut {pauses}, "
        f"all delivered {recovered:.1f} s after the cut began"
    )
    assert during.pending + during.in_flight == 1500, "nothing could be published during the cut"
    assert stats.dead_letters == 0, text[-3000:]
    assert 3 <= len(pauses) <= 12, f"backoff attempts during a 20 s cut: {pauses}"
    assert pauses[:3] == [1.0, 2.0, 4.0] and set(pauses[3:]) <= {4.0}, pauses
    assert set(delivered) == set(ids), "nothing lost"
    # What an operator sees at the default level: the outage once when it starts, once when it
    # ends, and no stream of client errors (librdkafka reconnects are paced and at DEBUG).
    warnings = [line for line in text.splitlines() if " WARNING " in line or " ERROR " in line]
    assert sum("broker unavailable" in line for line in warnings) == 1, warnings
    assert sum("broker is back" in line for line in warnings) == 1, warnings
    assert len(warnings) <= 10, warnings
