"""outboxer side by side with the best Python outboxes on PyPI, in one run.

**Relay** (per broker): 100,000 messages (≈120-byte JSON payloads, 1,000 keys) drained from
PostgreSQL to the broker by

- ``outboxer relay --unordered`` and ``outboxer relay`` (ordered, the default): the CLI process
  a user starts, default settings;
- a txoutbox relay process (``benchmarks/txoutbox_relay.py``: its ``PostgresStorage``, per-key
  ordering, settings from its README), publishing with the broker's usual asyncio client.

Each relay is started first and waits on an empty table; the backlog is committed in one
transaction, and the clock runs from that commit until the broker holds all 100,000 messages
(polled every 20 ms on the broker: stream length, topic offsets, queue depth). Every publish
is confirmed by the broker (Kafka ``acks=all`` with the idempotent producer, RabbitMQ publisher
confirms with persistent messages on a durable queue, JetStream PubAcks, the ``XADD`` reply).
Afterwards every message is read back from the broker and checked: each ``order_id`` exactly
once (0 lost, 0 duplicates). The relay process's RSS is sampled from ``/proc/<pid>/status``
(``VmHWM``: its peak while draining). Variants are interleaved in rounds; best of ``ROUNDS``.

**Writes**: 10,000 messages in one transaction (commit included) through each library's public
API on PostgreSQL: outboxer ``enqueue_many`` (asyncpg, and SQLAlchemy ``AsyncSession``) and
``enqueue`` per message; txoutbox ``insert`` per message (it has no batch insert);
faststream-outbox ``publish_batch`` (SQLAlchemy ``AsyncSession`` on asyncpg). Best of 5.

Needs the ``bench`` extra (``pip install -e '.[dev,bench]'``; ``make bench`` does it).

Run: ``.venv/bin/python -m benchmarks.peers [kafka rabbitmq nats redis writes]``
(``OUTBOXER_BENCH_PEERS_COUNT`` changes the 100,000).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg

import outboxer
from benchmarks.common import PAYLOAD, PG_URL, fresh_schema, save
from benchmarks.txoutbox_relay import TABLE as TXOUTBOX_TABLE
from benchmarks.txoutbox_relay import create_table as create_txoutbox_table
from outboxer.config import TableNames
from outboxer.stores.postgres import PostgresStore

COUNT = int(os.environ.get("OUTBOXER_BENCH_PEERS_COUNT", "100000"))
KEYS = 1000
ROUNDS = int(os.environ.get("OUTBOXER_BENCH_PEERS_ROUNDS", "2"))
WRITE_COUNT = 10_000
WRITE_ROUNDS = int(os.environ.get("OUTBOXER_BENCH_PEERS_ROUNDS", "5"))
ROOT = Path(__file__).resolve().parents[1]
OUTBOXER = str(Path(sys.executable).parent / "outboxer")
VARIANTS = ("outboxer unordered", "outboxer ordered", "txoutbox")


# -- brokers: where the relays publish, and how the benchmark counts and reads it back ----------


class Kafka:
    """Tansu (the Kafka-protocol broker the tests use), topics of 3 partitions."""

    name = "kafka"

    async def __aenter__(self) -> Kafka:
        from tests.tansu import TansuBroker

        self.broker = await asyncio.to_thread(TansuBroker().start)
        self.bootstrap = self.broker.bootstrap
        self.url = f"kafka://{self.bootstrap}"
        self.readers: dict[str, tuple[Any, list[bytes]]] = {}
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.broker.stop)

    async def new_topic(self) -> str:
        from tests.tansu import create_topic

        name = f"bench-{uuid.uuid4().hex[:8]}"
        create_topic(self.bootstrap, name, partitions=3)
        return name

    async def count(self, topic: str) -> int:
        # Tansu's high watermark counts record batches, not records, so the benchmark reads
        # the topic as it fills (librdkafka fetches in its own threads) and counts the records.
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        if topic not in self.readers:
            consumer = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                }
            )
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)])
            self.readers[topic] = (consumer, [])
        consumer, values = self.readers[topic]
        while batch := consumer.consume(num_messages=10_000, timeout=0):
            values.extend(m.value() for m in batch if m.error() is None)
        return len(values)

    async def order_ids(self, topic: str, expected: int) -> list[int]:
        deadline = time.monotonic() + 5  # anything more (a duplicate) arrives within this
        while time.monotonic() < deadline:
            await self.count(topic)
            await asyncio.sleep(0.1)
        consumer, values = self.readers.pop(topic)
        consumer.close()
        return [json.loads(value)["order_id"] for value in values]

    async def drop(self, topic: str) -> None:
        from confluent_kafka.admin import AdminClient

        for future in (
            AdminClient({"bootstrap.servers": self.bootstrap}).delete_topics([topic]).values()
        ):
            with contextlib.suppress(Exception):
                future.result(10)


class RabbitMQ:
    """A durable topic exchange; per run a durable queue bound to the run's routing key."""

    name = "rabbitmq"

    async def __aenter__(self) -> RabbitMQ:
        import pika

        self.exchange = f"bench-{uuid.uuid4().hex[:8]}"
        self.connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
        self.channel = self.connection.channel()
        self.channel.exchange_declare(self.exchange, exchange_type="topic", durable=True)
        self.url = f"amqp://guest:guest@127.0.0.1:5672/%2F?exchange={self.exchange}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.channel.exchange_delete(self.exchange)
        self.connection.close()

    async def new_topic(self) -> str:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        self.channel.queue_declare(name, durable=True)
        self.channel.queue_bind(name, self.exchange, routing_key=name)
        return name

    async def count(self, topic: str) -> int:
        method = self.channel.queue_declare(topic, durable=True, passive=True).method
        count: int = method.message_count
        return count

    async def order_ids(self, topic: str, expected: int) -> list[int]:
        ids: list[int] = []
        total = await self.count(topic)
        self.channel.basic_qos(prefetch_count=5000)
        for _method, _properties, body in self.channel.consume(
            topic, auto_ack=True, inactivity_timeout=5
        ):
            if body is None:
                break
            ids.append(json.loads(body)["order_id"])
            if len(ids) >= total:
                break
        self.channel.cancel()
        return ids

    async def drop(self, topic: str) -> None:
        self.channel.queue_delete(topic)


class Nats:
    """NATS JetStream: per run a file-backed stream capturing the run's subject."""

    name = "nats"
    url = "nats://127.0.0.1:4222"

    async def __aenter__(self) -> Nats:
        import nats

        self.client = await nats.connect(self.url)
        self.js = self.client.jetstream()
        self.streams: dict[str, str] = {}
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.client.close()

    async def new_topic(self) -> str:
        topic = f"bench.{uuid.uuid4().hex[:8]}"
        self.streams[topic] = f"BENCH_{uuid.uuid4().hex[:10]}"
        await self.js.add_stream(name=self.streams[topic], subjects=[topic])
        return topic

    async def count(self, topic: str) -> int:
        info = await self.js.stream_info(self.streams[topic])
        count: int = info.state.messages
        return count

    async def order_ids(self, topic: str, expected: int) -> list[int]:
        total = await self.count(topic)
        ids: list[int] = []
        done = asyncio.Event()

        async def received(message: Any) -> None:
            ids.append(json.loads(message.data)["order_id"])
            if len(ids) >= total:
                done.set()

        sub = await self.js.subscribe(
            topic, stream=self.streams[topic], ordered_consumer=True, cb=received
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout=120)
        await sub.unsubscribe()
        return ids

    async def drop(self, topic: str) -> None:
        await self.js.delete_stream(self.streams.pop(topic))


class Redis:
    """Redis Streams: one stream per run."""

    name = "redis"
    url = "redis://127.0.0.1:6379/0"

    async def __aenter__(self) -> Redis:
        import redis.asyncio as aioredis

        self.client = aioredis.Redis()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.client.aclose()

    async def new_topic(self) -> str:
        return f"bench-{uuid.uuid4().hex[:8]}"

    async def count(self, topic: str) -> int:
        count: int = await self.client.xlen(topic)
        return count

    async def order_ids(self, topic: str, expected: int) -> list[int]:
        ids: list[int] = []
        start = "-"
        while entries := await self.client.xrange(topic, min=start, count=10_000):
            ids.extend(json.loads(fields[b"payload"])["order_id"] for _, fields in entries)
            start = "(" + entries[-1][0].decode()
        return ids

    async def drop(self, topic: str) -> None:
        await self.client.delete(topic)


BROKERS: dict[str, Callable[[], Any]] = {
    "kafka": Kafka,
    "rabbitmq": RabbitMQ,
    "nats": Nats,
    "redis": Redis,
}


# -- relay processes -------------------------------------------------------------------------


class RelayProcess:
    """A relay in its own process (stderr kept in a temporary file for failure messages)."""

    def __init__(self, argv: list[str]) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXER_")}
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop()
        self.process = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=self.log
        )

    def memory_mb(self) -> tuple[float, float]:
        """(current, peak) resident set size in MB, from /proc/<pid>/status."""
        fields = dict(
            line.split(":", 1)
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines()
        )
        return (
            int(fields["VmRSS"].split()[0]) / 1024,
            int(fields["VmHWM"].split()[0]) / 1024,
        )

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            self.log.seek(0)
            raise RuntimeError(
                f"relay exited with {self.process.returncode}: {self.log.read()[-3000:]!r}"
            )

    async def wait_line(self, expected: str, timeout: float = 30) -> float:
        """Wait for a line on the relay's stdout; the time it was read."""
        assert self.process.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.process.stdout.readline), timeout)
        if line.decode().strip() != expected:
            await asyncio.to_thread(self.process.wait, 5)
            self.check_alive()
            raise RuntimeError(f"relay said {line!r}, not {expected!r}")
        return time.perf_counter()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def relay_command(schema: str, broker: str, *extra: str) -> list[str]:
    """The ``outboxer relay`` command line a user would run, quiet but for warnings."""
    quiet = [OUTBOXER, "--log-level", "WARNING", "relay"]
    return [*quiet, "--database-url", PG_URL, "--schema", schema, "--broker", broker, *extra]


def outboxer_relay(schema: str, broker: str, *extra: str) -> RelayProcess:
    return RelayProcess(relay_command(schema, broker, *extra))


async def wait_for(predicate: Callable[[], Any], timeout: float, relay: RelayProcess) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        relay.check_alive()
        if time.monotonic() > deadline:
            relay.log.seek(0)
            raise TimeoutError(f"relay's log: {relay.log.read()[-3000:]!r}")
        await asyncio.sleep(0.02)


def rows(count: int, topic: str, start: int = 0) -> list[dict[str, Any]]:
    """The benchmark's messages ``start`` … ``start + count - 1``: key = n % 1,000."""
    return [
        {
            "topic": topic,
            "payload": {**PAYLOAD, "order_id": n},
            "key": n % KEYS,
            "type": "OrderCreated",
        }
        for n in range(start, start + count)
    ]


async def fill_outboxer(schema: str, topic: str, count: int) -> None:
    """Commit ``count`` messages in one transaction (enqueued 50,000 at a time), analyzed."""
    outbox = outboxer.Outbox(schema=schema)
    conn = await asyncpg.connect(PG_URL)
    try:
        async with conn.transaction():
            for start in range(0, count, 50_000):
                await outbox.enqueue_many_async(
                    conn, rows(min(50_000, count - start), topic, start)
                )
            # in the filling transaction, so that the relay sees the statistics with the rows
            await conn.execute(f'ANALYZE "{schema}".outbox')
    finally:
        await conn.close()


async def fill_txoutbox(schema: str, topic: str, count: int) -> None:
    """The same messages (same payload bytes and keys) in txoutbox's table, one transaction."""
    outbox = outboxer.Outbox()
    conn = await asyncpg.connect(PG_URL)
    try:
        async with conn.transaction():
            for start in range(0, count, 50_000):
                records = []
                for message in rows(min(50_000, count - start), topic, start):
                    row = outbox.row(**message)
                    records.append((row.topic, row.key, row.payload))
                await conn.copy_records_to_table(
                    TXOUTBOX_TABLE,
                    records=records,
                    columns=["topic", "key", "payload"],
                    schema_name=schema,
                )
            await conn.execute(f'ANALYZE "{schema}".{TXOUTBOX_TABLE}')
    finally:
        await conn.close()


async def _empty(conn: asyncpg.Connection, table: str) -> bool:
    return bool(await conn.fetchval(f"SELECT NOT EXISTS (SELECT 1 FROM {table})"))


async def relay_run(broker: Any, variant: str, count: int = COUNT) -> dict[str, Any]:
    """One drain of ``count`` messages by ``variant``; msg/s, RSS, lost and duplicates."""
    topic = await broker.new_topic()
    async with fresh_schema(f"bench_peer_{uuid.uuid4().hex[:6]}") as schema:
        conn = await asyncpg.connect(PG_URL)
        try:
            if variant == "txoutbox":
                await create_txoutbox_table(conn, schema)
                table = f'"{schema}".{TXOUTBOX_TABLE}'
                relay = RelayProcess(
                    [sys.executable, "-m", "benchmarks.txoutbox_relay", broker.url, PG_URL, schema]
                )
            else:
                async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
                    await store.migrate()
                table = f'"{schema}".outbox'
                extra = ["--unordered"] if variant == "outboxer unordered" else []
                relay = outboxer_relay(schema, broker.url, *extra)
            try:
                if variant == "txoutbox":
                    await relay.wait_line("ready")
                else:
                    async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
                        await wait_for(lambda: _live(store), 30, relay)
                idle_mb, _ = relay.memory_mb()
                fill = fill_txoutbox if variant == "txoutbox" else fill_outboxer
                await fill(schema, topic, count)
                started = time.perf_counter()  # the backlog has just committed

                async def delivered() -> bool:
                    return bool(await broker.count(topic) >= count)

                await wait_for(delivered, 600, relay)
                elapsed = time.perf_counter() - started
                await wait_for(lambda: _empty(conn, table), 60, relay)  # settled in the outbox
                _, peak_mb = relay.memory_mb()
            finally:
                relay.stop()
        finally:
            await conn.close()
    ids = await broker.order_ids(topic, count)
    await broker.drop(topic)
    distinct = set(ids)
    return {
        "msg_per_s": count / elapsed,
        "lost": len(set(range(count)) - distinct),
        "duplicates": len(ids) - len(distinct),
        "rss_idle_mb": round(idle_mb, 1),
        "rss_peak_mb": round(peak_mb, 1),
    }


async def _live(store: PostgresStore) -> bool:
    return len((await store.stats()).relays) >= 1


async def measure(name: str) -> dict[str, Any]:
    best: dict[str, dict[str, Any]] = {}
    async with BROKERS[name]() as broker:
        for _ in range(ROUNDS):
            for variant in VARIANTS:
                run = await relay_run(broker, variant)
                print(
                    f"  {name:9} {variant:19} {run['msg_per_s']:8.0f} msg/s  "
                    f"lost {run['lost']} dup {run['duplicates']}  "
                    f"RSS {run['rss_idle_mb']:.0f} → {run['rss_peak_mb']:.0f} MB",
                    flush=True,
                )
                if run["lost"] or run["duplicates"]:
                    raise RuntimeError(f"{name} {variant}: {run}")
                kept = best.get(variant)
                if kept is None or run["msg_per_s"] > kept["msg_per_s"]:
                    best[variant] = run
                best[variant]["rss_peak_mb"] = max(best[variant]["rss_peak_mb"], run["rss_peak_mb"])
    unordered = best["outboxer unordered"]["msg_per_s"]
    ordered = best["outboxer ordered"]["msg_per_s"]
    txoutbox = best["txoutbox"]["msg_per_s"]
    row = {
        "broker": name,
        "unordered": round(unordered),
        "ordered": round(ordered),
        "txoutbox": round(txoutbox),
        "unordered_over_txoutbox": round(unordered / txoutbox, 2),
        "ordered_over_txoutbox": round(ordered / txoutbox, 2),
        "ordered_over_unordered": round(ordered / unordered, 2),
        "rss_peak_mb": {v: best[v]["rss_peak_mb"] for v in VARIANTS},
        "lost": 0,
        "duplicates": 0,
    }
    print(
        f"{name:9} outboxer unordered {unordered:8.0f}  ordered {ordered:8.0f}  "
        f"txoutbox {txoutbox:8.0f} msg/s | unordered/txoutbox "
        f"{row['unordered_over_txoutbox']:.1f}×  ordered/txoutbox "
        f"{row['ordered_over_txoutbox']:.1f}×  ordered/unordered "
        f"{row['ordered_over_unordered']:.2f}  | RSS peak MB {row['rss_peak_mb']}",
        flush=True,
    )
    return row


# -- writes -----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def write_tables() -> AsyncIterator[dict[str, Any]]:
    """One schema holding outboxer's, txoutbox's and faststream-outbox's tables."""
    import sqlalchemy as sa
    from faststream_outbox import OutboxBroker, make_outbox_table
    from sqlalchemy.ext.asyncio import create_async_engine

    async with fresh_schema("bench_peer_writes") as schema:
        async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
            await store.migrate()
        conn = await asyncpg.connect(PG_URL)
        await create_txoutbox_table(conn, schema)
        engine = create_async_engine(PG_URL.replace("postgresql://", "postgresql+asyncpg://"))
        metadata = sa.MetaData(schema=schema)
        faststream_table = make_outbox_table(metadata, table_name="fs_outbox")
        async with engine.begin() as sa_conn:
            await sa_conn.run_sync(metadata.create_all)
        try:
            yield {
                "schema": schema,
                "conn": conn,
                "engine": engine,
                "outbox": outboxer.Outbox(schema=schema),
                "faststream": OutboxBroker(engine, outbox_table=faststream_table),
            }
        finally:
            await engine.dispose()
            await conn.close()


async def write_rate(tables: dict[str, Any], variant: str) -> float:
    from sqlalchemy.ext.asyncio import AsyncSession
    from txoutbox.adapters.postgres import PostgresStorage

    batch = rows(WRITE_COUNT, "orders")
    outbox = tables["outbox"]
    started = time.perf_counter()
    if variant in ("outboxer enqueue_many (SQLAlchemy)", "faststream-outbox publish_batch"):
        async with AsyncSession(tables["engine"]) as session, session.begin():
            if variant == "faststream-outbox publish_batch":
                await tables["faststream"].publish_batch(
                    *(m["payload"] for m in batch), queue="orders", session=session
                )
            else:
                await outbox.enqueue_many_async(session, batch)
    else:
        conn = await asyncpg.connect(PG_URL)
        try:
            async with conn.transaction():
                if variant == "outboxer enqueue_many (asyncpg)":
                    await outbox.enqueue_many_async(conn, batch)
                elif variant == "outboxer enqueue (asyncpg)":
                    for message in batch:
                        await outbox.enqueue_async(conn, **message)
                else:  # txoutbox insert: its storage object takes the caller's connection
                    storage = PostgresStorage(
                        None, table=TXOUTBOX_TABLE, schema=tables["schema"], delete_on_ack=True
                    )
                    for m in batch:
                        await storage.insert(conn, m["topic"], m["payload"], key=str(m["key"]))
        finally:
            await conn.close()
    return WRITE_COUNT / (time.perf_counter() - started)


WRITE_VARIANTS = (
    "outboxer enqueue_many (asyncpg)",
    "outboxer enqueue_many (SQLAlchemy)",
    "faststream-outbox publish_batch",
    "outboxer enqueue (asyncpg)",
    "txoutbox insert (asyncpg)",
)


async def writes() -> dict[str, Any]:
    best = dict.fromkeys(WRITE_VARIANTS, 0.0)
    async with write_tables() as tables:
        schema, conn = tables["schema"], tables["conn"]
        for _ in range(WRITE_ROUNDS):
            for variant in WRITE_VARIANTS:
                best[variant] = max(best[variant], await write_rate(tables, variant))
                await conn.execute(
                    f'TRUNCATE "{schema}".outbox, "{schema}".{TXOUTBOX_TABLE}, "{schema}".fs_outbox'
                )
    faststream = best["faststream-outbox publish_batch"]
    for variant, rate in best.items():
        print(f"  {variant:36} {rate:8.0f} msg/s  ({rate / faststream:.2f} × faststream-outbox)")
    return {
        "messages": WRITE_COUNT,
        "rounds": WRITE_ROUNDS,
        "msg_per_s": {v: round(r) for v, r in best.items()},
        "enqueue_many_over_faststream": round(
            best["outboxer enqueue_many (asyncpg)"] / faststream, 2
        ),
    }


async def main(parts: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {"count": COUNT, "keys": KEYS, "rounds": ROUNDS, "rows": []}
    for name in parts:
        if name in BROKERS:
            result["rows"].append(await measure(name))
    if "writes" in parts:
        result["writes"] = await writes()
    everything = set(parts) == {*BROKERS, "writes"}
    save("peers" if everything else "peers_" + "_".join(parts), result)
    return result


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] or [*BROKERS, "writes"]))
