"""The order-pipeline example end to end: the FastAPI service, ``outboxer relay`` and the event
printer as real processes, over PostgreSQL (a fresh schema) and Kafka (Tansu).

Orders are created over HTTP; their ``OrderCreated`` events arrive on Kafka with ``ce_id`` = the
outbox message id and key = the order id; the order reads back; an order for a region whose
topic does not exist is dead-lettered by the relay (a permanent Kafka failure) and shows up at
``GET /api/deadletters`` of the same service.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import OUTBOXER, PYTHONPATH
from tests.conftest import unique_name
from tests.tansu import create_topic, free_port, kafka_bootstrap  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "order_pipeline"
TOKEN = "order-pipeline-test-token-0123456789"


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOXER_", "ORDERS_"))}
    env["PYTHONPATH"] = PYTHONPATH
    env.update(extra)
    return env


class Process:
    """A child process whose output goes to a log file quoted in failures."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], logs: Path) -> None:
        self.log = logs / f"{name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


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
def prefix() -> str:
    return unique_name("orders").replace("_", "-")


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in reversed(started):
        process.stop()


@pytest.fixture
async def service(
    pg_url: str, pg_schema: str, prefix: str, tmp_path: Path, processes: list[Process]
) -> AsyncIterator[httpx.AsyncClient]:
    upgrade(pg_url, pg_schema)
    port = free_port()
    env = environment(
        ORDERS_DATABASE_URL=pg_url,
        ORDERS_SCHEMA=pg_schema,
        ORDERS_TOPIC_PREFIX=prefix,
        OUTBOXER_ADMIN_TOKEN=TOKEN,
    )
    args = [sys.executable, "-m", "uvicorn", "--app-dir", str(EXAMPLE), "service:app"]
    app = Process("service", [*args, "--host", "127.0.0.1", "--port", str(port)], env, tmp_path)
    processes.append(app)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        deadline = time.monotonic() + 30
        while True:
            assert app.proc.poll() is None, app.text()
            try:
                if (await client.get("/healthz")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, app.text()
            await asyncio.sleep(0.1)
        yield client
    # uvicorn re-raises the SIGTERM it handled once its graceful shutdown is done.
    assert app.stop() in (0, -signal.SIGTERM), app.text()
    assert "Application shutdown complete" in app.text()


def order(customer: str, region: str = "eu", quantity: int = 2) -> dict[str, object]:
    return {
        "customer_id": customer,
        "region": region,
        "lines": [{"sku": "BOOK-1", "quantity": quantity, "unit_price": "12.50"}],
    }


async def test_orders_flow_to_kafka_and_failures_to_the_dead_letter_api(
    service: httpx.AsyncClient,
    kafka_bootstrap: str,  # noqa: F811 - the fixture imported above
    pg_url: str,
    pg_schema: str,
    prefix: str,
    tmp_path: Path,
    processes: list[Process],
) -> None:
    await asyncio.to_thread(create_topic, kafka_bootstrap, f"{prefix}.eu", 3)
    relay = Process(
        "relay",
        [
            *(OUTBOXER, "relay", "--database-url", pg_url, "--schema", pg_schema),
            *("--broker", f"kafka://{kafka_bootstrap}?missing_topic_timeout=1"),
        ],
        environment(),
        tmp_path,
    )
    processes.append(relay)

    # Bad input is refused and writes nothing.
    refused = await service.post("/api/orders", json=order("c-0", quantity=0))
    assert refused.status_code == 422

    created = []
    for n in range(5):
        response = await service.post("/api/orders", json=order(f"c-{n}", quantity=n + 1))
        assert response.status_code == 201, response.text
        assert response.headers["location"] == f"/api/orders/{response.json()['id']}"
        created.append(response.json())
    assert created[2]["total"] == "37.50"

    printer = Process(
        "printer",
        [
            *(sys.executable, str(EXAMPLE / "print_events.py"), "--bootstrap", kafka_bootstrap),
            *("--prefix", prefix, "--group", f"{prefix}-printer", "--max-events", "5", "--json"),
        ],
        environment(),
        tmp_path,
    )
    processes.append(printer)
    await asyncio.to_thread(printer.proc.wait, 90)
    assert printer.proc.returncode == 0, printer.text()
    events = [json.loads(line) for line in printer.log.read_text().splitlines()]
    by_id = {e["id"]: e for e in events}
    assert len(by_id) == 5 and not any(e["duplicate"] for e in events), events
    for placed in created:
        event = by_id[placed["event_id"]]  # ce_id = the outbox message id
        assert event["key"] == placed["id"]  # Kafka key = the order id
        assert event["type"] == "OrderCreated"
        assert event["topic"] == f"{prefix}.eu"
        assert event["payload"]["order_id"] == placed["id"]
        assert event["payload"]["total"] == placed["total"]

    # The order reads back; an unknown one is a 404, a malformed id a 422.
    again = await service.get(f"/api/orders/{created[0]['id']}")
    assert again.status_code == 200
    assert {k: v for k, v in created[0].items() if k != "event_id"} == again.json()
    assert (await service.get(f"/api/orders/{uuid.uuid4()}")).status_code == 404
    assert (await service.get("/api/orders/not-a-uuid")).status_code == 422

    # No topic for region "mars": Kafka refuses for good, the relay dead-letters the event.
    lost = (await service.post("/api/orders", json=order("c-9", region="mars"))).json()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert (await service.get("/api/deadletters")).status_code == 401  # the admin token
    deadline = time.monotonic() + 60
    while True:
        page = await service.get(
            "/api/deadletters", params={"topic": f"{prefix}.mars"}, headers=auth
        )
        assert page.status_code == 200, page.text
        if page.json()["items"]:
            break
        assert time.monotonic() < deadline, relay.text()
        await asyncio.sleep(0.2)
    [dead] = page.json()["items"]
    assert dead["id"] == lost["event_id"]
    assert dead["key"] == lost["id"]
    assert dead["type"] == "OrderCreated"
    assert dead["attempts"] == 1  # a permanent failure is not retried
    assert "does not exist" in dead["failure_reason"]
    assert dead["payload"]["order_id"] == lost["id"]
    # The order itself committed: the outbox never lets an event and its order part ways.
    assert (await service.get(f"/api/orders/{lost['id']}")).status_code == 200

    stats = (await service.get("/api/stats", headers=auth)).json()
    assert (stats["pending"], stats["in_flight"], stats["dead_letters"]) == (0, 0, 1)
    assert [r["relay_id"] for r in stats["relays"]], "the relay shows as live"
    assert relay.stop() == 0, relay.text()
