"""Crash isolation with real processes: a message whose publish kills the relay is
dead-lettered, and relays killed at random under load never dead-letter a healthy message."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
from pathlib import Path

import asyncpg
import pytest

import outboxer
from tests.acceptance.conftest import Cli, lines
from tests.acceptance.test_cli import INPROCESS, wait_until

pytestmark = pytest.mark.timeout(240)


async def write(pg_url: str, schema: str, messages: list[dict[str, object]]) -> list[str]:
    conn = await asyncpg.connect(pg_url)
    try:
        return await outboxer.Outbox(schema=schema).enqueue_many_async(conn, messages)
    finally:
        await conn.close()


def relay_args(pg_url: str, schema: str, *more: str) -> list[str]:
    return [
        "relay",
        "--database-url",
        pg_url,
        "--schema",
        schema,
        "--broker",
        INPROCESS,
        "--lease-seconds",
        "1",
        "--poll-interval",
        "0.1",
        *more,
    ]


def stats(cli: Cli, pg_url: str, schema: str) -> dict[str, int]:
    result = cli("stats", "--database-url", pg_url, "--schema", schema, "--json")
    return json.loads(result.stdout)  # type: ignore[no-any-return]


async def test_a_message_that_kills_the_relay_is_dead_lettered_and_the_rest_delivered(
    cli: Cli, pg_url: str, pg_schema: str, sink: Path
) -> None:
    assert cli("db", "upgrade", "--database-url", pg_url, "--schema", pg_schema).returncode == 0
    orders = [{"topic": "orders", "payload": {"n": n}, "key": str(n % 10)} for n in range(200)]
    ids = await write(pg_url, pg_schema, orders[:100])
    [killer] = await write(pg_url, pg_schema, [{"topic": "audit", "payload": {}, "type": "Killer"}])
    ids += await write(pg_url, pg_schema, orders[100:])
    deaths = 0
    relay: subprocess.Popen[str] | None = None
    try:
        # A supervisor's restart loop: every relay that publishes the killer dies.
        while stats(cli, pg_url, pg_schema)["dead_letters"] == 0:
            assert deaths < 10, "the killer was never dead-lettered"
            relay = cli.start(*relay_args(pg_url, pg_schema, "--batch-size", "50"))
            wait_until(  # it dies, or it dead-letters the killer and lives on
                lambda r=relay: (
                    r.poll() is not None or stats(cli, pg_url, pg_schema)["dead_letters"] == 1
                ),
                30,
                what="the relay's death or the killer's dead letter",
            )
            if relay.poll() is not None:
                relay.communicate()
                deaths += 1
        wait_until(lambda: set(lines(sink)) >= set(ids), what="every order")
    finally:
        if relay is not None and relay.poll() is None:
            relay.send_signal(signal.SIGTERM)
            relay.communicate(timeout=30)
    dead = json.loads(
        cli("dlq", "show", "--database-url", pg_url, "--schema", pg_schema, killer, "--json").stdout
    )
    assert "the relay died 3 times while publishing this message alone" in dead["failure_reason"]
    assert deaths == 4  # once in its first batch, then three times alone
    final = stats(cli, pg_url, pg_schema)
    assert (final["pending"], final["in_flight"], final["dead_letters"]) == (0, 0, 1)


async def test_relays_killed_at_random_under_load_dead_letter_nothing(
    cli: Cli, pg_url: str, pg_schema: str, sink: Path
) -> None:
    assert cli("db", "upgrade", "--database-url", pg_url, "--schema", pg_schema).returncode == 0
    total = 3000
    messages = [{"topic": "orders", "payload": {"n": n}, "key": str(n % 50)} for n in range(total)]
    ids = set(await write(pg_url, pg_schema, messages))
    cli.env["OUTBOXER_TEST_DELAY"] = "0.001"
    args = relay_args(pg_url, pg_schema, "--batch-size", "20", "--window", "3")
    rng = random.Random(7)
    kills = 0
    relay = cli.start(*args)
    try:
        while len(set(lines(sink))) < total and kills < 8:
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            relay.kill()  # SIGKILL, at a random instant, with batches in flight
            relay.communicate(timeout=10)
            kills += 1
            relay = cli.start(*args)
        wait_until(lambda: set(lines(sink)) >= ids, timeout=180, what="every message")
        wait_until(lambda: stats(cli, pg_url, pg_schema)["in_flight"] == 0, what="all settled")
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.communicate(timeout=30)
    print(f"\n{kills} kill -9 under load; {len(lines(sink)) - total} duplicates")
    assert kills >= 3
    final = stats(cli, pg_url, pg_schema)
    assert (final["pending"], final["in_flight"], final["dead_letters"]) == (0, 0, 0)
