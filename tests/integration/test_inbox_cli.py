"""The command line around the inbox: ``outboxer consume`` refusing bad input in one line, and
consume dead letters through the existing ``outboxer dlq`` and ``outboxer stats`` commands."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from typing import Any

import pytest

from outboxer.inbox import consume, redrive_consume_failures
from outboxer.message import Message
from outboxer.ports import ConsumeFailure
from outboxer.stores.postgres import PostgresStore
from tests.acceptance.conftest import OUTBOXER, PYTHONPATH, ROOT, assert_one_line_error

pytestmark = pytest.mark.timeout(60)


def outboxer(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXER_")}
    env["PYTHONPATH"] = PYTHONPATH
    return subprocess.run(
        [OUTBOXER, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=30
    )


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--handlers", "no_such_module:registry", "--topic", "t"], ["cannot import"]),
        (["--handlers", "tests.integration.consumer_handlers", "--topic", "t"], ["module:"]),
        (["--handlers", "tests.integration.consumer_handlers:FIXED", "--topic", "t"],
         ["not a HandlerRegistry"]),
        (["--handlers", "tests.integration.consumer_handlers:registry"], ["--topic"]),
        (["--handlers", "tests.integration.consumer_handlers:registry", "--topic", "t",
          "--consumer-name", "bad name!"], ["invalid consumer name"]),
        (["--handlers", "tests.integration.consumer_handlers:registry", "--topic", "t",
          "--broker", "http://example.com"], ["consuming"]),
        (["--handlers", "tests.integration.consumer_handlers:registry", "--topic", "t",
          "--broker", "kafka://127.0.0.1:1?session_timeout_ms=soon"], ["session_timeout_ms"]),
    ],
)  # fmt: skip
def test_consume_refuses_bad_input_in_one_line(
    pg_url: str, options: list[str], words: list[str]
) -> None:
    args = ["consume", "--database-url", pg_url, "--broker", "redis://127.0.0.1:6379/0"]
    result = outboxer(*args, *options)
    assert_one_line_error(result, 2, *words)


async def test_consume_dead_letters_in_the_dlq_and_stats_commands(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    async def failing(message: Message, connection: Any, attempt: int) -> None:
        raise RuntimeError("the mail server said no")

    def give_up(message: Message, attempts: int, error: Exception) -> ConsumeFailure:
        return ConsumeFailure(f"consumer 'mailer': {error}", None)

    poison = Message(id="poison-1", topic="users", payload=b'{"n": 1}', key="u1", type="T")
    outcomes = await consume(
        pg_store, "mailer", [poison], failing, on_failure=give_up, retention_seconds=60
    )
    assert outcomes == ["dead"]
    db = ["--database-url", pg_url, "--schema", pg_schema]

    listed = outboxer("dlq", "list", *db, "--json")
    assert listed.returncode == 0, listed.stderr
    [item] = json.loads(listed.stdout)["items"]
    assert (item["id"], item["direction"], item["attempts"]) == ("poison-1", "consume", 1)
    assert item["payload"] == {"n": 1} and "said no" in item["failure_reason"]
    shown = outboxer("dlq", "show", "poison-1", *db, "--json")
    assert json.loads(shown.stdout)["direction"] == "consume"

    sweep = await pg_store.sweep(sweeper="test", interval=0, retention_seconds=0, batch_size=50)
    assert sweep is not None and sweep.consume_failures == 1
    stats = json.loads(outboxer("stats", *db, "--json").stdout)
    assert stats["dead_letters"] == 1 and stats["last_sweep"]["consume_failures"] == 1
    assert stats["consume_failures"] == {}  # given up: a dead letter, nothing to re-drive

    replayed = outboxer("dlq", "replay", "poison-1", *db, "--json")
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["replayed"] == ["poison-1"]
    assert (await pg_store.stats()).dead_letters == 0
    assert (await pg_store.stats()).pending == 0  # re-driven to the consumer, not re-published

    handled: list[str] = []

    async def fixed(message: Message, connection: Any, attempt: int) -> None:
        handled.append(f"{message.id}#{attempt}")

    outcomes = await redrive_consume_failures(
        pg_store, "mailer", fixed, on_failure=give_up, retention_seconds=60, limit=10
    )
    assert outcomes == ["handled"] and handled == ["poison-1#1"]


async def test_stats_show_a_consumer_held_up_behind_a_failing_key(
    pg_store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    """``outboxer stats`` names the consumer whose handler fails on a keyed message, with the
    messages of that key waiting behind it; once the handler is fixed and the key re-driven,
    the consumer is gone from the figures."""
    broken = {"yes": True}

    async def mail(message: Message, connection: Any, attempt: int) -> None:
        if broken["yes"] and message.id == "welcome-1":
            raise RuntimeError("the mail server said no")

    def retry(message: Message, attempts: int, error: Exception) -> ConsumeFailure:
        return ConsumeFailure(str(error), 0.1)

    batch = [
        Message(id=f"welcome-{n}", topic="users", payload=b"{}", key="user-7", type="T")
        for n in (1, 2, 3)
    ]
    outcomes = await consume(
        pg_store, "mailer", batch, mail, on_failure=retry, retention_seconds=60
    )
    assert outcomes == ["retrying", "waiting", "waiting"]
    db = ["--database-url", pg_url, "--schema", pg_schema]

    result = outboxer("stats", *db, "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert list(stats["consume_failures"]) == ["mailer"]
    mailer = stats["consume_failures"]["mailer"]
    assert (mailer["retrying"], mailer["waiting"]) == (1, 2)
    assert 0 <= mailer["oldest_age_seconds"] < 60
    assert (stats["pending"], stats["dead_letters"]) == (0, 0)  # invisible to the outbox figures
    text = outboxer("stats", *db).stdout.splitlines()
    assert "consume failures    3" in text
    assert any(line.startswith("  mailer  retrying 1  waiting 2  oldest ") for line in text)

    broken["yes"] = False
    handled: list[str] = []
    deadline = time.monotonic() + 10
    while len(handled) < 3:  # the key's head is due after 0.1 s; then one message a round
        assert time.monotonic() < deadline
        handled += await redrive_consume_failures(
            pg_store, "mailer", mail, on_failure=retry, retention_seconds=60, limit=10
        )
        await asyncio.sleep(0.05)
    assert handled == ["handled"] * 3
    assert json.loads(outboxer("stats", *db, "--json").stdout)["consume_failures"] == {}
    assert "consume failures    0" in outboxer("stats", *db).stdout.splitlines()


@pytest.mark.parametrize("kind", ["SwallowsCancellation", "BlocksTheLoop"])
def test_a_consumer_whose_handler_will_not_stop_exits_past_its_deadline(
    pg_url: str, pg_schema: str, kind: str, tmp_path: Any
) -> None:
    """Found by a probe: an async handler that swallows its cancellation (or blocks the event
    loop) kept ``outboxer consume`` alive for good after SIGTERM, deaf to further signals
    (SIGKILL only). Now it exits at ``--shutdown-timeout`` plus a grace, status 1, in one line,
    with nothing acknowledged (the broker delivers the message again)."""
    from outboxer.brokers.redis.publisher import RedisPublisher
    from outboxer.cli._common import STOP_GRACE

    stream = f"stubborn-{pg_schema}"

    async def publish() -> None:
        async with RedisPublisher.from_url("redis://127.0.0.1:6379/0") as publisher:
            await publisher.publish([Message(id="m-1", topic=stream, payload=b"{}", type=kind)])

    asyncio.run(publish())
    upgraded = outboxer("db", "upgrade", "--database-url", pg_url, "--schema", pg_schema)
    assert upgraded.returncode == 0, upgraded.stderr
    started = tmp_path / "started"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXER_")}
    env |= {"PYTHONPATH": PYTHONPATH, "OUTBOXER_TEST_STARTED": str(started)}
    args = ["--log-level", "error", "consume", "--database-url", pg_url, "--schema", pg_schema]
    args += ["--broker", "redis://127.0.0.1:6379/0", "--topic", stream]
    args += ["--handlers", "tests.integration.consumer_handlers:stubborn"]
    process = subprocess.Popen(
        [OUTBOXER, *args, "--shutdown-timeout", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 30
        while not started.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the handler never ran"
            time.sleep(0.1)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=1 + STOP_GRACE + 15)
        took = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 1, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("outboxer: error: the consumer did not stop within"), stderr
    assert "Traceback" not in stderr
    assert took >= 1 + STOP_GRACE - 0.5
