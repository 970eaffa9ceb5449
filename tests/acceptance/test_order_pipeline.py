"""The order-pipeline example, scene by scene, as the README tells it: the FastAPI service,
``outboxer relay``, ``outboxer consume`` with the inventory handlers and the event printer run as
real processes over PostgreSQL (a fresh schema per test) and Kafka (Tansu, behind a TCP proxy
that the outage scene cuts).

1. Orders flow to Kafka (``ce_id`` = the outbox message id, key = the order id); an order Kafka
   refuses for good (no topic for its region) is dead-lettered, replayed after the fix and
   delivered.
2. Kafka is cut: the relay backs off (its log shows the pauses growing to the cap), nothing is
   published or lost meanwhile, everything arrives once it is back.
3. Two relays share the work: every order is published once, by one of them.
4. The inventory consumer reduces stock exactly once through the inbox: a poison order (a SKU
   without stock) is retried 3 times, dead-lettered with its reason, replayed after the fix and
   handled; a forced redelivery of every event (the group's offsets reset) changes nothing.

Timeouts are shortened with the CLI's own options (``--outage-base``/``--outage-cap``,
``--retry-base``/``--retry-cap``/``--retry-interval``); every wait polls for the event it
needs (an HTTP answer, a log line, a committed offset), never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.acceptance.conftest import OUTBOXER, PYTHONPATH
from tests.acceptance.processes import Process, wait
from tests.conftest import unique_name
from tests.tansu import TansuBroker, free_port
from tests.tcp_proxy import TcpProxy

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "order_pipeline"
TOKEN = "order-pipeline-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOXER_", "ORDERS_"))}
    env["PYTHONPATH"] = PYTHONPATH
    env.update(extra)
    return env


class Kafka:
    """Tansu behind a :class:`TcpProxy` that runs on its own event loop in a thread (it serves
    every test of the module), advertised at the proxy's port so every client goes through it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        port = free_port()
        self.proxy = self.call(TcpProxy("127.0.0.1", port).start())
        self.broker = TansuBroker(port, advertised_port=self.proxy.port).start()
        self.bootstrap = self.broker.bootstrap

    def call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def close(self) -> None:
        self.broker.stop()
        self.call(self.proxy.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def kafka() -> Iterator[Kafka]:
    broker = Kafka()
    try:
        yield broker
    finally:
        broker.close()


class Pipeline:
    """One test's world: its schema, topic prefix, service client and processes."""

    def __init__(
        self, pg_url: str, schema: str, kafka: Kafka, logs: Path, client: httpx.AsyncClient
    ) -> None:
        self.pg_url = pg_url
        self.schema = schema
        self.kafka = kafka
        self.logs = logs
        self.http = client
        self.prefix = unique_name("orders").replace("_", "-")
        self.processes: list[Process] = []

    def start(self, name: str, args: list[str], **env: str) -> Process:
        process = Process(args, environment(**env), self.logs / f"{name}.log")
        self.processes.append(process)
        return process

    def relay(self, name: str = "relay", *options: str, log_level: str = "INFO") -> Process:
        return self.start(
            name,
            [
                *(OUTBOXER, "--log-level", log_level, "relay", "--database-url", self.pg_url),
                *("--schema", self.schema, "--relay-id", name),
                *("--broker", f"kafka://{self.kafka.bootstrap}?missing_topic_timeout=1"),
                *options,
            ],
        )

    async def topic(self, region: str) -> str:
        """Create the region's topic as the README does (``outboxer broker setup``)."""
        name = f"{self.prefix}.{region}"
        broker = f"kafka://{self.kafka.bootstrap}"
        setup = self.start(
            f"setup-{region}",
            [OUTBOXER, "broker", "setup", "--broker", broker, "--topic", name, "--partitions", "3"],
        )
        assert await asyncio.to_thread(setup.process.wait, 60) == 0, setup.output()
        return name

    async def order(
        self, customer: str, region: str = "eu", quantity: int = 2, sku: str = "BOOK-1"
    ) -> dict[str, Any]:
        body = {
            "customer_id": customer,
            "region": region,
            "lines": [{"sku": sku, "quantity": quantity, "unit_price": "12.50"}],
        }
        response = await self.http.post("/api/orders", json=body)
        assert response.status_code == 201, response.text
        created: dict[str, Any] = response.json()
        return created

    async def stats(self) -> dict[str, Any]:
        response = await self.http.get("/api/stats", headers=AUTH)
        assert response.status_code == 200, response.text
        figures: dict[str, Any] = response.json()
        return figures

    async def drained(self, *watching: Process) -> None:
        """Wait until nothing is pending or in flight (every relay published what it had)."""

        async def empty() -> bool:
            figures = await self.stats()
            return figures["pending"] == 0 and figures["in_flight"] == 0

        await wait(empty, lambda: "\n".join(p.output(4000) for p in watching))

    async def events(self, count: int, group: str) -> list[dict[str, Any]]:
        """The first ``count`` distinct events of this test's topics, read by print_events.py
        (a new consumer group reads from the beginning; duplicates are marked, not counted)."""
        printer = self.start(
            group,
            [
                *(sys.executable, str(EXAMPLE / "print_events.py")),
                *("--bootstrap", self.kafka.bootstrap, "--prefix", self.prefix),
                *("--group", f"{self.prefix}-{group}", "--max-events", str(count), "--json"),
            ],
        )
        code = await asyncio.to_thread(printer.process.wait, 60)
        assert code == 0, printer.output(4000)
        return [json.loads(line) for line in printer.log.read_text().splitlines()]


def upgrade(pg_url: str, schema: str) -> None:
    result = subprocess.run(
        [OUTBOXER, "db", "upgrade", "--database-url", pg_url, "--schema", schema],
        capture_output=True,
        text=True,
        env=environment(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


@pytest.fixture
async def pipeline(
    pg_url: str, pg_schema: str, kafka: Kafka, tmp_path: Path
) -> AsyncIterator[Pipeline]:
    upgrade(pg_url, pg_schema)
    port = free_port()
    args = [sys.executable, "-m", "uvicorn", "--app-dir", str(EXAMPLE), "service:app"]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        world = Pipeline(pg_url, pg_schema, kafka, tmp_path, client)
        app = world.start(
            "service",
            [*args, "--host", "127.0.0.1", "--port", str(port)],
            ORDERS_DATABASE_URL=pg_url,
            ORDERS_SCHEMA=pg_schema,
            ORDERS_TOPIC_PREFIX=world.prefix,
            OUTBOXER_ADMIN_TOKEN=TOKEN,
        )

        async def healthy() -> bool:
            assert app.process.poll() is None, app.output(4000)
            try:
                return (await client.get("/healthz")).status_code == 200
            except httpx.TransportError:
                return False

        await wait(healthy, lambda: app.output(4000))
        try:
            yield world
        finally:
            for process in reversed(world.processes[1:]):
                process.stop()
    # uvicorn re-raises the SIGTERM it handled once its graceful shutdown is done.
    assert app.stop() in (0, -signal.SIGTERM), app.output(4000)
    assert "Application shutdown complete" in app.output()


async def test_orders_flow_to_kafka_and_a_refused_one_is_dead_lettered_then_replayed(
    pipeline: Pipeline,
) -> None:
    await pipeline.topic("eu")
    relay = pipeline.relay()

    # Bad input is refused and writes nothing.
    refused = await pipeline.http.post(
        "/api/orders", json={"customer_id": "c", "lines": [{"sku": "X", "quantity": 0}]}
    )
    assert refused.status_code == 422

    created = [await pipeline.order(f"c-{n}", quantity=n + 1) for n in range(5)]
    assert created[2]["total"] == "37.50"
    events = await pipeline.events(5, "printer")
    by_id = {e["id"]: e for e in events}
    assert len(by_id) == 5 and not any(e["duplicate"] for e in events), events
    for placed in created:
        event = by_id[placed["event_id"]]  # ce_id = the outbox message id
        assert event["key"] == placed["id"]  # Kafka key = the order id
        assert event["type"] == "OrderCreated"
        assert event["topic"] == f"{pipeline.prefix}.eu"
        assert event["payload"]["order_id"] == placed["id"]
        assert event["payload"]["total"] == placed["total"]

    # The order reads back; an unknown one is a 404, a malformed id a 422.
    again = await pipeline.http.get(f"/api/orders/{created[0]['id']}")
    assert again.status_code == 200
    assert {k: v for k, v in created[0].items() if k != "event_id"} == again.json()
    assert (await pipeline.http.get(f"/api/orders/{uuid.uuid4()}")).status_code == 404
    assert (await pipeline.http.get("/api/orders/not-a-uuid")).status_code == 422

    # No topic for region "mars": Kafka refuses for good, the relay dead-letters the event at
    # once (retrying cannot create a topic).
    lost = await pipeline.order("c-9", region="mars")
    assert (await pipeline.http.get("/api/deadletters")).status_code == 401  # the admin token

    async def dead_letters() -> list[dict[str, Any]]:
        page = await pipeline.http.get("/api/deadletters", params={"key": lost["id"]}, headers=AUTH)
        assert page.status_code == 200, page.text
        items: list[dict[str, Any]] = page.json()["items"]
        return items

    [dead] = await wait(dead_letters, lambda: relay.output(4000))
    assert dead["id"] == lost["event_id"]
    assert (dead["topic"], dead["type"], dead["direction"]) == (
        f"{pipeline.prefix}.mars",
        "OrderCreated",
        "publish",
    )
    assert dead["attempts"] == 1  # a permanent failure is not retried
    assert "does not exist" in dead["failure_reason"]
    assert dead["payload"]["order_id"] == lost["id"]
    # The order itself committed: the outbox never lets an event and its order part ways.
    assert (await pipeline.http.get(f"/api/orders/{lost['id']}")).status_code == 200
    stats = await pipeline.stats()
    assert (stats["pending"], stats["in_flight"], stats["dead_letters"]) == (0, 0, 1)
    assert [r["relay_id"] for r in stats["relays"]] == ["relay"]

    # The fix: the topic exists. The replayed event is published with the same id.
    await pipeline.topic("mars")
    replay = await pipeline.http.post(f"/api/deadletters/{dead['id']}/replay", headers=AUTH)
    assert replay.status_code == 200, replay.text
    await pipeline.drained(relay)
    assert not await dead_letters(), relay.output(4000)
    events = await pipeline.events(6, "after-replay")
    replayed = [e for e in events if e["topic"] == f"{pipeline.prefix}.mars"]
    assert [(e["id"], e["key"]) for e in replayed] == [(lost["event_id"], lost["id"])]
    assert relay.stop() == 0, relay.output(4000)


async def test_kafka_cut_the_relay_backs_off_and_nothing_is_lost(pipeline: Pipeline) -> None:
    await pipeline.topic("eu")
    # DEBUG shows every paused round; at INFO only the first one and 'broker is back'.
    relay = pipeline.relay(
        "relay", "--outage-base", "0.2", "--outage-cap", "0.8", log_level="DEBUG"
    )
    before = [await pipeline.order(f"c-{n}") for n in range(3)]
    await pipeline.drained(relay)

    pipeline.kafka.call(pipeline.kafka.proxy.cut())
    try:
        during = [await pipeline.order(f"d-{n}") for n in range(5)]
        pauses: list[float] = []

        async def backed_off_to_the_cap() -> bool:
            found = re.findall(r"broker unavailable \(.*?\): pausing (\d+\.\d)s", relay.output())
            pauses[:] = [float(p) for p in found]
            return len(pauses) >= 4

        await wait(backed_off_to_the_cap, lambda: relay.output(4000))
        assert pauses[:4] == [0.2, 0.4, 0.8, 0.8], pauses  # doubling, capped
        # Nothing was published, nothing is lost: every order of the outage still waits.
        figures = await pipeline.stats()
        assert figures["pending"] + figures["in_flight"] == 5
    finally:
        pipeline.kafka.call(pipeline.kafka.proxy.restore())

    await pipeline.drained(relay)
    assert re.search(r"broker is back after \d+ failed rounds", relay.output())
    events = await pipeline.events(8, "printer")
    assert sorted(e["id"] for e in events if not e["duplicate"]) == sorted(
        o["event_id"] for o in before + during
    )
    assert (await pipeline.stats())["dead_letters"] == 0
    assert relay.stop() == 0, relay.output(4000)


async def test_two_relays_share_the_work_without_duplicates(pipeline: Pipeline) -> None:
    await pipeline.topic("eu")
    # Small batches so that both relays get some of the work.
    options = ("--batch-size", "5", "--window", "1", "--poll-interval", "0.05")
    relays = [pipeline.relay("relay-a", *options), pipeline.relay("relay-b", *options)]

    async def both_live() -> bool:
        return len((await pipeline.stats())["relays"]) == 2

    await wait(both_live, lambda: relays[0].output(4000) + relays[1].output(4000))
    # Both frozen while the orders are written, then woken together: a quick relay could
    # otherwise publish every message as it arrives, before the other's next poll.
    for relay in relays:
        relay.process.send_signal(signal.SIGSTOP)
    created: list[dict[str, Any]] = []
    try:
        for start in range(0, 60, 20):  # 20 requests at a time
            batch = (pipeline.order(f"c-{n}") for n in range(start, start + 20))
            created += await asyncio.gather(*batch)
    finally:
        for relay in relays:
            relay.process.send_signal(signal.SIGCONT)
    await pipeline.drained(*relays)
    for relay in relays:
        assert relay.stop() == 0, relay.output(4000)
    published = [r.counters()["published"] for r in relays]
    assert sum(published) == 60 and min(published) > 0, published

    events = await pipeline.events(60, "printer")
    assert not any(e["duplicate"] for e in events), [e for e in events if e["duplicate"]]
    assert sorted(e["id"] for e in events) == sorted(o["event_id"] for o in created)


async def stock(pipeline: Pipeline) -> dict[str, int]:
    conn = await asyncpg.connect(pipeline.pg_url)
    try:
        rows = await conn.fetch(f'SELECT sku, quantity FROM "{pipeline.schema}".stock')
    finally:
        await conn.close()
    return {row["sku"]: row["quantity"] for row in rows}


def committed(bootstrap: str, group: str, topic: str) -> list[int]:
    """The offsets ``group`` committed on each partition of ``topic`` (0: none yet)."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        partitions = reader.list_topics(topic, timeout=10).topics[topic].partitions
        offsets = reader.committed([TopicPartition(topic, p) for p in sorted(partitions)], 10)
        return [max(0, o.offset) for o in offsets]
    finally:
        reader.close()


def rewind(bootstrap: str, group: str, topic: str) -> None:
    """Reset ``group``'s committed offsets on ``topic`` to the beginning (what an operator does
    to replay a topic): the next consumer of the group gets every record again."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        partitions = reader.list_topics(topic, timeout=10).topics[topic].partitions
        reader.commit(offsets=[TopicPartition(topic, p, 0) for p in partitions], asynchronous=False)
    finally:
        reader.close()


async def test_inventory_consumer_exactly_once_with_a_poison_order_and_a_redelivery(
    pipeline: Pipeline,
) -> None:
    topic = await pipeline.topic("eu")
    env = {"ORDERS_SCHEMA": pipeline.schema}
    setup = [sys.executable, str(EXAMPLE / "inventory.py"), "--database-url", pipeline.pg_url]
    stocked = pipeline.start("stock", [*setup, "--stock", "BOOK-1=100"], **env)
    assert await asyncio.to_thread(stocked.process.wait, 30) == 0, stocked.output(4000)
    relay = pipeline.relay()
    group = f"{pipeline.prefix}-inventory"

    def consumer(name: str) -> Process:
        return pipeline.start(
            name,
            [
                *(OUTBOXER, "consume", "--database-url", pipeline.pg_url),
                *("--schema", pipeline.schema, "--broker", f"kafka://{pipeline.kafka.bootstrap}"),
                *("--app-dir", str(EXAMPLE), "--handlers", "inventory:registry"),
                *("--consumer-name", group, "--topic", topic, "--max-attempts", "3"),
                *("--retry-base", "0.2", "--retry-cap", "0.4", "--retry-interval", "0.2"),
            ],
            **env,
        )

    inventory = consumer("inventory")
    for n in range(3):
        await pipeline.order(f"c-{n}", quantity=n + 1)
    poison = await pipeline.order("c-poison", sku="GIFT-9")
    await pipeline.order("c-late", quantity=4)  # another key: not held back by the poison

    async def stock_is(expected: dict[str, int]) -> bool:
        return await stock(pipeline) == expected

    await wait(lambda: stock_is({"BOOK-1": 100 - 1 - 2 - 3 - 4}), lambda: inventory.output(4000))

    # The poison order: retried 3 times, then a consume dead letter with its reason.
    async def dead_letter() -> dict[str, Any] | None:
        page = await pipeline.http.get(
            "/api/deadletters", params={"key": poison["id"]}, headers=AUTH
        )
        items = page.json()["items"]
        return items[0] if items else None

    dead = await wait(dead_letter, lambda: inventory.output(4000))
    assert (dead["id"], dead["key"], dead["type"]) == (
        poison["event_id"],
        poison["id"],
        "OrderCreated",
    )
    assert (dead["direction"], dead["attempts"]) == ("consume", 3)
    assert "no stock row for SKU 'GIFT-9'" in dead["failure_reason"], dead
    assert await stock(pipeline) == {"BOOK-1": 90}  # its failed attempts left nothing behind

    # The fix: the SKU is stocked. The replayed dead letter is handled by the inventory.
    stocked = pipeline.start("stock-fix", [*setup, "--stock", "GIFT-9=5"], **env)
    assert await asyncio.to_thread(stocked.process.wait, 30) == 0, stocked.output(4000)
    replay = await pipeline.http.post(f"/api/deadletters/{dead['id']}/replay", headers=AUTH)
    assert replay.status_code == 200, replay.text
    await wait(lambda: stock_is({"BOOK-1": 90, "GIFT-9": 3}), lambda: inventory.output(4000))
    assert (await pipeline.stats())["dead_letters"] == 0
    assert inventory.stop() == 0, inventory.output(4000)
    first = inventory.counters()
    # Four orders handled at once, the poison one after its replay; two retries before it died.
    assert (first["handled"], first["retrying"], first["dead"], first["duplicate"]) == (5, 2, 1, 0)

    # Forced redelivery: the group's offsets go back to the beginning, so Kafka delivers all five
    # events again. The inbox knows each of them: nothing runs, the stock does not move.
    done = await asyncio.to_thread(committed, pipeline.kafka.bootstrap, group, topic)
    assert sum(done) == 5, done  # every event was consumed and its offset committed
    await asyncio.to_thread(rewind, pipeline.kafka.bootstrap, group, topic)
    offsets = await asyncio.to_thread(committed, pipeline.kafka.bootstrap, group, topic)
    assert offsets == [0] * len(done), offsets
    again = consumer("inventory-again")

    async def caught_up() -> bool:
        offsets[:] = await asyncio.to_thread(committed, pipeline.kafka.bootstrap, group, topic)
        return offsets == done

    await wait(caught_up, lambda: f"committed {offsets}, before {done}\n{again.output(4000)}")
    assert again.stop() == 0, again.output(4000)
    second = again.counters()
    assert (second["handled"], second["duplicate"]) == (0, 5), second
    assert await stock(pipeline) == {"BOOK-1": 90, "GIFT-9": 3}
    assert relay.stop() == 0, relay.output(4000)
