"""Property-based fuzzing of the admin API from its own OpenAPI schema: never a 5xx.

The app runs under uvicorn in a thread (with its own event loop and its own PostgreSQL store,
opened by the app's lifespan), over a fresh schema holding dead letters; schemathesis generates
requests that fit the schema (positive) and requests that do not (negative) for every operation.
Every answer must be below 500, and every 4xx a JSON ``{"detail": …}``. Generated replay and
purge requests really run against the database, so the data changes while the fuzzer works.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import asyncpg
import hypothesis
import pytest
import requests
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given
from schemathesis import GenerationMode

from outboxer.admin import create_app_from_url
from outboxer.admin.server import listen
from outboxer.config import TableNames
from outboxer.outbox import Outbox
from outboxer.ports import ClaimRequest, Settlement
from outboxer.stores.postgres import PostgresStore

TOKEN = "fuzz-admin-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXAMPLES = 30  # per operation and generation mode: ~500 requests, well under a minute


@pytest.fixture
async def seeded(pg_store: PostgresStore, pg_url: str, pg_schema: str) -> list[str]:
    """Dead letters of a few topics, types and keys, plus pending messages."""
    outbox = Outbox(schema=pg_schema)
    conn = await asyncpg.connect(pg_url)
    try:
        async with conn.transaction():
            ids = [
                await outbox.enqueue_async(
                    conn,
                    ("orders", "payments", "mail")[n % 3],
                    {"n": n, "text": "ünïcödé ✓"} if n % 4 else b"\x00\xff raw",
                    key=f"k{n % 5}",
                    type=("OrderCreated", "PaymentTaken", None)[n % 3],
                )
                for n in range(30)
            ]
    finally:
        await conn.close()
    dead: list[str] = []
    for _ in range(200):
        claim = await pg_store.claim_batch(
            ClaimRequest(limit=100, lease_seconds=30, ordered=False, relay_id="f")
        )
        await pg_store.settle(claim, Settlement(dead=[(m.id, "rejected") for m in claim.messages]))
        dead += [m.id for m in claim.messages]
        if len(dead) == len(ids):
            break
        await asyncio.sleep(0.01)
    assert sorted(dead) == sorted(ids)
    # And messages not yet published, so that the messages endpoints answer with items.
    conn = await asyncpg.connect(pg_url)
    try:
        for n in range(5):
            await outbox.enqueue_async(conn, "orders", {"n": n, "text": "ünïcödé ✓"}, key=f"k{n}")
    finally:
        await conn.close()
    return ids


class _ServerThread(threading.Thread):
    def __init__(self, app: Any) -> None:
        super().__init__(daemon=True)
        self.listener = listen("127.0.0.1", 0)
        config = uvicorn.Config(app, log_config=None, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def run(self) -> None:
        self.server.run(sockets=[self.listener])


@pytest.fixture
def base_url(seeded: list[str], pg_url: str, pg_schema: str) -> Iterator[str]:
    app = create_app_from_url(pg_url, TableNames(schema=pg_schema), token=TOKEN, ready_min_relays=0)
    thread = _ServerThread(app)
    thread.start()
    try:
        for _ in range(500):
            if thread.server.started:
                break
            assert thread.is_alive(), "the admin server did not start"
            threading.Event().wait(0.01)
        assert thread.server.started
        yield thread.url
    finally:
        thread.server.should_exit = True
        thread.join(15)
        thread.listener.close()


FUZZ_SETTINGS = hypothesis.settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # no .hypothesis/ directory in the checkout
    suppress_health_check=list(HealthCheck),
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
)


def fuzz_operation(
    operation: Any,
    mode: GenerationMode,
    base_url: str,
    session: requests.Session,
    seen: dict[str, set[int]],
) -> None:
    """Send ``EXAMPLES`` generated requests for one operation; fail on a 5xx."""

    sent = itertools.count(1)

    @FUZZ_SETTINGS
    @given(case=operation.as_strategy(generation_mode=mode))
    def fuzz(case: schemathesis.Case) -> None:
        # Four requests in five carry the token, the fifth none: both paths must stay below 500.
        headers = AUTH if next(sent) % 5 else {}
        response = case.call(base_url=base_url, session=session, headers=headers)
        seen.setdefault(operation.label, set()).add(response.status_code)
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path} query={case.query!r} "
            f"body={case.body!r} -> {response.status_code} {response.text[:500]}"
        )
        if response.status_code >= 400 and operation.path != "/metrics":
            body = response.json()
            assert isinstance(body, dict) and "detail" in body, response.text
            assert "Traceback" not in response.text

    try:
        fuzz()
    except hypothesis.errors.Unsatisfiable:
        # An operation without parameters or body has nothing to make invalid.
        assert mode is GenerationMode.NEGATIVE, operation.label


def test_no_generated_request_gets_a_server_error(base_url: str) -> None:
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", timeout=10)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 9, [op.label for op in operations]
    session = requests.Session()
    seen: dict[str, set[int]] = {}
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz_operation(operation, mode, base_url, session, seen)
    session.close()

    # The fuzzer reached the handlers, not only the validation layer.
    statuses = set().union(*seen.values())
    assert 200 in statuses and 422 in statuses, seen
    assert 404 in seen["GET /api/deadletters/{dead_letter_id}"], seen
    assert 404 in seen["GET /api/messages/{message_id}"], seen
    assert 200 in seen["GET /api/messages"], seen
