"""The consumer contract: what every broker consumer adapter must do with the inbox.

Subclass :class:`ConsumerContract` per broker with these fixtures:

- ``broker_url``: the consumer's broker URL (with test-friendly consumer options);
- ``prepare``: ``async (topic, consumer_name)`` that makes the broker ready for publishing to
  ``topic`` and consuming it as ``consumer_name`` (create the topic/stream/queue);
- ``publish``: ``async (topic, messages)`` through the outboxer publisher of that broker;
- ``publish_again`` (optional): publish messages again as a real duplicate delivery (brokers
  that drop a re-published id by themselves need a way around that);
- ``publish_foreign`` (optional): publish messages as the broker's own client would, for text
  ``enqueue`` refuses (NUL) and the publisher may not carry as it is.

Every test uses a fresh PostgreSQL schema (the inbox and an ``effects`` table the handlers of
:mod:`tests.integration.consumer_handlers` write to), a unique topic and a unique consumer name.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest

from outboxer.brokers import consumer_from_url
from outboxer.config import Backoff
from outboxer.inbox import Inbox, InboxSettings, run_consumer
from outboxer.message import Message
from outboxer.ports import DeadLetter, DeadLetterFilter
from outboxer.stores.postgres import PostgresStore
from tests.acceptance.conftest import PYTHONPATH
from tests.conftest import unique_name
from tests.integration import consumer_handlers

ROOT = Path(__file__).resolve().parents[2]
OUTBOXER = str(Path(sys.executable).parent / "outboxer")
HANDLERS = "tests.integration.consumer_handlers:registry"

Publish = Callable[[str, Sequence[Message]], Awaitable[None]]
Prepare = Callable[[str, str], Awaitable[None]]


def job(
    topic: str,
    effects: str,
    n: int,
    *,
    fail: str | None = None,
    sleep: float = 0.0,
    key: str | None = None,
) -> Message:
    return Message(
        id=str(uuid.uuid4()),
        topic=topic,
        payload=json.dumps({"n": n, "fail": fail, "sleep": sleep}).encode(),
        key=key,
        type="Job",
        headers={"effects": effects},
    )


async def wait_for(
    check: Callable[[], Awaitable[bool]], what: str, timeout: float = 20.0, every: float = 0.05
) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(every)


class Consumer:
    """An ``outboxer consume`` subprocess."""

    def __init__(self, args: list[str], log: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXER_")}
        env["PYTHONPATH"] = PYTHONPATH
        self.log = log
        with log.open("ab") as sink:
            self.process = subprocess.Popen(
                [OUTBOXER, "--log-level", "INFO", "consume", *args],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self, timeout: float = 20) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class ConsumerContract:
    @pytest.fixture
    async def effects(self, pg_store: PostgresStore, pg_schema: str) -> str:
        table = f'"{pg_schema}".effects'
        await pg_store.execute(
            f"CREATE TABLE {table} (n bigserial, consumer text, message_id text, attempt int)"
        )
        return table

    @pytest.fixture
    def publish_again(self, publish: Publish) -> Publish:
        return publish

    @pytest.fixture
    def publish_foreign(self, publish: Publish) -> Publish:
        return publish

    @staticmethod
    async def effect_counts(store: PostgresStore, effects: str) -> dict[str, int]:
        rows = await store.execute(
            f"SELECT message_id, count(*) FROM {effects} GROUP BY message_id"
        )
        return {r[0]: r[1] for r in rows}

    async def test_duplicates_retries_and_consume_dead_letters(
        self,
        pg_store: PostgresStore,
        effects: str,
        topic: str,
        broker_url: str,
        prepare: Prepare,
        publish: Publish,
        publish_again: Publish,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """A message delivered twice takes effect once; a handler that fails once is retried
        and succeeds; one that always fails ends as a consume dead letter that is replayable.
        Stopping the consumer says nothing of a lost connection."""
        name = unique_name("c")
        await prepare(topic, name)
        settings = InboxSettings(
            consumer=name,
            max_attempts=2,
            retry=Backoff(base=0.2, cap=0.2),
            redrive_interval=0.05,
            sweep_interval=0,
        )
        inbox = Inbox(pg_store, consumer_handlers.registry, settings)
        adapter = consumer_from_url(broker_url, name=name, topics=[topic], batch_size=20)
        running = asyncio.create_task(run_consumer(inbox, adapter, shutdown_timeout=5))
        try:
            once, twice = job(topic, effects, 1), job(topic, effects, 2, fail="once")
            poison = job(topic, effects, 3, fail="always", key="p")
            await publish(topic, [once, twice, poison])
            await publish_again(topic, [once])

            async def settled() -> bool:
                counts = await self.effect_counts(pg_store, effects)
                return (
                    counts.get(once.id) == 1
                    and counts.get(twice.id) == 1
                    and (
                        await pg_store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
                    ).items
                    != []
                )

            await wait_for(settled, "the three messages to settle")

            async def duplicate_seen() -> bool:
                return inbox.counters.duplicate >= 1

            await wait_for(duplicate_seen, "the duplicate delivery")
            # Effects that committed: the first attempt of "twice" was rolled back with its
            # failure, so exactly one row per message survives.
            rows = await pg_store.execute(f"SELECT message_id, attempt FROM {effects} ORDER BY n")
            committed = [(r[0], r[1]) for r in rows]
            assert committed.count((once.id, 1)) == 1
            assert [a for i, a in committed if i == twice.id] == [2]
            assert [a for i, a in committed if i == poison.id] == []
            [dead] = (
                await pg_store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
            ).items
            assert (dead.id, dead.direction, dead.attempts) == (poison.id, "consume", 2)
            assert (dead.topic, dead.key, dead.type) == (topic, "p", "Job")
            assert json.loads(dead.payload)["fail"] == "always"
            assert name in dead.failure_reason and "always fails" in dead.failure_reason

            # The bug is fixed and the dead letter replayed: the consumer runs it once more.
            consumer_handlers.FIXED.add(poison.id)
            assert await pg_store.replay_dead_letters(DeadLetterFilter(ids=[poison.id])) == [
                poison.id
            ]

            async def replayed() -> bool:
                counts = await self.effect_counts(pg_store, effects)
                return counts.get(poison.id) == 1

            await wait_for(replayed, "the replayed dead letter to take effect")
            assert (await pg_store.stats()).dead_letters == 0
            assert inbox.counters.duplicate >= 1
        finally:
            inbox.stop()
            await asyncio.wait_for(running, 15)
        lost = [r.getMessage() for r in caplog.records if "disconnect" in r.getMessage().lower()]
        assert lost == []

    async def test_nul_in_a_record_is_replaced_and_does_not_block_the_consumer(
        self,
        pg_store: PostgresStore,
        effects: str,
        topic: str,
        broker_url: str,
        prepare: Prepare,
        publish_foreign: Publish,
    ) -> None:
        """Any client can publish a record whose id, key or header holds a NUL character, which
        PostgreSQL cannot store in text (``enqueue`` refuses it, so only a foreign producer
        sends one; the bytes on the wire are the same whoever sends them). The consumer hands
        it on with U+FFFD in place of each NUL: handled like any other, or a dead letter an
        operator can read, and the records after it are handled. (Before, storing it raised:
        the consumer stopped with the batch unacknowledged, and met it again at each start.)"""
        name = unique_name("c")
        await prepare(topic, name)
        settings = InboxSettings(
            consumer=name, max_attempts=1, redrive_interval=0.05, sweep_interval=0
        )
        inbox = Inbox(pg_store, consumer_handlers.registry, settings)
        adapter = consumer_from_url(broker_url, name=name, topics=[topic], batch_size=20)
        running = asyncio.create_task(run_consumer(inbox, adapter, shutdown_timeout=5))
        nul = "\x00"
        handled = job(topic, effects, 1, key=f"k{nul}1")
        handled = dataclasses.replace(
            handled, id=f"{handled.id}{nul}", headers={**handled.headers, "note": f"a{nul}b"}
        )
        dead = job(topic, effects, 2, fail="always", key=f"k{nul}2")
        dead = dataclasses.replace(dead, headers={**dead.headers, "note": f"{nul}"})
        after = [job(topic, effects, n) for n in range(3, 6)]
        try:
            await publish_foreign(topic, [handled, dead, *after])

            async def settled() -> bool:
                counts = await self.effect_counts(pg_store, effects)
                return all(
                    m.id.replace(nul, "\ufffd") in counts for m in [handled, *after]
                ) and bool(await dead_letters())

            async def dead_letters() -> list[DeadLetter]:
                flt = DeadLetterFilter(ids=[dead.id])
                return (await pg_store.list_dead_letters(flt, limit=10, cursor=None)).items

            await wait_for(settled, "the poisoned and the following records to settle")
            [letter] = await dead_letters()
            assert (letter.direction, letter.key, letter.type) == ("consume", "k\ufffd2", "Job")
            assert letter.headers["note"] == "\ufffd"
            assert (inbox.counters.handled, inbox.counters.dead) == (4, 1)
        finally:
            inbox.stop()
            await asyncio.wait_for(running, 15)

    async def test_kill_9_of_a_consumer_mid_batch_loses_nothing(
        self,
        pg_store: PostgresStore,
        pg_url: str,
        pg_schema: str,
        effects: str,
        topic: str,
        broker_url: str,
        prepare: Prepare,
        publish: Publish,
        tmp_path: Path,
    ) -> None:
        """SIGKILL a consumer subprocess while it is in the middle of a batch, start another:
        every message takes effect exactly once (the unacknowledged ones are delivered again,
        and the inbox drops the ones the first process had committed)."""
        name = unique_name("c")
        await prepare(topic, name)
        total = 240
        messages = [job(topic, effects, n, sleep=0.02, key=f"k{n % 8}") for n in range(total)]
        await publish(topic, messages)
        args = [
            "--database-url",
            pg_url,
            "--schema",
            pg_schema,
            "--broker",
            broker_url,
            "--handlers",
            HANDLERS,
            "--consumer-name",
            name,
            "--topic",
            topic,
            "--batch-size",
            "40",
            "--concurrency",
            "4",
            "--sweep-interval",
            "0",
        ]
        first = Consumer(args, tmp_path / "first.log")
        second: Consumer | None = None
        try:

            async def some_done() -> bool:
                return len(await self.effect_counts(pg_store, effects)) >= total // 5

            await wait_for(some_done, "the first consumer to make progress", timeout=30)
            first.kill()
            done_by_first = len(await self.effect_counts(pg_store, effects))
            assert done_by_first < total, "the kill came too late to test anything"
            second = Consumer(args, tmp_path / "second.log")

            async def all_done() -> bool:
                return len(await self.effect_counts(pg_store, effects)) == total

            try:
                await wait_for(all_done, "every message to take effect", timeout=45)
            except AssertionError:
                print(first.output()[-3000:], second.output()[-3000:])
                raise
            counts = await self.effect_counts(pg_store, effects)
            assert set(counts) == {m.id for m in messages}
            assert set(counts.values()) == {1}, "a message took effect twice"
            assert second.stop() == 0, second.output()[-3000:]
            stopped = [line for line in second.output().splitlines() if "stopped:" in line]
            print(
                f"first consumer committed {done_by_first} of {total} before SIGKILL; "
                f"second consumer {stopped[-1].partition('stopped: ')[2] if stopped else '?'}"
            )
        finally:
            if first.process.poll() is None:
                first.kill()
            if second is not None and second.process.poll() is None:
                second.kill()
