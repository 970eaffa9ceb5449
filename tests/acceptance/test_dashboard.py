"""``outboxer serve`` as a user runs it, and its dashboard driven in headless Chromium.

The server is the real console script in a subprocess against a fresh PostgreSQL schema; the
browser is Debian's Chromium (``apt-get install -y chromium``) driven by Playwright, never a
downloaded browser. What the page does is checked in the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import re
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from playwright.async_api import Browser, ConsoleMessage, Dialog, Page, async_playwright, expect

from outboxer.inbox import consume
from outboxer.message import Message
from outboxer.outbox import Outbox
from outboxer.ports import ClaimRequest, ConsumeFailure, DeadLetterFilter, RelayInfo, Settlement
from outboxer.stores.postgres import PostgresStore
from tests.acceptance.conftest import OUTBOXER, ROOT, Cli, assert_one_line_error
from tests.conftest import give_up_on

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TOKEN = "dashboard-test-token-0123456789abcdef"
SCREENSHOT = Path("/tmp/outboxer-dashboard.png")


class Server:
    """A running ``outboxer serve``; stderr is collected in the background."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.stderr: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.url = self._wait_for_url()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr.append(line)

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for line in list(self.stderr):
                found = re.search(r"on (http://127\.0\.0\.1:\d+)/", line)
                if found:
                    return found.group(1)
            if self.process.poll() is not None:
                raise AssertionError(f"outboxer serve exited: {''.join(self.stderr)}")
            time.sleep(0.05)
        raise AssertionError(f"outboxer serve did not start: {''.join(self.stderr)}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        self._reader.join(5)
        assert self.process.stderr is not None
        self.process.stderr.close()
        return code


@pytest.fixture
def serve(cli: Cli, pg_url: str, pg_schema: str) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(*options: str, token: str | None = TOKEN) -> Server:
        env = dict(cli.env)
        if token is not None:
            env["OUTBOXER_ADMIN_TOKEN"] = token
        process = subprocess.Popen(
            [
                *(OUTBOXER, "serve", "--database-url", pg_url, "--schema", pg_schema),
                *("--port", "0", *options),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        server = Server(process)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
async def dead_letters(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> AsyncIterator[list[str]]:
    """Four dead letters (three orders, one payment), two pending messages, one live relay
    (its heartbeat kept fresh for the whole test, as a running relay does: a slow run must not
    age it out of the page's relay count)."""
    outbox = Outbox(schema=pg_schema)
    conn = await asyncpg.connect(pg_url)
    try:
        async with conn.transaction():
            ids = [
                await outbox.enqueue_async(
                    conn,
                    "orders" if n < 3 else "payments",
                    {"order_id": 1000 + n, "amount": "12.50", "note": "<b>not markup</b>"},
                    key=f"order-{1000 + n}",
                    type="OrderCreated" if n < 3 else "PaymentTaken",
                )
                for n in range(4)
            ]
    finally:
        await conn.close()
    reasons = {i: f"broker rejected the message (attempt {n + 1})" for n, i in enumerate(ids)}
    claimed: list[str] = []
    deadline = time.monotonic() + 10
    while len(claimed) < len(ids):
        assert time.monotonic() < deadline
        claim = await pg_store.claim_batch(
            ClaimRequest(limit=10, lease_seconds=30, ordered=False, relay_id="r")
        )
        await pg_store.settle(
            claim, Settlement(dead=[(m.id, reasons[m.id]) for m in claim.messages])
        )
        claimed += [m.id for m in claim.messages]
    conn = await asyncpg.connect(pg_url)
    try:
        for n in range(2):
            await outbox.enqueue_async(conn, "orders", {"order_id": 2000 + n}, key=f"o{n}")
    finally:
        await conn.close()
    now = dt.datetime.now(dt.UTC)
    relay = RelayInfo("relay-demo-1", "worker-1", 4242, now, now)
    await pg_store.heartbeat(relay)

    async def keep_alive() -> None:
        while True:
            await asyncio.sleep(1)
            await pg_store.heartbeat(relay)

    heartbeat = asyncio.create_task(keep_alive())
    try:
        yield ids
    finally:
        heartbeat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await heartbeat


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield chromium
        finally:
            await chromium.close()


async def open_page(browser: Browser, url: str) -> tuple[Page, list[str]]:
    """A page at ``url`` whose JavaScript errors and CSP violations are collected."""
    page = await browser.new_page(viewport={"width": 1400, "height": 1000})
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        # A refused API call (401/403) is logged by Chromium; it is expected here. So is a 503
        # of /readyz: the fixture's relay heartbeat ages out on a slow run, and the page shows
        # "not ready" (its badge), which is not a page error.
        expected = "status of 40" in message.text or message.location.get("url", "").endswith(
            "/readyz"
        )
        if message.type == "error" and not expected:
            problems.append(message.text)

    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.append(str(error)))

    async def accept(dialog: Dialog) -> None:
        await dialog.accept()

    page.on("dialog", accept)
    await page.goto(url)
    return page, problems


def row(page: Page, dead_letter_id: str) -> Any:
    return page.locator(f'#dead-letters tbody tr[data-id="{dead_letter_id}"]')


async def test_dashboard_inspect_replay_and_delete_change_the_database(
    serve: Callable[..., Server],
    dead_letters: list[str],
    browser: Browser,
    pg_store: PostgresStore,
) -> None:
    server = serve()
    page, problems = await open_page(browser, f"{server.url}/?interval=500")

    # The API answers 401 without the token: the page asks for it.
    await page.locator("#token-panel").wait_for(state="visible")
    assert "token" in (await page.locator("#token-reason").inner_text()).lower()
    await page.fill("#token-input", TOKEN)
    await page.click("#token-form button[type=submit]")
    await page.locator("#dead-letters tbody tr").nth(3).wait_for()
    assert await page.evaluate("sessionStorage.getItem('outboxer.adminToken')") == TOKEN

    # Figures, relays and the dead-letter table.
    await expect(page.locator("#dead_letters")).to_have_text("4")
    await expect(page.locator("#pending")).to_have_text("2")
    await expect(page.locator("#relay_count")).to_have_text("1")
    assert "relay-demo-1" in await page.inner_text("#relays")
    assert await page.locator("#dead-letters tbody tr").count() == 4
    assert await page.is_visible("#no-sweep")
    await expect(page.locator("#status")).to_have_text("ready")

    # Inspect shows payload, reason and attempts; markup in data stays text.
    target, doomed = dead_letters[0], dead_letters[1]
    await row(page, target).get_by_role("button", name="Inspect").click()
    await page.locator("#detail").wait_for(state="visible")
    assert await page.inner_text("#detail-id") == target
    payload = await page.inner_text("#detail-payload")
    assert '"order_id": 1000' in payload and "<b>not markup</b>" in payload
    fields = await page.inner_text("#detail-fields")
    assert "broker rejected the message" in fields and "OrderCreated" in fields
    assert await page.locator("#detail b").count() == 0

    # Replay: the row leaves the table and the message is back in the outbox.
    before = await pg_store.stats()
    await row(page, target).get_by_role("button", name="Replay").click()
    await row(page, target).wait_for(state="detached")
    after = await pg_store.stats()
    assert (after.dead_letters, after.pending) == (before.dead_letters - 1, before.pending + 1)
    claim = await pg_store.claim_batch(
        ClaimRequest(limit=10, lease_seconds=30, ordered=False, relay_id="t")
    )
    replayed = [m for m in claim.messages if m.id == target]
    assert replayed and replayed[0].attempts == 0 and replayed[0].key == "order-1000"
    await pg_store.settle(claim, Settlement(released=[m.id for m in claim.messages]))

    # Delete (after the confirmation dialog): gone for good, not replayed.
    await row(page, doomed).get_by_role("button", name="Delete").click()
    await row(page, doomed).wait_for(state="detached")
    remaining = await pg_store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
    assert sorted(d.id for d in remaining.items) == sorted(dead_letters[2:])
    assert (await pg_store.stats()).pending == before.pending + 1

    # Filter the table by topic.
    await page.fill("#dead-letters-filter input[name=topic]", "payments")
    await page.click("#dead-letters-filter button[type=submit]")
    await expect(page.locator("#dead-letters tbody tr")).to_have_count(1)
    assert await row(page, dead_letters[3]).count() == 1

    # The charts have drawn series from several polls.
    await expect(page.locator("#chart-backlog path.series")).to_have_count(1)
    await page.wait_for_timeout(1500)  # a few more polls so the lines have length
    for chart in ("#chart-backlog", "#chart-rate", "#chart-age"):
        path = await page.get_attribute(f"{chart} path.series", "d")
        assert path and path.count("L") >= 1, chart
    await page.fill("#dead-letters-filter input[name=topic]", "")
    await page.click("#dead-letters-filter button[type=submit]")
    await expect(page.locator("#dead-letters tbody tr")).to_have_count(2)
    image = await page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert len(image) > 10_000
    assert problems == []
    assert server.stop() == 0


async def test_without_a_token_the_dashboard_reads_but_cannot_replay(
    serve: Callable[..., Server],
    dead_letters: list[str],
    browser: Browser,
    pg_store: PostgresStore,
) -> None:
    server = serve(token=None)
    page, problems = await open_page(browser, server.url + "/")
    await page.locator("#dead-letters tbody tr").nth(3).wait_for()
    before = await pg_store.stats()
    await row(page, dead_letters[0]).get_by_role("button", name="Replay").click()
    await page.locator("#error").wait_for(state="visible")
    assert "403" in await page.inner_text("#error")
    assert "OUTBOXER_ADMIN_TOKEN" in await page.inner_text("#token-reason")
    assert await row(page, dead_letters[0]).count() == 1
    after = await pg_store.stats()
    assert (after.dead_letters, after.pending) == (before.dead_letters, before.pending)
    assert problems == []
    assert server.stop() == 0
    assert "NO ADMIN TOKEN IS SET" in "".join(server.stderr)  # the loud warning


async def test_the_dashboard_lists_messages_not_yet_published_with_their_state(
    serve: Callable[..., Server],
    dead_letters: list[str],
    browser: Browser,
    pg_store: PostgresStore,
) -> None:
    server = serve(token=None)  # a read: open without a token
    page, problems = await open_page(browser, f"{server.url}/?interval=500")
    rows = page.locator("#messages tbody tr")
    await expect(rows).to_have_count(2)
    await expect(page.locator("#messages td.state")).to_have_text(["pending", "pending"])

    await page.select_option("#messages-filter select[name=state]", "in_flight")
    await page.click("#messages-filter button[type=submit]")
    await expect(rows).to_have_count(0)
    await page.locator("#no-messages").wait_for(state="visible")

    # A relay leases one: the next poll shows it in flight, with the relay holding it.
    claim = await pg_store.claim_batch(
        ClaimRequest(limit=1, lease_seconds=60, ordered=False, relay_id="relay-demo-1")
    )
    [leased] = claim.messages
    await expect(rows).to_have_count(1)
    text = await rows.first.inner_text()
    assert leased.id in text and "in flight" in text and "relay-demo-1" in text

    # A consumer fails on a keyed message with two more behind it: the inbox's panel appears.
    assert await page.locator("#consume-failures-panel").is_hidden()

    async def mail(message: Message, connection: Any, attempt: int) -> None:
        if message.id == "welcome-1":
            raise RuntimeError("the mail server said no")

    batch = [Message(id=f"welcome-{n}", topic="users", payload=b"{}", key="u7") for n in (1, 2, 3)]
    await consume(
        pg_store,
        "mailer",
        batch,
        mail,
        on_failure=lambda message, attempts, error: ConsumeFailure(str(error), 600),
        retention_seconds=60,
    )
    failing = page.locator("#consume-failures tbody tr")
    await expect(failing).to_have_count(1)
    assert (await failing.first.inner_text()).split("\t")[:3] == ["mailer", "1", "2"]
    assert problems == []
    assert server.stop() == 0


async def test_serve_answers_the_api_with_the_token_and_stops_cleanly_on_sigterm(
    serve: Callable[..., Server], dead_letters: list[str]
) -> None:
    server = serve("--ready-max-age", "600")
    async with httpx.AsyncClient(base_url=server.url) as client:
        stats = (
            await client.get("/api/stats", headers={"Authorization": f"Bearer {TOKEN}"})
        ).json()
        assert (stats["dead_letters"], stats["pending"]) == (4, 2)
        assert (await client.get("/api/stats")).status_code == 401
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"]["lag"]["max_age_seconds"] == 600
        assert "outboxer_dead_letters 4.0" in (await client.get("/metrics")).text
    assert server.stop() == 0
    log = "".join(server.stderr)
    assert "Traceback" not in log and "NO ADMIN TOKEN" not in log
    assert TOKEN not in log  # never a secret in the logs


def test_serve_help_lists_its_environment_variables(cli: Cli) -> None:
    result = cli("serve", "--help")
    assert result.returncode == 0
    for variable in (
        "OUTBOXER_DATABASE_URL",
        "OUTBOXER_ADMIN_TOKEN",
        "OUTBOXER_HOST",
        "OUTBOXER_PORT",
        "OUTBOXER_READY_MAX_AGE",
    ):
        assert variable in result.stdout


def test_serve_on_a_taken_port_is_one_line(
    cli: Cli, pg_url: str, pg_store: PostgresStore, pg_schema: str
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        result = cli("serve", "--database-url", pg_url, "--schema", pg_schema, "--port", port)
    assert_one_line_error(result, 1, "cannot listen on 127.0.0.1:" + port)


def test_serve_against_a_missing_schema_is_one_line(cli: Cli, pg_url: str) -> None:
    result = cli("serve", "--database-url", pg_url, "--schema", "no_such_schema", "--port", "0")
    assert_one_line_error(result, 1, "outboxer db upgrade")


def test_serve_with_a_bad_url_is_one_line(cli: Cli) -> None:
    result = cli("serve", "--database-url", "mongodb://nowhere", "--port", "0")
    assert_one_line_error(result, 2, "unsupported database URL")


async def test_the_dashboard_works_when_the_api_is_mounted_under_a_prefix(
    browser: Browser, pg_store: PostgresStore, dead_letters: list[str]
) -> None:
    """Relative URLs: the page, its assets and its API calls follow a mount point."""
    import uvicorn
    from fastapi import FastAPI

    from outboxer.admin import create_app
    from outboxer.admin.server import listen

    outer = FastAPI()
    outer.mount("/ops/outboxer", create_app(pg_store, token=None))
    listener = listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(outer, log_config=None, log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        port = listener.getsockname()[1]
        page, problems = await open_page(browser, f"http://127.0.0.1:{port}/ops/outboxer/")
        await page.locator("#dead-letters tbody tr").nth(3).wait_for()
        await expect(page.locator("#pending")).to_have_text("2")
        assert problems == []
    finally:
        server.should_exit = True
        await task
        listener.close()


@pytest.fixture(autouse=True)
def _no_proxy_for_localhost(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx and Chromium must reach 127.0.0.1 directly even when a proxy is configured."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)


async def test_an_id_dead_lettered_both_ways_shows_two_rows_each_inspected_as_itself(
    serve: Callable[..., Server],
    dead_letters: list[str],
    browser: Browser,
    pg_store: PostgresStore,
) -> None:
    """A service consuming what it publishes failed on one id both ways: the table has a row
    per direction, and Inspect on each row shows that row's dead letter (the API gives the
    newer one unless told the direction)."""
    target = dead_letters[0]
    await give_up_on(pg_store, target, payload=b'{"received": true}')
    server = serve(token=None)  # reads only
    page, problems = await open_page(browser, server.url + "/")
    await page.locator("#dead-letters tbody tr").nth(4).wait_for()
    both = row(page, target)
    await expect(both).to_have_count(2)
    for direction in ("publish", "consume"):
        mine = page.locator(
            f'#dead-letters tbody tr[data-id="{target}"][data-direction="{direction}"]'
        )
        await mine.get_by_role("button", name="Inspect").click()
        await expect(page.locator("#detail-fields")).to_contain_text(direction)
        await expect(mine).to_have_class("selected")
        fields = await page.inner_text("#detail-fields")
        payload = await page.inner_text("#detail-payload")
        if direction == "publish":
            assert "broker rejected" in fields and '"order_id": 1000' in payload
        else:
            assert "the mail server said no" in fields and '"received": true' in payload
        assert await page.locator("#dead-letters tbody tr.selected").count() == 1
    # The filter narrows the table to one direction.
    await page.select_option("#dead-letters-filter select[name=direction]", "consume")
    await page.click("#dead-letters-filter button[type=submit]")
    await expect(page.locator("#dead-letters tbody tr")).to_have_count(1)
    await expect(page.locator("#dead-letters tbody tr")).to_have_attribute(
        "data-direction", "consume"
    )
    assert problems == []
    assert server.stop() == 0
