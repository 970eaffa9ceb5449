"""The admin HTTP API against a real PostgreSQL store, through the ASGI interface.

Dead letters are produced the way a relay produces them: claim, then settle with
``Settlement(dead=...)``. Every mutating call is checked in the database (stats, claim), and
every refused call is checked to have changed nothing.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
import os
import pty
import random
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import quote

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from outboxer.admin import create_app, create_app_from_url
from outboxer.config import TableNames
from outboxer.errors import ConfigurationError, StoreUnavailable
from outboxer.inbox import consume
from outboxer.message import Message
from outboxer.outbox import Outbox
from outboxer.ports import (
    ClaimRequest,
    ConsumeFailure,
    DeadLetterFilter,
    MessageFilter,
    OutboxStats,
    RelayInfo,
    Retry,
    Settlement,
    Store,
)
from outboxer.stores.mysql import MysqlStore
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.sqlite import SqliteStore
from outboxer.testing import InMemoryStore
from tests.acceptance.conftest import OUTBOXER, PYTHONPATH, ROOT
from tests.conftest import give_up_on, mysql_connect

TOKEN = "test-admin-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON_TYPE = {"Content-Type": "application/json"}

Client = httpx.AsyncClient
MakeDead = Callable[..., Awaitable[list[str]]]


def client_for(app: Any, base_url: str = "http://localhost:8080", **options: Any) -> Client:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, **options), base_url=base_url)


@pytest.fixture
async def admin(pg_store: PostgresStore) -> AsyncIterator[Client]:
    """A client of an app with a token, sending the token."""
    async with client_for(create_app(pg_store, token=TOKEN)) as client:
        client.headers.update(AUTH)
        yield client


@pytest.fixture
async def write(pg_url: str, pg_schema: str) -> MakeDead:
    """``await write(topic, n, type=..., key=..., available_at=...)``: commit n messages."""
    outbox = Outbox(schema=pg_schema)

    async def make(
        topic: str = "orders",
        n: int = 1,
        *,
        type: str | None = "OrderCreated",
        key: Any = None,
        **options: Any,
    ) -> list[str]:
        conn = await asyncpg.connect(pg_url)
        try:
            async with conn.transaction():
                return [
                    await outbox.enqueue_async(
                        conn,
                        topic,
                        {"order": i, "topic": topic},
                        type=type,
                        key=key(i) if callable(key) else key,
                        headers={"trace": f"t{i}"},
                        **options,
                    )
                    for i in range(n)
                ]
        finally:
            await conn.close()

    return make


@pytest.fixture
async def make_dead(pg_store: PostgresStore, write: MakeDead) -> MakeDead:
    """``await make_dead(topic, n, type=..., key=...)``: commit n messages, dead-letter them."""

    async def make(
        topic: str = "orders", n: int = 1, *, type: str | None = "OrderCreated", key: Any = None
    ) -> list[str]:
        ids = await write(topic, n, type=type, key=key)
        claimed: list[str] = []
        deadline = asyncio.get_running_loop().time() + 10
        while set(claimed) != set(ids):
            assert asyncio.get_running_loop().time() < deadline, "messages never claimable"
            claim = await pg_store.claim_batch(
                ClaimRequest(limit=1000, lease_seconds=30, ordered=False, relay_id="test-relay")
            )
            mine = [m.id for m in claim.messages if m.id in ids]
            await pg_store.settle(
                claim,
                Settlement(
                    dead=[(i, f"rejected by broker: {i}") for i in mine],
                    released=[m.id for m in claim.messages if m.id not in ids],
                ),
            )
            claimed += mine
        return ids

    return make


async def hold_up_a_key(store: Store, consumer: str) -> None:
    """``consumer``'s handler fails on the first message of a key; two more of that key are
    stored behind it (``consume_failures``: retrying 1, waiting 2)."""

    async def handler(message: Message, connection: Any, attempt: int) -> None:
        if message.id == "held-1":
            raise RuntimeError("the mail server said no")

    batch = [Message(id=f"held-{n}", topic="users", payload=b"{}", key="u-7") for n in (1, 2, 3)]
    outcomes = await consume(
        store,
        consumer,
        batch,
        handler,
        on_failure=lambda message, attempts, error: ConsumeFailure(str(error), 600),
        retention_seconds=60,
    )
    assert outcomes == ["retrying", "waiting", "waiting"]


async def run_outboxer(*args: str, **env: str) -> tuple[int | None, str, str]:
    """Run the ``outboxer`` command with only the given ``OUTBOXER_*`` variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXER_")}
    process = await asyncio.create_subprocess_exec(
        OUTBOXER,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=clean | env,
        cwd=ROOT,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode, stdout.decode(), stderr.decode()


async def snapshot(store: Store) -> tuple[int, int, int, list[str]]:
    """What a refused request must leave untouched."""
    stats = await store.stats()
    page = await store.list_dead_letters(_everything(), limit=1000, cursor=None)
    return stats.pending, stats.in_flight, stats.dead_letters, [d.id for d in page.items]


def _everything() -> Any:
    from outboxer.ports import DeadLetterFilter

    return DeadLetterFilter()


def assert_problem(response: httpx.Response, status: int) -> Any:
    """A 4xx/5xx with a JSON ``{"detail": …}`` body and no stack trace."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"detail"} and body["detail"], body
    assert "Traceback" not in response.text
    return body["detail"]


# -- reading -------------------------------------------------------------------------------------


async def test_list_shows_dead_letters_newest_first_in_the_contract_shape(
    admin: Client, make_dead: MakeDead
) -> None:
    first = await make_dead("orders", 1, key="o-1")
    second = await make_dead("payments", 1, type="PaymentTaken", key="p-1")
    response = await admin.get("/api/deadletters")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"items", "next_cursor"} and body["next_cursor"] is None
    assert [d["id"] for d in body["items"]] == second + first
    item = body["items"][1]
    assert set(item) >= {
        "id",
        "topic",
        "key",
        "type",
        "payload",
        "headers",
        "created_at",
        "dead_lettered_at",
        "failure_reason",
        "attempts",
        "direction",
    }
    assert (item["topic"], item["key"], item["type"]) == ("orders", "o-1", "OrderCreated")
    assert item["payload"] == {"order": 0, "topic": "orders"}
    assert item["headers"] == {"trace": "t0"}
    assert item["failure_reason"] == f"rejected by broker: {first[0]}"
    assert (item["attempts"], item["direction"]) == (1, "publish")
    assert dt.datetime.fromisoformat(item["dead_lettered_at"]) >= dt.datetime.fromisoformat(
        item["created_at"]
    )


async def test_pagination_visits_every_dead_letter_exactly_once(
    admin: Client, make_dead: MakeDead
) -> None:
    ids = await make_dead("orders", 7)
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 3}
        if cursor:
            params["cursor"] = cursor
        body = (await admin.get("/api/deadletters", params=params)).json()
        assert len(body["items"]) <= 3
        seen += [d["id"] for d in body["items"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
    times = [(await admin.get(f"/api/deadletters/{i}")).json()["dead_lettered_at"] for i in seen]
    assert times == sorted(times, reverse=True)  # newest first across pages


async def test_filters_by_topic_type_and_key(admin: Client, make_dead: MakeDead) -> None:
    orders = await make_dead("orders", 3, type="OrderCreated", key=lambda i: f"o{i}")
    payments = await make_dead("payments", 2, type="PaymentTaken", key=lambda i: f"p{i}")

    async def ids(**params: str) -> set[str]:
        response = await admin.get("/api/deadletters", params=params)
        assert response.status_code == 200, response.text
        return {d["id"] for d in response.json()["items"]}

    assert await ids(topic="orders") == set(orders)
    assert await ids(type="PaymentTaken") == set(payments)
    assert await ids(key="o1") == {orders[1]}
    assert await ids(topic="orders", key="p0") == set()
    assert await ids(topic="nowhere") == set()


async def test_show_one_dead_letter(admin: Client, make_dead: MakeDead) -> None:
    (dead_id,) = await make_dead("orders", 1, key="o-9")
    response = await admin.get(f"/api/deadletters/{dead_id}")
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == dead_id and body["key"] == "o-9"
    assert body["payload"] == {"order": 0, "topic": "orders"}
    assert body["failure_reason"].startswith("rejected by broker") and body["attempts"] == 1


async def test_an_id_with_a_publish_and_a_consume_dead_letter_shows_either_and_replays_both(
    admin: Client, make_dead: MakeDead, pg_store: PostgresStore
) -> None:
    """A service consuming what it publishes can fail on one id both ways: both are listed,
    ``direction`` chooses which one ``GET`` shows (the newer without it) and narrows lists and
    bulk actions; replaying the id replays whatever it names, each its own way."""
    (dead_id,) = await make_dead("orders", 1)
    await give_up_on(pg_store, dead_id)
    listed = (await admin.get("/api/deadletters")).json()["items"]
    assert [(d["id"], d["direction"]) for d in listed] == [
        (dead_id, "consume"),
        (dead_id, "publish"),
    ]
    assert (await admin.get(f"/api/deadletters/{dead_id}")).json()["direction"] == "consume"
    for direction in ("publish", "consume"):
        response = await admin.get(f"/api/deadletters/{dead_id}", params={"direction": direction})
        assert response.status_code == 200 and response.json()["direction"] == direction
    before = await snapshot(pg_store)
    bad = await admin.get(f"/api/deadletters/{dead_id}", params={"direction": "both"})
    assert "direction" in json.dumps(assert_problem(bad, 422))
    missing = await admin.get("/api/deadletters/nope", params={"direction": "consume"})
    assert "no consume dead letter with id 'nope'" in assert_problem(missing, 404)
    assert await snapshot(pg_store) == before

    # Lists and bulk actions narrow by direction.
    listed = await admin.get("/api/deadletters", params={"direction": "publish"})
    assert [(d["id"], d["direction"]) for d in listed.json()["items"]] == [(dead_id, "publish")]
    assert_problem(await admin.get("/api/deadletters", params={"direction": "both"}), 422)
    body = {"ids": [dead_id], "direction": "consume"}
    response = await admin.post("/api/deadletters/replay", json=body)
    assert response.json() == {"replayed": [dead_id], "count": 1, "not_found": [], "skipped": []}
    stats = await pg_store.stats()
    assert (stats.pending, stats.dead_letters) == (0, 1)  # re-driven to the consumer only
    assert [(f.retrying, f.waiting) for f in stats.consume_failures] == [(0, 1)]

    response = await admin.post(f"/api/deadletters/{dead_id}/replay")  # what is left of the id
    assert response.status_code == 200
    assert response.json() == {"replayed": [dead_id], "count": 1, "not_found": [], "skipped": []}
    stats = await pg_store.stats()
    assert (stats.pending, stats.dead_letters) == (1, 0)  # back in the outbox


async def test_a_bulk_by_ids_and_direction_is_all_or_nothing(
    admin: Client, make_dead: MakeDead, pg_store: PostgresStore
) -> None:
    """Found by a probe: with ``direction``, an id with no dead letter of that direction (but
    one of the other) passed the "all must exist" check, and the others were acted on."""
    first, second = await make_dead("orders", 2)
    await give_up_on(pg_store, first)
    before = await snapshot(pg_store)
    for verb in ("replay", "purge"):
        body = {"ids": [first, second], "direction": "consume"}
        response = await admin.post(f"/api/deadletters/{verb}", json=body)
        assert f"no consume dead letter with id {second!r}" in assert_problem(response, 404)
    assert await snapshot(pg_store) == before
    body = {"ids": [first], "direction": "consume"}
    response = await admin.post("/api/deadletters/purge", json=body)
    assert response.json() == {"purged": [first], "count": 1, "not_found": []}


async def test_a_hostile_json_payload_is_shown_as_base64_and_the_list_still_answers(
    admin: Client, pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    """Found by a probe: one consume dead letter whose JSON payload nests 100,000 deep made
    the list (API, dashboard, ``dlq list --json``) fail with a RecursionError, and ``NaN`` in
    a payload came out as ``NaN`` in ``--json`` (not JSON) and ``null`` in the API."""
    deep = b"[" * 100_000 + b"]" * 100_000
    constants = b"[NaN, Infinity, -Infinity]"
    huge = b'{"amount": 1e400}'  # valid JSON, beyond a float: Infinity in --json, null here
    await give_up_on(pg_store, "deep-1", payload=deep)
    await give_up_on(pg_store, "nan-1", payload=constants)
    await give_up_on(pg_store, "huge-1", payload=huge)
    await give_up_on(pg_store, "fine-1", payload=b'{"order": [1, {"id": 2}]}')
    response = await admin.get("/api/deadletters")
    assert response.status_code == 200, response.text
    shown = {item["id"]: item["payload"] for item in response.json()["items"]}
    assert shown == {
        "deep-1": {"base64": base64.b64encode(deep).decode()},
        "nan-1": {"base64": base64.b64encode(constants).decode()},
        "huge-1": {"base64": base64.b64encode(huge).decode()},
        "fine-1": {"order": [1, {"id": 2}]},
    }
    assert (await admin.get("/api/deadletters/deep-1")).status_code == 200
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXER_")}
    for command in (["list"], ["show", "nan-1"], ["show", "deep-1"], ["show", "huge-1"]):
        result = await asyncio.to_thread(
            subprocess.run,
            [OUTBOXER, "dlq", *command, "--database-url", pg_url, "--schema", pg_schema, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "PYTHONPATH": PYTHONPATH},
        )
        assert result.returncode == 0, result.stderr
        json.loads(result.stdout, parse_constant=lambda name: pytest.fail(f"{name} in JSON"))


async def test_an_id_with_a_slash_can_be_shown_replayed_and_deleted(
    admin: Client, pg_store: PostgresStore
) -> None:
    """Ids are any text (``orders/42``); the routes took one path segment, so the dashboard's
    buttons and the API answered 404 for such a dead letter (a probe)."""
    for dead_id in ("orders/42", "a/b/replay"):
        await give_up_on(pg_store, dead_id)
    path = "/api/deadletters/" + quote("orders/42", safe="")
    shown = await admin.get(path)
    assert shown.status_code == 200 and shown.json()["id"] == "orders/42", shown.text
    response = await admin.post(path + "/replay", params={"direction": "consume"})
    assert response.json()["replayed"] == ["orders/42"], response.text
    path = "/api/deadletters/" + quote("a/b/replay", safe="")
    assert (await admin.get(path)).json()["id"] == "a/b/replay"
    response = await admin.delete(path)
    assert response.json() == {"purged": ["a/b/replay"], "count": 1, "not_found": []}
    assert (await pg_store.stats()).dead_letters == 0


async def test_a_filtered_purge_on_a_terminal_acts_on_what_the_filter_selects(
    make_dead: MakeDead, pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    """On a terminal, ``dlq purge``/``replay`` show a progress bar and act on the ids the
    filter lists, chunk by chunk. Found by a probe: the chunks kept only the ids and the
    direction, so ``--topic orders`` also purged the id's consume dead letter of topic
    ``audit``, which a pipe (no progress bar) left alone."""
    (dead_id,) = await make_dead("orders", 1)
    await give_up_on(pg_store, dead_id, topic="audit")
    filtered = ["--topic", "orders", "--yes"]
    terminal, stderr = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXER_")}
    try:
        purge = await asyncio.to_thread(
            subprocess.run,
            [OUTBOXER, "dlq", "purge", "--database-url", pg_url, "--schema", pg_schema, *filtered],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            timeout=60,
            env={**env, "PYTHONPATH": PYTHONPATH},
        )
    finally:
        os.close(stderr)
        os.close(terminal)
    assert purge.returncode == 0 and "purged 1" in purge.stdout
    page = await pg_store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
    assert [(d.id, d.direction, d.topic) for d in page.items] == [(dead_id, "consume", "audit")]


async def test_an_id_back_in_the_outbox_with_both_dead_letters_is_replayed_whole_or_not_at_all(
    admin: Client, make_dead: MakeDead, pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    """Found by a probe: the id's consume dead letter was replayed, its publish one silently
    skipped (the application had written the id anew), and the answer was a plain 200; DELETE
    and replay of one dead letter ignored ``?direction=`` and acted on both."""
    (dead_id,) = await make_dead("orders", 1)
    await give_up_on(pg_store, dead_id)
    conn = await asyncpg.connect(pg_url)
    try:
        await Outbox(schema=pg_schema).enqueue_async(conn, "orders", {"anew": 1}, id=dead_id)
    finally:
        await conn.close()
    before = await snapshot(pg_store)
    refused = await admin.post(f"/api/deadletters/{dead_id}/replay")
    assert "in the outbox again" in assert_problem(refused, 409)
    assert await snapshot(pg_store) == before  # neither of the two replayed
    # The bulk form replays what it can and names what it skipped.
    response = await admin.post("/api/deadletters/replay", json={"ids": [dead_id]})
    assert response.json() == {
        "replayed": [dead_id],
        "count": 1,
        "not_found": [],
        "skipped": [dead_id],
    }
    page = await pg_store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
    assert [(d.id, d.direction) for d in page.items] == [(dead_id, "publish")]
    # One dead letter by direction: the consume one is gone, the publish one is deleted alone.
    missing = await admin.delete(f"/api/deadletters/{dead_id}", params={"direction": "consume"})
    assert "no consume dead letter" in assert_problem(missing, 404)
    await give_up_on(pg_store, dead_id, consumer="billing")  # another consumer gives up
    # A parameter given twice is refused, not taken for its last value (a probe).
    before = await snapshot(pg_store)
    twice = [("direction", "publish"), ("direction", "consume")]
    response = await admin.delete(f"/api/deadletters/{dead_id}", params=twice)
    assert "'direction' is given more than once" in assert_problem(response, 400)
    response = await admin.get("/api/deadletters", params=[("topic", "a"), ("topic", "b")])
    assert "'topic' is given more than once" in assert_problem(response, 400)
    body = b'{"topic": "nothing-here", "topic": "' + dead_id.encode() + b'", "ids": null}'
    for action in ("purge", "replay"):  # as in a query: the last value acted, 200 (a probe)
        response = await admin.post(
            f"/api/deadletters/{action}",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert "body field 'topic' is given more than once" in assert_problem(response, 400)
    assert await snapshot(pg_store) == before
    # A parameter the route does not take is refused on every route, not only on the lists:
    # a misspelt ?directon=consume deleted (or replayed) both dead letters of the id.
    misspelt = {"directon": "consume"}
    for response in (
        await admin.delete(f"/api/deadletters/{dead_id}", params=misspelt),
        await admin.post(f"/api/deadletters/{dead_id}/replay", params=misspelt),
        await admin.get(f"/api/deadletters/{dead_id}", params=misspelt),
        await admin.get("/api/stats", params={"x": "1"}),
    ):
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["msg"] == "unknown query parameter"
    # A body not sent as JSON (curl -d sends a form) is a 415 that says how to send it.
    form = {"content-type": "application/x-www-form-urlencoded"}
    response = await admin.post("/api/deadletters/purge", content=b'{"all": true}', headers=form)
    assert "Content-Type: application/json" in assert_problem(response, 415)
    assert await snapshot(pg_store) == before
    response = await admin.delete(f"/api/deadletters/{dead_id}", params={"direction": "publish"})
    assert response.json() == {"purged": [dead_id], "count": 1, "not_found": []}
    page = await pg_store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
    assert [(d.id, d.direction) for d in page.items] == [(dead_id, "consume")]
    response = await admin.post(f"/api/deadletters/{dead_id}/replay", params={"direction": "x"})
    assert_problem(response, 422)


async def test_stats_are_the_figures_of_the_cli(
    admin: Client, make_dead: MakeDead, pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    await make_dead("orders", 2)
    await hold_up_a_key(pg_store, "mailer")
    conn = await asyncpg.connect(pg_url)
    try:
        await Outbox(schema=pg_schema).enqueue_async(conn, "orders", {"n": 1})
    finally:
        await conn.close()
    api = (await admin.get("/api/stats")).json()
    code, stdout, _ = await run_outboxer(
        "stats", "--database-url", pg_url, "--schema", pg_schema, "--json"
    )
    assert code == 0
    figures = json.loads(stdout)
    assert set(api) == set(figures)
    for name in ("pending", "in_flight", "dead_letters", "relays", "last_sweep"):
        assert api[name] == figures[name], name
    assert (api["pending"], api["dead_letters"]) == (1, 2)
    assert api["oldest_pending_age_seconds"] >= 0
    # The inbox's failures, by consumer (their ages moved on between the two reads).
    for failing in (api["consume_failures"], figures["consume_failures"]):
        assert {name: (f["retrying"], f["waiting"]) for name, f in failing.items()} == {
            "mailer": (1, 2)
        }
        assert failing["mailer"]["oldest_age_seconds"] >= 0


async def test_openapi_schema_is_published_without_pages_loading_cdn_scripts(
    admin: Client,
) -> None:
    schema = (await admin.get("/openapi.json")).json()
    assert {
        "/api/deadletters",
        "/api/deadletters/{dead_letter_id}",
        "/api/deadletters/{dead_letter_id}/replay",
        "/api/deadletters/replay",
        "/api/stats",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= set(schema["paths"])
    assert set(schema["paths"]["/api/deadletters/{dead_letter_id}"]) == {"get", "delete"}
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    # Swagger UI and ReDoc load unpinned scripts from a CDN on the API's origin: off.
    for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert_problem(await admin.get(page), 404)


async def test_dashboard_is_served_with_its_assets_and_a_strict_policy(admin: Client) -> None:
    page = await admin.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    for asset in ("static/dashboard.js", "static/dashboard.css"):
        assert asset in page.text
        assert (await admin.get(f"/{asset}")).status_code == 200
    assert "cdn" not in page.text.lower() and "https://" not in page.text


# -- replay and delete ---------------------------------------------------------------------------


async def test_replay_one_moves_it_back_to_the_outbox_with_its_id_and_attempts_reset(
    admin: Client, make_dead: MakeDead, pg_store: PostgresStore
) -> None:
    target, other = await make_dead("orders", 2, key=lambda i: f"o{i}")
    before = await pg_store.stats()
    response = await admin.post(f"/api/deadletters/{target}/replay")
    assert response.status_code == 200, response.text
    assert response.json() == {"replayed": [target], "count": 1, "not_found": [], "skipped": []}
    after = await pg_store.stats()
    assert (after.pending, after.dead_letters) == (before.pending + 1, before.dead_letters - 1)
    claim = await pg_store.claim_batch(
        ClaimRequest(limit=10, lease_seconds=30, ordered=False, relay_id="r")
    )
    assert [(m.id, m.attempts, m.key) for m in claim.messages] == [(target, 0, "o0")]
    assert claim.messages[0].json() == {"order": 0, "topic": "orders"}
    assert (await admin.get(f"/api/deadletters/{target}")).status_code == 404
    assert (await admin.get(f"/api/deadletters/{other}")).status_code == 200


async def test_replay_of_a_dead_letter_whose_id_is_back_in_the_outbox_is_a_conflict(
    admin: Client, make_dead: MakeDead, pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    [dead_id] = await make_dead("orders", 1)
    conn = await asyncpg.connect(pg_url)
    try:  # the application writes the same id anew
        await Outbox(schema=pg_schema).enqueue_async(conn, "orders", {"again": 1}, id=dead_id)
    finally:
        await conn.close()
    response = await admin.post(f"/api/deadletters/{dead_id}/replay")
    assert response.status_code == 409, response.text
    assert "in the outbox again" in response.text and "no dead letter" not in response.text
    assert (await admin.get(f"/api/deadletters/{dead_id}")).status_code == 200  # still there
    assert (await admin.post("/api/deadletters/nope/replay")).status_code == 404


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"topic": "orders"}, "orders"),
        ({"type": "OrderCreated"}, "orders"),
        ({"key": "shared"}, "orders"),
        ({"all": True}, "all"),
    ],
)
async def test_bulk_replay_by_filter(
    admin: Client, make_dead: MakeDead, pg_store: PostgresStore, body: Any, expected: str
) -> None:
    orders = await make_dead("orders", 3, type="OrderCreated", key="shared")
    payments = await make_dead("payments", 2, type="PaymentTaken", key="other")
    response = await admin.post("/api/deadletters/replay", json=body)
    assert response.status_code == 200, response.text
    want = orders if expected == "orders" else orders + payments
    assert sorted(response.json()["replayed"]) == sorted(want)
    assert response.json()["count"] == len(want)
    stats = await pg_store.stats()
    assert (stats.pending, stats.dead_letters) == (len(want), 5 - len(want))
    claim = await pg_store.claim_batch(
        ClaimRequest(limit=100, lease_seconds=30, ordered=False, relay_id="r")
    )
    assert sorted(m.id for m in claim.messages) == sorted(want)
    assert {m.attempts for m in claim.messages} == {0}


async def test_bulk_replay_by_ids(
    admin: Client, make_dead: MakeDead, pg_store: PostgresStore
) -> None:
    ids = await make_dead("orders", 4)
    chosen = [ids[0], ids[2]]
    response = await admin.post("/api/deadletters/replay", json={"ids": [*chosen, ids[0]]})
    assert response.status_code == 200, response.text
    assert sorted(response.json()["replayed"]) == sorted(chosen)
    assert (await pg_store.stats()).dead_letters == 2
    remaining = (await admin.get("/api/deadletters")).json()["items"]
    assert sorted(d["id"] for d in remaining) == sorted([ids[1], ids[3]])


async def test_bulk_replay_with_an_unknown_id_replays_nothing(
    admin: Client, make_dead: MakeDead, pg_store: PostgresStore
) -> None:
    ids = await make_dead("orders", 2)
    before = await snapshot(pg_store)
    response = await admin.post("/api/deadletters/replay", json={"ids": [ids[0], "no-such-id"]})
    assert "no-such-id" in assert_problem(response, 404)
    assert await snapshot(pg_store) == before


async def test_delete_one_and_purge_by_filter(
    admin: Client, make_dead: MakeDead, pg_store: PostgresStore
) -> None:
    orders = await make_dead("orders", 3)
    payments = await make_dead("payments", 2, type="PaymentTaken")
    response = await admin.delete(f"/api/deadletters/{orders[0]}")
    assert response.status_code == 200
    assert response.json() == {"purged": [orders[0]], "count": 1, "not_found": []}
    assert (await admin.get(f"/api/deadletters/{orders[0]}")).status_code == 404
    assert_problem(await admin.delete(f"/api/deadletters/{orders[0]}"), 404)
    purged = await admin.post("/api/deadletters/purge", json={"topic": "payments"})
    assert purged.status_code == 200 and sorted(purged.json()["purged"]) == sorted(payments)
    stats = await pg_store.stats()
    assert (stats.pending, stats.dead_letters) == (0, 2)  # deleted, not replayed


# -- authorization -------------------------------------------------------------------------------


async def test_with_a_token_every_api_request_needs_it(
    pg_store: PostgresStore, make_dead: MakeDead
) -> None:
    (dead_id,) = await make_dead("orders", 1)
    before = await snapshot(pg_store)
    requests = [
        ("GET", "/api/deadletters", None),
        ("GET", f"/api/deadletters/{dead_id}", None),
        ("GET", "/api/stats", None),
        ("POST", f"/api/deadletters/{dead_id}/replay", None),
        ("POST", "/api/deadletters/replay", {"all": True}),
        ("POST", "/api/deadletters/purge", {"all": True}),
        ("DELETE", f"/api/deadletters/{dead_id}", None),
        ("POST", "/api/deadletters/replay", "{not json"),  # refused before it is even parsed
    ]
    async with client_for(create_app(pg_store, token=TOKEN)) as client:
        for headers in (
            {},
            {"Authorization": "Bearer wrong-token"},
            {"Authorization": f"Basic {TOKEN}"},
            {"Authorization": f"Bearer {TOKEN}x"},
            {"Authorization": TOKEN},
        ):
            for method, url, body in requests:
                kwargs: dict[str, Any] = {"headers": headers}
                if isinstance(body, str):
                    kwargs["content"] = body
                elif body is not None:
                    kwargs["json"] = body
                response = await client.request(method, url, **kwargs)
                assert_problem(response, 401)
                assert response.headers["www-authenticate"] == "Bearer"
        assert await snapshot(pg_store) == before
        for path in ("/healthz", "/metrics", "/openapi.json", "/"):
            assert (await client.get(path)).status_code == 200, path  # probes stay open
        for path in ("/healthz", "/readyz", "/"):  # curl -I, a load balancer's check
            assert (await client.head(path)).status_code in (200, 503), path
        ok = await client.get("/api/deadletters", headers=AUTH)
        assert ok.status_code == 200 and [d["id"] for d in ok.json()["items"]] == [dead_id]
        lower = await client.get("/api/stats", headers={"authorization": f"bearer {TOKEN}"})
        assert lower.status_code == 200  # the scheme is case-insensitive (RFC 7235)
        replay = await client.post(f"/api/deadletters/{dead_id}/replay", headers=AUTH)
        assert replay.status_code == 200
    assert (await pg_store.stats()).dead_letters == 0


async def test_without_a_token_reads_are_open_and_mutations_refused(
    pg_store: PostgresStore, make_dead: MakeDead, caplog: pytest.LogCaptureFixture
) -> None:
    (dead_id,) = await make_dead("orders", 1)
    before = await snapshot(pg_store)
    app = create_app(pg_store, token=None)
    with caplog.at_level(logging.WARNING, logger="outboxer.admin"):
        async with app.router.lifespan_context(app), client_for(app) as client:
            assert (await client.get("/api/deadletters")).status_code == 200
            assert (await client.get(f"/api/deadletters/{dead_id}")).status_code == 200
            assert (await client.get("/api/stats")).status_code == 200
            for method, url, body in (
                ("POST", f"/api/deadletters/{dead_id}/replay", None),
                ("POST", "/api/deadletters/replay", {"ids": [dead_id]}),
                ("POST", "/api/deadletters/purge", {"ids": [dead_id]}),
                ("DELETE", f"/api/deadletters/{dead_id}", None),
            ):
                response = await client.request(method, url, json=body)
                assert "OUTBOXER_ADMIN_TOKEN" in assert_problem(response, 403)
                # A token the server does not have changes nothing either.
                response = await client.request(method, url, json=body, headers=AUTH)
                assert_problem(response, 403)
    assert await snapshot(pg_store) == before
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("NO ADMIN TOKEN" in r.getMessage() for r in warnings)


async def test_mounted_under_a_prefix_the_token_still_guards_the_api(
    pg_store: PostgresStore, make_dead: MakeDead
) -> None:
    from fastapi import FastAPI

    (dead_id,) = await make_dead("orders", 1)
    outer = FastAPI()
    outer.mount("/ops/outboxer", create_app(pg_store, token=TOKEN))
    async with client_for(outer) as client:
        assert_problem(await client.get("/ops/outboxer/api/stats"), 401)
        assert_problem(await client.post(f"/ops/outboxer/api/deadletters/{dead_id}/replay"), 401)
        ok = await client.get("/ops/outboxer/api/deadletters", headers=AUTH)
        assert ok.status_code == 200 and ok.json()["items"][0]["id"] == dead_id
        page = await client.get("/ops/outboxer/")
        assert page.status_code == 200 and "content-security-policy" in page.headers
    assert (await pg_store.stats()).dead_letters == 1


async def test_an_empty_token_counts_as_no_token(pg_store: PostgresStore) -> None:
    async with client_for(create_app(pg_store, token="")) as client:
        assert (await client.get("/api/stats")).status_code == 200
        assert_problem(await client.post("/api/deadletters/replay", json={"all": True}), 403)


# -- bad input -----------------------------------------------------------------------------------

BAD_REQUESTS = [
    ("GET", "/api/deadletters?limit=0", None, 422),
    ("GET", "/api/deadletters?limit=-1", None, 422),
    ("GET", "/api/deadletters?limit=1001", None, 422),
    ("GET", "/api/deadletters?limit=ten", None, 422),
    ("GET", "/api/deadletters?cursor=abc", None, 422),
    ("GET", "/api/deadletters?cursor=-5", None, 422),
    ("GET", "/api/deadletters?cursor=99999999999999999999999", None, 422),
    ("GET", "/api/deadletters?topic=", None, 422),
    ("GET", "/api/deadletters?topc=orders", None, 422),  # a misspelt filter
    ("GET", "/api/deadletters?topic=a%00b", None, 422),
    ("GET", "/api/deadletters/no-such-id", None, 404),
    ("GET", "/api/deadletters/a%00b", None, 422),
    ("POST", "/api/deadletters/no-such-id/replay", None, 404),
    ("DELETE", "/api/deadletters/no-such-id", None, 404),
    ("POST", "/api/deadletters/replay", b"", 422),
    ("POST", "/api/deadletters/replay", b"{not json", 422),
    ("POST", "/api/deadletters/replay", b"[]", 422),
    ("POST", "/api/deadletters/replay", b"{}", 422),  # replaying everything must be explicit
    ("POST", "/api/deadletters/replay", b'{"all": false}', 422),
    ("POST", "/api/deadletters/replay", b'{"all": "yes please"}', 422),
    # Strict booleans: lax parsing would read each of these as "replay everything".
    ("POST", "/api/deadletters/replay", b'{"all": "yes"}', 422),
    ("POST", "/api/deadletters/replay", b'{"all": 1}', 422),
    ("POST", "/api/deadletters/replay", b'{"all": "on"}', 422),
    ("POST", "/api/deadletters/replay", b'{"all": "true"}', 422),
    ("POST", "/api/deadletters/purge", b'{"all": "yes"}', 422),
    ("POST", "/api/deadletters/purge", b'{"all": 1}', 422),
    ("POST", "/api/deadletters/purge", b'{"all": "on"}', 422),
    ("POST", "/api/deadletters/replay", b'{"topik": "orders"}', 422),
    ("POST", "/api/deadletters/replay", b'{"topic": "orders", "all": true}', 422),
    ("POST", "/api/deadletters/replay", b'{"ids": []}', 422),
    ("POST", "/api/deadletters/replay", b'{"ids": "abc"}', 422),
    ("POST", "/api/deadletters/replay", b'{"ids": [1, 2]}', 422),
    ("POST", "/api/deadletters/replay", b'{"ids": ["a\\u0000b"]}', 422),
    ("POST", "/api/deadletters/replay", b'{"ids": ["\\ud800"]}', 422),
    ("POST", "/api/deadletters/replay", b'{"ids": ["no-such-id"]}', 404),
    ("POST", "/api/deadletters/replay", b'{"topic": ""}', 422),
    ("POST", "/api/deadletters/replay", b'{"topic": "\xe9t\xe9"}', 422),  # not UTF-8
    ("POST", "/api/deadletters/purge", b"{}", 422),
    ("POST", "/api/deadletters/purge", b'{"key": null}', 422),
    ("POST", "/api/deadletters/replay", b'{"direction": "both"}', 422),
    ("POST", "/api/deadletters/purge", b'{"direction": null}', 422),
    ("POST", "/api/deadletters/purge", b'{"direction": "consume", "ids": []}', 422),
    ("GET", "/api/deadletters?direction=Publish", None, 422),
    ("GET", "/api/deadletters/no-such-id?direction=consume", None, 404),
    ("PUT", "/api/stats", None, 405),
    ("GET", "/api/nothing-here", None, 404),
]


@pytest.mark.parametrize(("method", "url", "body", "status"), BAD_REQUESTS)
async def test_bad_input_gets_a_json_4xx_and_changes_nothing(
    admin: Client,
    make_dead: MakeDead,
    pg_store: PostgresStore,
    method: str,
    url: str,
    body: bytes | None,
    status: int,
) -> None:
    await make_dead("orders", 2)
    before = await snapshot(pg_store)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    response = await admin.request(method, url, content=body, headers=headers)
    assert_problem(response, status)
    assert await snapshot(pg_store) == before


async def test_field_errors_name_the_field(admin: Client) -> None:
    detail = assert_problem(await admin.get("/api/deadletters", params={"limit": 0}), 422)
    assert detail[0]["loc"] == ["query", "limit"] and "1" in detail[0]["msg"]
    detail = assert_problem(await admin.post("/api/deadletters/replay", json={"x": 1}), 422)
    assert detail[0]["loc"] == ["body", "x"]
    detail = assert_problem(await admin.post("/api/deadletters/replay", json={}), 422)
    assert '"all": true' in detail[0]["msg"]
    latin1 = await admin.post(
        "/api/deadletters/replay", content='{"topic": "été"}'.encode("latin-1"), headers=JSON_TYPE
    )  # the shape of any malformed JSON, not FastAPI's bare 400
    assert assert_problem(latin1, 422) == [
        {"loc": ["body"], "msg": "JSON decode error: the body is not UTF-8", "type": "json_invalid"}
    ]


class _BrokenStore(InMemoryStore):
    """A store whose database is gone, or whose code fails unexpectedly."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    async def stats(self) -> OutboxStats:
        raise self.error

    async def list_dead_letters(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error


async def test_store_failures_are_json_errors_never_stack_traces(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unavailable = _BrokenStore(StoreUnavailable("PostgreSQL unavailable: connection refused"))
    async with client_for(create_app(unavailable, token=TOKEN)) as client:
        client.headers.update(AUTH)
        detail = assert_problem(await client.get("/api/stats"), 503)
        assert "connection refused" in detail
        assert_problem(await client.get("/api/deadletters"), 503)
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200 and "outboxer_database_up 0.0" in metrics.text
    broken = _BrokenStore(RuntimeError("secret internals"))
    with caplog.at_level(logging.ERROR, logger="outboxer.admin"):
        async with client_for(create_app(broken, token=TOKEN), raise_app_exceptions=False) as c:
            response = await c.get("/api/deadletters", headers=AUTH)
    detail = assert_problem(response, 500)
    assert "secret" not in detail
    assert any("secret internals" in str(r.exc_info) for r in caplog.records)  # logged


# -- messages not yet published -----------------------------------------------------------------


async def test_messages_show_their_state_attempts_error_and_relay(
    pg_store: PostgresStore, write: MakeDead, make_dead: MakeDead
) -> None:
    """Read-only and open without a token, like the other reads."""
    await make_dead("orders", 1, key="o-7")
    [retrying, leased] = await write("payments", 2, type="PaymentTaken", key=lambda i: f"p{i}")
    claim = await pg_store.claim_batch(
        ClaimRequest(limit=10, lease_seconds=30, ordered=False, relay_id="r-1")
    )
    assert {m.id for m in claim.messages} == {retrying, leased}
    await pg_store.settle(claim, Settlement(retries=[Retry(retrying, 600, "broker said 503")]))
    [held] = await write("orders", 1, key="o-7")  # behind the dead letter of its key
    [scheduled] = await write("orders", 1, available_at=dt.timedelta(hours=2))
    [pending] = await write("mail", 1, type=None)

    async with client_for(create_app(pg_store, token=None)) as client:
        listed = await client.get("/api/messages")
        one = await client.get(f"/api/messages/{retrying}")
        by_state = {
            state: (await client.get("/api/messages", params={"state": state})).json()
            for state in ("pending", "scheduled", "retrying", "in_flight", "held")
        }
        by_filter = await client.get("/api/messages", params={"topic": "orders", "key": "o-7"})
        assert_problem(await client.post("/api/messages"), 403)  # no writes without a token
    assert listed.status_code == 200
    body = listed.json()
    assert set(body) == {"items", "next_cursor"} and body["next_cursor"] is None
    assert [(m["id"], m["state"]) for m in body["items"]] == [
        (retrying, "retrying"),
        (leased, "in_flight"),
        (held, "held"),
        (scheduled, "scheduled"),
        (pending, "pending"),
    ]
    assert {s: [m["id"] for m in page["items"]] for s, page in by_state.items()} == {
        "pending": [pending],
        "scheduled": [scheduled],
        "retrying": [retrying],
        "in_flight": [leased],
        "held": [held],
    }
    assert [m["id"] for m in by_filter.json()["items"]] == [held]
    shown = one.json()
    assert (shown["state"], shown["attempts"], shown["last_error"]) == (
        "retrying",
        1,
        "broker said 503",
    )
    assert dt.datetime.fromisoformat(shown["next_attempt_at"]) > dt.datetime.now(
        dt.UTC
    ) + dt.timedelta(seconds=500)
    assert shown["payload"] == {"order": 0, "topic": "payments"}
    assert shown["headers"] == {"trace": "t0"} and shown["type"] == "PaymentTaken"
    in_flight = by_state["in_flight"]["items"][0]
    assert in_flight["relay"] == "r-1" and in_flight["lease_expires_at"] is not None


async def test_messages_page_oldest_first_each_exactly_once(admin: Client, write: MakeDead) -> None:
    ids = await write("orders", 7, key=lambda i: f"k{i % 2}")
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        params: dict[str, Any] = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        page = (await admin.get("/api/messages", params=params)).json()
        seen += [m["id"] for m in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids
    keyed = (await admin.get("/api/messages", params={"key": "k1", "limit": 2})).json()
    assert [m["id"] for m in keyed["items"]] == ids[1:5:2] and keyed["next_cursor"]
    rest = await admin.get("/api/messages", params={"key": "k1", "cursor": keyed["next_cursor"]})
    assert [m["id"] for m in rest.json()["items"]] == [ids[5]]


@pytest.mark.parametrize(
    ("url", "status"),
    [
        ("/api/messages/no-such-id", 404),
        ("/api/messages/a%00b", 422),
        ("/api/messages?state=stuck", 422),
        ("/api/messages?state=", 422),
        ("/api/messages?limit=0", 422),
        ("/api/messages?limit=1001", 422),
        ("/api/messages?cursor=abc", 422),
        ("/api/messages?cursor=99999999999999999999999", 422),
        ("/api/messages?topic=", 422),
        ("/api/messages?topic=a%00b", 422),
        ("/api/messages?stat=pending", 422),  # a misspelt filter
    ],
)
async def test_bad_message_requests_get_a_json_4xx(admin: Client, url: str, status: int) -> None:
    detail = assert_problem(await admin.get(url), status)
    if status == 404:
        assert "no-such-id" in detail


async def test_a_published_message_is_gone_from_the_list(
    admin: Client, pg_store: PostgresStore, write: MakeDead
) -> None:
    [message_id] = await write("orders", 1)
    claim = await pg_store.claim_batch(
        ClaimRequest(limit=10, lease_seconds=30, ordered=False, relay_id="r")
    )
    await pg_store.settle(claim, Settlement(published=[message_id]))
    assert (await admin.get("/api/messages")).json()["items"] == []
    assert message_id in assert_problem(await admin.get(f"/api/messages/{message_id}"), 404)


# -- hostile requests ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8080", "localhost.evil.example", "", "[::1", "a:b"]
)
async def test_a_host_the_server_is_not_named_is_refused(
    pg_store: PostgresStore, host: str
) -> None:
    """DNS rebinding: a page of evil.example that resolves to 127.0.0.1 reaches a tokenless
    server, but its requests say ``Host: evil.example``."""
    async with client_for(create_app(pg_store, token=None)) as client:
        for path in ("/api/stats", "/api/deadletters", "/", "/readyz", "/openapi.json"):
            detail = assert_problem(await client.get(path, headers={"Host": host}), 400)
            assert "--allowed-host" in detail


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST:8080", "127.0.0.1:9", "[::1]:8080", "10.1.2.3", "admin.ops"]
)
async def test_the_server_answers_to_its_own_names_and_addresses(
    pg_store: PostgresStore, host: str
) -> None:
    app = create_app(pg_store, token=None, allowed_hosts=["admin.ops"])
    async with client_for(app) as client:
        response = await client.get("/api/stats", headers={"Host": host})
    assert response.status_code == 200, response.text


async def test_allowed_hosts_accept_a_domain_or_anything() -> None:
    store = InMemoryStore()
    async with client_for(create_app(store, token=None, allowed_hosts=[".ops.example"])) as c:
        for host, status in [("ops.example", 200), ("a.ops.example", 200), ("xops.example", 400)]:
            assert (await c.get("/healthz", headers={"Host": host})).status_code == status, host
    async with client_for(create_app(store, token=None, allowed_hosts=["*"])) as c:
        assert (await c.get("/healthz", headers={"Host": "any.where"})).status_code == 200


async def test_a_body_over_the_limit_is_refused_with_413(
    admin: Client, make_dead: MakeDead, pg_store: PostgresStore
) -> None:
    await make_dead("orders", 1)
    before = await snapshot(pg_store)
    big = json.dumps({"ids": ["x" * 900] * 1200}).encode()  # ~1.1 MB
    assert len(big) > 1024 * 1024
    detail = assert_problem(
        await admin.post("/api/deadletters/replay", content=big, headers=JSON_TYPE), 413
    )
    assert "1048576 bytes" in detail

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        for start in range(0, len(big), 64 * 1024):
            yield big[start : start + 64 * 1024]

    response = await admin.post("/api/deadletters/purge", content=chunked(), headers=JSON_TYPE)
    assert_problem(response, 413)
    assert await snapshot(pg_store) == before


async def test_a_body_that_never_finishes_arriving_times_out_with_408(
    pg_store: PostgresStore,
) -> None:
    stalled = asyncio.Event()  # never set: the client sends a first chunk, then nothing

    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"all": '
        await stalled.wait()

    app = create_app(pg_store, token=TOKEN, body_timeout=0.3)
    async with client_for(app) as client:
        client.headers.update(AUTH)
        response = await asyncio.wait_for(
            client.post("/api/deadletters/purge", content=trickle(), headers=JSON_TYPE), 10
        )
    assert "0.3s" in assert_problem(response, 408)


@pytest.mark.parametrize("token", [" " + TOKEN, TOKEN + "\n", "\t" + TOKEN + " "])
def test_a_token_with_surrounding_whitespace_is_refused_at_start(token: str) -> None:
    with pytest.raises(ConfigurationError, match="whitespace"):
        create_app(InMemoryStore(), token=token)


@pytest.mark.parametrize("token", [TOKEN[:8] + "\n" + TOKEN[8:], TOKEN + "\x00x", TOKEN + "é"])
def test_a_token_no_header_can_carry_is_refused_at_start(token: str) -> None:
    """Found by a probe: a token with a newline inside started a server whose every /api/
    request was 401 (a header cannot carry it)."""
    with pytest.raises(ConfigurationError, match="control or non-ASCII"):
        create_app(InMemoryStore(), token=token)


async def test_serve_refuses_a_token_with_whitespace_in_one_line(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    code, _, stderr = await run_outboxer(
        *("serve", "--database-url", pg_url, "--schema", pg_schema, "--port", "0"),
        OUTBOXER_ADMIN_TOKEN=TOKEN + " ",
    )
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "whitespace" in lines[0] and TOKEN not in lines[0], lines


async def test_a_lone_surrogate_in_a_stored_header_is_escaped_not_a_500(
    sqlite_store: SqliteStore,
) -> None:
    """PostgreSQL refuses such text, but a SQLite row (JSON text) can hold it."""
    await sqlite_store.execute(
        "INSERT INTO {dead_letters} (id, topic, payload, content_type,"
        " headers, created_at, failure_reason, attempts)"
        " VALUES ('odd-1', 'orders', x'7B7D', 'application/json', ?, 0, 'rejected', 3)",
        '{"trace": "a\\ud800b"}',
    )
    await sqlite_store.execute(
        "INSERT INTO {outbox} (id, topic, payload, headers) VALUES ('odd-2', 'orders', x'7B7D', ?)",
        '{"trace": "a\\ud800b"}',
    )
    async with client_for(create_app(sqlite_store, token=None)) as client:
        for path in ("/api/deadletters", "/api/messages"):
            listed = await client.get(path)
            assert listed.status_code == 200, listed.text
            assert listed.json()["items"][0]["headers"] == {"trace": "a\\ud800b"}
        for path in ("/api/deadletters/odd-1", "/api/messages/odd-2"):
            shown = await client.get(path)
            assert shown.status_code == 200, shown.text
            assert shown.json()["headers"] == {"trace": "a\\ud800b"}


async def test_readiness_does_not_reveal_the_database_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "connection to postgresql://app:hunter2@db.internal:5432/app failed: no route"
    store = _BrokenStore(StoreUnavailable(secret))
    with caplog.at_level(logging.WARNING, logger="outboxer.admin"):
        async with client_for(create_app(store, token=None, ready_min_relays=0)) as client:
            response = await client.get("/readyz")
    assert response.status_code == 503
    assert "db.internal" not in response.text and "hunter2" not in response.text
    assert "unreachable" in response.json()["checks"]["database"]["detail"]
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "db.internal" in logged and "hunter2" not in logged  # the detail, redacted


# -- readiness -----------------------------------------------------------------------------------


async def test_not_ready_without_a_live_relay_then_ready_with_one(
    pg_store: PostgresStore,
) -> None:
    async with client_for(create_app(pg_store, token=TOKEN)) as client:
        response = await client.get("/readyz")
        assert response.status_code == 503
        body = response.json()
        assert body["ready"] is False
        assert body["checks"]["database"]["ok"] is True
        assert body["checks"]["relays"]["ok"] is False and body["checks"]["relays"]["live"] == 0
        assert "0 live relay" in body["checks"]["relays"]["detail"]
        assert body["checks"]["lag"]["ok"] is True
        now = dt.datetime.now(dt.UTC)
        await pg_store.heartbeat(RelayInfo("relay-1", "host", 42, now, now))
        response = await client.get("/readyz")
        assert response.status_code == 200, response.text
        assert response.json()["ready"] is True
        assert all(check["ok"] for check in response.json()["checks"].values())


async def test_not_ready_when_the_oldest_pending_message_is_too_old(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    now = dt.datetime.now(dt.UTC)
    await pg_store.heartbeat(RelayInfo("relay-1", "host", 42, now, now))
    conn = await asyncpg.connect(pg_url)
    try:
        await Outbox(schema=pg_schema).enqueue_async(conn, "orders", {"n": 1})
    finally:
        await conn.close()
    await asyncio.sleep(0.3)
    async with client_for(create_app(pg_store, token=TOKEN, ready_max_age=0.2)) as client:
        response = await client.get("/readyz")
    assert response.status_code == 503
    lag = response.json()["checks"]["lag"]
    assert lag["ok"] is False and lag["max_age_seconds"] == 0.2
    assert lag["oldest_pending_age_seconds"] > 0.2 and "limit 0.2s" in lag["detail"]
    assert response.json()["checks"]["relays"]["ok"] is True


async def test_not_ready_when_the_database_is_unreachable() -> None:
    store = PostgresStore("postgresql://postgres@127.0.0.1:1/test")  # never opened: unusable
    async with client_for(create_app(store, token=TOKEN, ready_min_relays=0)) as client:
        response = await client.get("/readyz")
        assert (await client.get("/healthz")).json() == {"status": "ok"}  # still alive
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["database"]["ok"] is False and "unreachable" in checks["database"]["detail"]
    assert checks["relays"]["ok"] is False and checks["lag"]["ok"] is False


async def test_readiness_without_a_relay_requirement(pg_store: PostgresStore) -> None:
    async with client_for(create_app(pg_store, token=None, ready_min_relays=0)) as client:
        response = await client.get("/readyz")
    assert response.status_code == 200 and response.json()["ready"] is True


def test_invalid_settings_are_refused_at_once() -> None:
    with pytest.raises(ConfigurationError, match="ready_max_age"):
        create_app(InMemoryStore(), token=None, ready_max_age=0)
    with pytest.raises(ConfigurationError, match="ready_min_relays"):
        create_app(InMemoryStore(), token=None, ready_min_relays=-1)
    with pytest.raises(ConfigurationError, match="unsupported database URL"):
        create_app_from_url("mongodb://x", token=None)


# -- metrics -------------------------------------------------------------------------------------


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    values = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge", family.name
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


async def test_metrics_report_a_known_state(
    admin: Client, make_dead: MakeDead, pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    await make_dead("orders", 3)
    await hold_up_a_key(pg_store, "mailer")
    conn = await asyncpg.connect(pg_url)
    try:
        outbox = Outbox(schema=pg_schema)
        for n in range(4):
            await outbox.enqueue_async(conn, "orders", {"n": n})
    finally:
        await conn.close()
    now = dt.datetime.now(dt.UTC)
    await pg_store.heartbeat(RelayInfo("relay-a", "host", 7, now, now))
    deadline = asyncio.get_running_loop().time() + 10
    held: list[str] = []
    while not held:  # one message leased by relay-a
        assert asyncio.get_running_loop().time() < deadline
        claim = await pg_store.claim_batch(
            ClaimRequest(limit=1, lease_seconds=60, ordered=False, relay_id="relay-a")
        )
        held = [m.id for m in claim.messages]
    response = await admin.get("/metrics")  # no token needed, but sending one does no harm
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    values = parse_metrics(response.text)
    assert values[("outboxer_database_up", ())] == 1
    assert values[("outboxer_pending_messages", ())] == 3
    assert values[("outboxer_in_flight_messages", ())] == 1
    assert values[("outboxer_dead_letters", ())] == 3
    assert values[("outboxer_live_relays", ())] == 1
    assert values[("outboxer_relay_in_flight_messages", (("relay_id", "relay-a"),))] == 1
    heartbeat = values[("outboxer_relay_heartbeat_timestamp_seconds", (("relay_id", "relay-a"),))]
    assert abs(heartbeat - now.timestamp()) < 60
    stats = await pg_store.stats()
    age = values[("outboxer_oldest_pending_age_seconds", ())]
    assert stats.oldest_pending_age_seconds is not None
    assert 0 < age <= stats.oldest_pending_age_seconds
    mailer = (("consumer", "mailer"),)
    assert values[("outboxer_consume_failures", (*mailer, ("state", "retrying")))] == 1
    assert values[("outboxer_consume_failures", (*mailer, ("state", "waiting")))] == 2
    [held] = stats.consume_failures  # read after the scrape: older by then
    oldest = values[("outboxer_consume_failures_oldest_age_seconds", mailer)]
    assert 0 <= oldest <= held.oldest_age_seconds


async def test_metrics_of_an_empty_outbox(admin: Client) -> None:
    values = parse_metrics((await admin.get("/metrics")).text)
    assert not [name for name, _ in values if name.startswith("outboxer_consume_failures")]
    for name in (
        "outboxer_pending_messages",
        "outboxer_in_flight_messages",
        "outboxer_dead_letters",
        "outboxer_oldest_pending_age_seconds",
        "outboxer_live_relays",
    ):
        assert values[(name, ())] == 0, name


async def test_two_apps_in_one_process_report_their_own_store(
    admin: Client, make_dead: MakeDead
) -> None:
    """No global gauges: each app's scrape reads its own store."""
    await make_dead("orders", 2)
    memory = InMemoryStore()
    memory.enqueue("t", {"n": 1})
    async with client_for(create_app(memory, token=None)) as other:
        theirs = parse_metrics((await other.get("/metrics")).text)
    ours = parse_metrics((await admin.get("/metrics")).text)
    assert ours[("outboxer_dead_letters", ())] == 2 and ours[("outboxer_pending_messages", ())] == 0
    assert theirs[("outboxer_dead_letters", ())] == 0
    assert theirs[("outboxer_pending_messages", ())] == 1


def test_metrics_include_the_last_sweep_and_unowned_leases_when_reported() -> None:
    from types import SimpleNamespace

    from outboxer.admin.metrics import render_metrics

    figures = {
        "unowned_in_flight": 2,
        "last_sweep": {
            "started_at": "2026-01-02T03:04:05+00:00",
            "completed_at": "2026-01-02T03:04:06+00:00",
            "swept_by": "relay-1",
            "publish_retries": 3,
            "consume_failures": 1,
        },
    }
    stats = SimpleNamespace(
        pending=1,
        in_flight=0,
        dead_letters=0,
        oldest_pending_age_seconds=None,
        relays=[],
        to_json=lambda: figures,
    )
    values = parse_metrics(render_metrics(stats).decode())  # type: ignore[arg-type]
    completed = dt.datetime(2026, 1, 2, 3, 4, 6, tzinfo=dt.UTC).timestamp()
    assert values[("outboxer_last_sweep_completed_timestamp_seconds", ())] == completed
    assert values[("outboxer_last_sweep_started_timestamp_seconds", ())] == completed - 1
    assert values[("outboxer_last_sweep_publish_retries", ())] == 3
    assert values[("outboxer_last_sweep_consume_failures", ())] == 1
    assert values[("outboxer_unowned_in_flight_messages", ())] == 2
    assert values[("outboxer_oldest_pending_age_seconds", ())] == 0
    assert not any("swept_by" in name for name, _ in values)


# -- the app that owns its store -----------------------------------------------------------------


async def test_app_from_url_opens_and_closes_its_store(
    pg_store: PostgresStore, pg_url: str, pg_schema: str, make_dead: MakeDead
) -> None:
    (dead_id,) = await make_dead("orders", 1)
    app = create_app_from_url(pg_url, TableNames(schema=pg_schema), token=TOKEN)
    async with app.router.lifespan_context(app), client_for(app) as client:
        response = await client.post(f"/api/deadletters/{dead_id}/replay", headers=AUTH)
        assert response.status_code == 200
    assert (await pg_store.stats()).pending == 1
    with pytest.raises(RuntimeError, match="not open"):
        await app.state.store.stats()  # closed with the app


async def test_app_from_url_refuses_to_start_on_a_missing_schema(pg_url: str) -> None:
    from outboxer.errors import SchemaError

    app = create_app_from_url(pg_url, TableNames(schema="no_such_schema_x"), token=TOKEN)
    with pytest.raises(SchemaError, match="outboxer db upgrade"):
        async with app.router.lifespan_context(app):
            pass


async def test_the_api_on_mariadb(
    mysql_store: MysqlStore, mysql_url: str, mysql_database: str
) -> None:
    """The admin API over a ``mariadb://`` URL: stats, messages, dead letters listed, shown,
    replayed and purged, readiness."""
    outbox = Outbox(schema=mysql_database)
    conn = await mysql_connect(mysql_database)
    try:
        await conn.begin()
        ids = [
            await outbox.enqueue_async(conn, "orders", {"order": i}, key=f"k{i}", type="T")
            for i in range(3)
        ]
        await conn.commit()
    finally:
        conn.close()
    claim = await mysql_store.claim_batch(
        ClaimRequest(limit=2, lease_seconds=30, ordered=True, relay_id="r")
    )
    await mysql_store.settle(claim, Settlement(dead=[(i, f"rejected: {i}") for i in ids[:2]]))
    url = mysql_url.replace("mysql://", "mariadb://")
    app = create_app_from_url(url, TableNames(schema=mysql_database), token=TOKEN)
    async with app.router.lifespan_context(app), client_for(app) as client:
        client.headers.update(AUTH)
        stats = (await client.get("/api/stats")).json()
        assert (stats["pending"], stats["dead_letters"]) == (1, 2)
        messages = (await client.get("/api/messages")).json()
        assert [(m["id"], m["state"]) for m in messages["items"]] == [(ids[2], "pending")]
        page = (await client.get("/api/deadletters?limit=1")).json()
        assert [d["id"] for d in page["items"]] == [ids[1]] and page["next_cursor"]
        rest = (await client.get(f"/api/deadletters?cursor={page['next_cursor']}")).json()
        assert [d["id"] for d in rest["items"]] == [ids[0]] and rest["next_cursor"] is None
        shown = (await client.get(f"/api/deadletters/{ids[0]}")).json()
        assert (shown["key"], shown["attempts"], shown["payload"]) == ("k0", 1, {"order": 0})
        assert shown["failure_reason"] == f"rejected: {ids[0]}"
        replayed = await client.post(f"/api/deadletters/{ids[0]}/replay")
        assert replayed.json() == {
            "replayed": [ids[0]],
            "count": 1,
            "not_found": [],
            "skipped": [],
        }
        assert (await client.delete(f"/api/deadletters/{ids[1]}")).status_code == 200
        assert (await client.get(f"/api/deadletters/{ids[1]}")).status_code == 404
        assert (await client.get("/readyz")).status_code == 503  # no relay is running
    stats_after = await mysql_store.stats()
    assert (stats_after.pending, stats_after.dead_letters) == (2, 0)


async def test_large_payloads_page_by_bytes_and_bulk_ids_still_find_them(
    admin: Client, pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    """A page stops once its payloads reach PAGE_PAYLOAD_BYTES (4 MiB), short of ``limit``;
    following ``next_cursor`` still shows every item once, and a replay by ids of dead letters
    too large for one page finds them all."""
    blob = "x" * (3 * 512 * 1024)  # 1.5 MiB: the fourth row starts past the budget
    conn = await asyncpg.connect(pg_url)
    try:
        async with conn.transaction():
            outbox = Outbox(schema=pg_schema)
            ids = [
                await outbox.enqueue_async(conn, "big", {"n": n, "blob": blob}) for n in range(5)
            ]
    finally:
        await conn.close()

    async def walk(path: str) -> list[list[dict[str, Any]]]:
        pages, cursor = [], None
        while True:
            params: dict[str, Any] = {"limit": 1000} | ({"cursor": cursor} if cursor else {})
            body = (await admin.get(path, params=params)).json()
            assert set(body) == {"items", "next_cursor"} and body["items"]
            pages.append(body["items"])
            cursor = body["next_cursor"]
            if cursor is None:
                return pages

    pages = await walk("/api/messages")
    assert [len(p) for p in pages] == [3, 2]
    items = [m for p in pages for m in p]
    assert [m["id"] for m in items] == ids
    assert [m["payload"]["n"] for m in items] == list(range(5))
    assert all(m["payload"]["blob"] == blob for m in items)
    small = (await admin.get("/api/messages", params={"limit": 2})).json()
    assert [m["id"] for m in small["items"]] == ids[:2] and small["next_cursor"]

    claim = await pg_store.claim_batch(
        ClaimRequest(limit=10, lease_seconds=30, ordered=False, relay_id="r")
    )
    assert sorted(m.id for m in claim.messages) == sorted(ids)
    await pg_store.settle(claim, Settlement(dead=[(i, "too big") for i in ids]))
    pages = await walk("/api/deadletters")
    assert [len(p) for p in pages] == [3, 2]
    assert sorted(d["id"] for p in pages for d in p) == sorted(ids)
    replayed = await admin.post("/api/deadletters/replay", json={"ids": ids})
    assert replayed.status_code == 200, replayed.text
    assert replayed.json()["count"] == 5 and replayed.json()["not_found"] == []


async def test_operators_racing_on_the_same_dead_letters_on_mariadb(
    mysql_store: MysqlStore, mysql_database: str
) -> None:
    """Replays and purges of the same dead letters at once, one by one and in bulk. A probe got
    503s on MariaDB (InnoDB's deadlock victims, which are now run again): every operation
    answers, and each dead letter ends either back in the outbox, once, or gone."""
    outbox = Outbox(schema=mysql_database)
    conn = await mysql_connect(mysql_database)
    try:
        await conn.begin()
        ids = [await outbox.enqueue_async(conn, "orders", {"n": n}) for n in range(60)]
        await conn.commit()
    finally:
        conn.close()
    claim = await mysql_store.claim_batch(
        ClaimRequest(limit=100, lease_seconds=30, ordered=False, relay_id="r")
    )
    await mysql_store.settle(claim, Settlement(dead=[(i, "rejected") for i in ids]))
    operations: list[Awaitable[list[str]]] = []
    for n, dead_id in enumerate(ids):
        one = DeadLetterFilter(ids=[dead_id])
        operations += [mysql_store.replay_dead_letters(one), mysql_store.purge_dead_letters(one)]
        if n % 10 == 0:
            some = DeadLetterFilter(ids=ids[n : n + 10])
            operations += [
                mysql_store.replay_dead_letters(some),
                mysql_store.purge_dead_letters(some),
            ]
    random.Random(7).shuffle(operations)
    await asyncio.gather(*operations)  # none fails
    stats = await mysql_store.stats()
    assert stats.dead_letters == 0
    page = await mysql_store.list_messages(MessageFilter(), limit=1000, cursor=None)
    back = [m.id for m in page.items]
    assert len(back) == len(set(back)) and set(back) <= set(ids)
