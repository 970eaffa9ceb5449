"""The inbox store contract, run against the in-memory fake, SQLite, PostgreSQL and MariaDB.

The consume state machine (``outboxer.inbox.consume``) is the same for every store; what is
checked here is that each store's SQL primitives give it the same results.

A handler here records an "effect" through the connection of the inbox transaction (a row in
an ``effects`` table; a list for the in-memory store, which has no transactions), so every test
can count how often a message really took effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from outboxer.config import TableNames
from outboxer.errors import HandlerEndedTransaction
from outboxer.inbox import consume, redrive_consume_failures
from outboxer.message import Message, encode_headers
from outboxer.ports import MAX_REASON, ConsumeFailure, DeadLetterFilter, InboxStore
from outboxer.stores.mysql import MysqlStore
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.postgres import inbox as postgres_inbox
from outboxer.stores.postgres.connection import statements_run
from outboxer.stores.sqlite import SqliteStore
from outboxer.testing import InMemoryStore

pytestmark = pytest.mark.timeout(60)


def message(n: int, *, key: str | None = None, type: str = "Thing") -> Message:
    return Message(
        id=f"m-{n}",
        topic="things",
        payload=b'{"n": %d}' % n,
        key=key,
        type=type,
        headers={"h": str(n)},
    )


def retry_after(delay: float, max_attempts: int = 3) -> Callable[[Message, int, Exception], Any]:
    def judge(message: Message, attempts: int, error: Exception) -> ConsumeFailure:
        if attempts >= max_attempts:
            return ConsumeFailure(f"gave up: {error}", None)
        return ConsumeFailure(f"failed: {error}", delay)

    return judge


class Effects:
    """Writes one effect row per handler run, through the inbox transaction's connection."""

    def __init__(
        self,
        record: Callable[[Any, str, str], Awaitable[None]],
        read: Callable[[], Awaitable[list[str]]],
    ) -> None:
        self.record = record
        self.read = read
        self.calls: list[tuple[str, int]] = []  # (message id, attempt), in call order

    def handler(
        self, consumer: str = "c", fail: Callable[[Message, int], bool] = lambda m, a: False
    ) -> Any:
        async def handle(message: Message, connection: Any, attempt: int) -> None:
            self.calls.append((message.id, attempt))
            await self.record(connection, consumer, message.id)
            if fail(message, attempt):
                raise RuntimeError(f"handler failed on attempt {attempt}")

        return handle


async def one(
    store: InboxStore, consumer: str, message: Message, handler: Any, **options: Any
) -> str:
    """Consume one message; its outcome."""
    run = store.consume if isinstance(store, Mode) else functools.partial(consume, store)
    [outcome] = await run(consumer, [message], handler, **options)
    return outcome


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


class Mode:
    """A store with ``consume`` and ``redrive_consume_failures`` of the inbox core, consuming
    in one of the two transaction modes."""

    def __init__(self, store: Any, single_transaction: bool) -> None:
        self._store = store
        self._single = single_transaction

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def consume(self, *args: Any, **options: Any) -> Any:
        return await consume(self._store, *args, single_transaction=self._single, **options)

    async def redrive_consume_failures(self, *args: Any, **options: Any) -> Any:
        return await redrive_consume_failures(self._store, *args, **options)


class InboxStoreContract:
    """Run twice per store: one transaction per message, and one per batch."""

    transactional = True  # handler writes are undone when the handler fails

    @pytest.fixture(params=["per-message", "single-transaction"])
    def store(self, request: pytest.FixtureRequest, raw_store: Any) -> Mode:
        return Mode(raw_store, request.param == "single-transaction")

    async def test_a_message_is_handled_once_per_consumer(
        self, store: InboxStore, effects: Effects
    ) -> None:
        judge = retry_after(0.1)
        m = message(1)
        assert (
            await one(store, "c", m, effects.handler(), on_failure=judge, retention_seconds=60)
            == "handled"
        )
        again = dataclasses.replace(m, payload=b'{"n": "redelivered"}')
        assert (
            await one(store, "c", again, effects.handler(), on_failure=judge, retention_seconds=60)
            == "duplicate"
        )
        assert await effects.read() == ["c:m-1"]
        # Another consumer has an inbox of its own.
        assert (
            await one(store, "d", m, effects.handler("d"), on_failure=judge, retention_seconds=60)
            == "handled"
        )
        assert sorted(await effects.read()) == ["c:m-1", "d:m-1"]
        assert effects.calls == [("m-1", 1), ("m-1", 1)]

    async def test_a_failed_attempt_leaves_no_effect_and_is_retried_after_the_delay(
        self, store: InboxStore, effects: Effects
    ) -> None:
        judge = retry_after(0.3)
        handler = effects.handler(fail=lambda m, attempt: attempt == 1)
        m = message(1)
        assert (
            await one(store, "c", m, handler, on_failure=judge, retention_seconds=60) == "retrying"
        )
        if self.transactional:
            assert await effects.read() == []
        # A redelivery while the failure waits is a duplicate: the failure row owns it.
        assert (
            await one(store, "c", m, handler, on_failure=judge, retention_seconds=60) == "duplicate"
        )
        assert (
            await store.redrive_consume_failures(
                "c", handler, on_failure=judge, retention_seconds=60, limit=10
            )
            == []
        )  # not due yet
        await asyncio.sleep(0.35)
        assert await store.redrive_consume_failures(
            "c", handler, on_failure=judge, retention_seconds=60, limit=10
        ) == ["handled"]
        assert effects.calls == [("m-1", 1), ("m-1", 2)]
        if self.transactional:
            assert await effects.read() == ["c:m-1"]
        assert (
            await store.redrive_consume_failures(
                "c", handler, on_failure=judge, retention_seconds=60, limit=10
            )
            == []
        )
        assert (
            await one(store, "c", m, handler, on_failure=judge, retention_seconds=60) == "duplicate"
        )

    async def test_nul_and_lone_surrogates_are_consumed_as_u_fffd(
        self, store: Any, effects: Effects
    ) -> None:
        """A delivery with text no database keeps (any client can publish it) is stored,
        handled, failed and dead-lettered with U+FFFD in its place; redelivered, it is a
        duplicate. (Before: PostgreSQL refused it, MariaDB's driver and SQLite failed on a
        lone surrogate, SQLite took a NUL id for a duplicate and never ran the handler.)"""
        m = Message(
            id="m-\x00-1",
            topic="things",
            payload=b"\x00",
            key="k\x00\ud800",
            type="Thing",
            headers={"h\x00": "\udc80v\x00"},
        )
        judge = retry_after(0.05, max_attempts=1)
        handler = effects.handler(fail=lambda m, a: True)
        assert await one(store, "c", m, handler, on_failure=judge, retention_seconds=60) == "dead"
        dead = await store.get_dead_letter("m-\ufffd-1")
        assert (dead.key, dict(dead.headers), dead.payload) == (
            "k\ufffd\ufffd",
            {"h\ufffd": "\ufffdv\ufffd"},
            b"\x00",  # bytes: stored as they came
        )
        assert effects.calls == [("m-\ufffd-1", 1)]
        assert await one(store, "c", m, handler, on_failure=judge, retention_seconds=60) == (
            "duplicate"
        )

    async def test_an_id_and_key_too_long_to_index_are_consumed_as_their_digests(
        self, store: Any, effects: Effects
    ) -> None:
        """Random text over the b-tree entry limit (before: PostgreSQL's inbox retried the batch
        forever as if the database were down) and over MariaDB's 255-byte columns: stored,
        handled, failed and dead-lettered as its digest; redelivered, a duplicate."""
        long_id, long_key = os.urandom(4500).hex(), os.urandom(300).hex()
        m = Message(id=long_id, topic="things", payload=b"{}", key=long_key, type="Thing")
        judge = retry_after(0.05, max_attempts=1)
        handler = effects.handler(fail=lambda m, a: True)
        assert await one(store, "c", m, handler, on_failure=judge, retention_seconds=60) == "dead"
        digest = f"sha256:{hashlib.sha256(long_id.encode()).hexdigest()}"
        dead = await store.get_dead_letter(digest)
        assert dead.key == f"sha256:{hashlib.sha256(long_key.encode()).hexdigest()}"
        assert effects.calls == [(digest, 1)]
        assert await one(store, "c", m, handler, on_failure=judge, retention_seconds=60) == (
            "duplicate"
        )

    async def test_after_max_attempts_a_consume_dead_letter_that_replay_re_drives(
        self, store: Any, effects: Effects
    ) -> None:
        broken = {"yes": True}
        handler = effects.handler(fail=lambda m, a: broken["yes"])
        judge = retry_after(0.05, max_attempts=2)
        m = message(7, key="k7")
        assert (
            await one(store, "c", m, handler, on_failure=judge, retention_seconds=60) == "retrying"
        )
        await asyncio.sleep(0.1)
        assert await store.redrive_consume_failures(
            "c", handler, on_failure=judge, retention_seconds=60, limit=10
        ) == ["dead"]
        dead = await store.get_dead_letter("m-7")
        assert dead.direction == "consume"
        assert (dead.topic, dead.key, dead.type, dead.payload) == (
            "things",
            "k7",
            "Thing",
            m.payload,
        )
        assert dict(dead.headers) == {"h": "7"}
        assert dead.attempts == 2
        assert "gave up" in dead.failure_reason and "attempt 2" in dead.failure_reason
        page = await store.list_dead_letters(
            DeadLetterFilter(topic="things"), limit=10, cursor=None
        )
        assert [d.id for d in page.items] == ["m-7"]
        assert dead.to_json()["direction"] == "consume"
        # Given up: a redelivery has no effect either, and nothing is re-driven any more.
        assert (
            await one(store, "c", m, handler, on_failure=judge, retention_seconds=60) == "duplicate"
        )
        await asyncio.sleep(0.1)
        assert (
            await store.redrive_consume_failures(
                "c", handler, on_failure=judge, retention_seconds=60, limit=10
            )
            == []
        )
        # The bug is fixed; the operator replays the dead letter: the consumer runs it again.
        broken["yes"] = False
        assert await store.replay_dead_letters(DeadLetterFilter(ids=["m-7"])) == ["m-7"]
        assert (
            await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
        ).items == []
        if hasattr(store, "pending_messages"):
            assert store.pending_messages == []  # not re-published to the outbox
        else:
            assert (await store.stats()).pending == 0
        assert await store.redrive_consume_failures(
            "c", handler, on_failure=judge, retention_seconds=60, limit=10
        ) == ["handled"]
        assert effects.calls[-1] == ("m-7", 1)  # attempts start again
        if self.transactional:
            assert await effects.read() == ["c:m-7"]

    async def test_a_permanent_failure_is_a_dead_letter_at_once(
        self, store: Any, effects: Effects
    ) -> None:
        def judge(message: Message, attempts: int, error: Exception) -> ConsumeFailure:
            return ConsumeFailure("undecodable", None)

        handler = effects.handler(fail=lambda m, a: True)
        assert (
            await one(store, "c", message(3), handler, on_failure=judge, retention_seconds=60)
            == "dead"
        )
        dead = await store.get_dead_letter("m-3")
        assert (dead.direction, dead.attempts, dead.failure_reason) == ("consume", 1, "undecodable")
        if self.transactional:
            assert await effects.read() == []

    async def test_a_reason_quoting_a_whole_payload_is_cut_and_stored(
        self, store: Any, effects: Effects
    ) -> None:
        """A handler's error may quote its input: the reason is cut to ``MAX_REASON``
        characters (MariaDB refused a reason over its 64 KiB column, and the batch was
        retried forever), for the retrying failure and the dead letter alike."""
        quoting = "x" * 100_000

        def judge(message: Message, attempts: int, error: Exception) -> ConsumeFailure:
            return ConsumeFailure(quoting, None if message.id == "m-3" else 60.0)

        handler = effects.handler(fail=lambda m, a: True)
        outcomes = await store.consume(
            "c", [message(3), message(4)], handler, on_failure=judge, retention_seconds=60
        )
        assert outcomes == ["dead", "retrying"]  # both stored: the batch committed
        cut = quoting[: MAX_REASON - 1] + "…"
        assert (await store.get_dead_letter("m-3")).failure_reason == cut

    async def test_a_failing_message_blocks_only_its_own_key(
        self, store: InboxStore, effects: Effects
    ) -> None:
        judge = retry_after(0.2)
        handler = effects.handler(fail=lambda m, attempt: m.id == "m-1" and attempt == 1)

        async def consume(m: Message) -> str:
            return await one(store, "c", m, handler, on_failure=judge, retention_seconds=60)

        assert await consume(message(1, key="a")) == "retrying"
        assert await consume(message(2, key="a")) == "waiting"
        assert await consume(message(3, key="b")) == "handled"
        assert await consume(message(4)) == "handled"
        assert await consume(message(5, key="a")) == "waiting"
        assert await consume(message(2, key="a")) == "duplicate"

        async def drained() -> bool:
            await store.redrive_consume_failures(
                "c", handler, on_failure=judge, retention_seconds=60, limit=10
            )
            return [i for i, _ in effects.calls].count("m-5") == 1

        await wait_until(drained)
        # Key "a" ran in arrival order once its head succeeded; "b" and the unkeyed one at once.
        order = [i for i, _ in effects.calls]
        assert order == ["m-1", "m-3", "m-4", "m-1", "m-2", "m-5"]
        if self.transactional:
            assert sorted(await effects.read()) == ["c:m-1", "c:m-2", "c:m-3", "c:m-4", "c:m-5"]

    async def test_a_keys_backlog_behind_a_failure_drains_a_batch_per_round_in_order(
        self, store: InboxStore, effects: Effects
    ) -> None:
        """Found by a probe: a round re-drove one message of a key (its earliest), so 1,000
        messages waiting behind a failure took 1,000 rounds, each reading the whole backlog.
        Now a round takes the key's run behind its due head, each message only once nothing
        earlier of its key is left; a failure in the run stops the rest of it."""
        judge = retry_after(1.0)  # (0.2 s passed while a loaded machine wrote the 11)
        handler = effects.handler(
            fail=lambda m, attempt: (m.id, attempt) in {("m-0", 1), ("m-7", 1)}
        )
        outcomes = [
            await one(store, "c", message(n, key="k"), handler, on_failure=judge,
                      retention_seconds=60)
            for n in range(10)
        ] + [await one(store, "c", message(10, key="other"), handler, on_failure=judge,
                       retention_seconds=60)]  # fmt: skip
        assert outcomes == ["retrying"] + ["waiting"] * 9 + ["handled"]

        async def redrive() -> list[str]:
            return await store.redrive_consume_failures(
                "c", handler, on_failure=judge, retention_seconds=60, limit=50
            )

        assert await redrive() == []  # the head is not due yet: its key waits
        await asyncio.sleep(1.05)
        # One round: the head, then its run in order up to m-7, which fails (and stops m-8, m-9).
        assert await redrive() == ["handled"] * 7 + ["retrying"]
        assert [i for i, _ in effects.calls][-8:] == [f"m-{n}" for n in range(8)]
        assert await redrive() == []  # m-7 not due: m-8 and m-9 wait behind it
        await asyncio.sleep(1.05)
        assert await redrive() == ["handled"] * 3
        assert [i for i, _ in effects.calls][-3:] == ["m-7", "m-8", "m-9"]

    async def test_keys_failing_again_at_once_do_not_starve_a_fixed_one(
        self, store: InboxStore, effects: Effects
    ) -> None:
        """Found by a probe: a round took the due failures in arrival order, so as many keys
        failing for good as a round holds, due again at once (a retry delay under the re-drive
        interval: ``--retry-base 0.1 --retry-factor 1``), filled every round, and a key whose
        handler had been fixed, failed after them, was never re-driven. Now the failure due
        the longest goes first."""
        judge = retry_after(0.001, max_attempts=1000)
        handler = effects.handler(fail=lambda m, attempt: m.key != "fixed" or attempt == 1)
        batch = [message(n, key=f"bad{n}") for n in range(3)] + [message(3, key="fixed")]
        outcomes = [
            await one(store, "c", m, handler, on_failure=judge, retention_seconds=60) for m in batch
        ]
        assert outcomes == ["retrying"] * 4
        rounds = []
        for _ in range(3):
            await asyncio.sleep(0.01)  # (every failure due again)
            rounds.append(
                await store.redrive_consume_failures(
                    "c", handler, on_failure=judge, retention_seconds=60, limit=3
                )
            )
        assert ("m-3", 2) in effects.calls, rounds
        assert [i for i, a in effects.calls].count("m-3") == 2

    async def test_stats_count_each_consumers_retrying_and_waiting_failures(
        self, store: Any, effects: Effects
    ) -> None:
        """What an operator sees of a consumer held up by a failing key (``consume_failures``
        of ``outboxer stats``): the failing message retrying, the two behind it waiting, none
        of its dead letters; nothing once the handler is fixed and the key re-driven."""
        broken = {"yes": True}
        judge = retry_after(0.1)
        handler = effects.handler(fail=lambda m, a: broken["yes"] and m.id == "m-1")
        batch = [message(1, key="k"), message(2, key="k"), message(3, key="k")]
        outcomes = await store.consume("c", batch, handler, on_failure=judge, retention_seconds=60)
        assert outcomes == ["retrying", "waiting", "waiting"]
        # Another consumer gave up on a message: a dead letter, not a consume failure.
        give_up = effects.handler("d", fail=lambda m, a: True)
        assert (
            await one(
                store, "d", message(9), give_up, on_failure=retry_after(0, 1), retention_seconds=60
            )
            == "dead"
        )

        stats = await store.stats()
        [failing] = stats.consume_failures
        assert (failing.consumer, failing.retrying, failing.waiting) == ("c", 1, 2)
        assert 0 <= failing.oldest_age_seconds < 60
        figures = stats.to_json()["consume_failures"]
        assert list(figures) == ["c"]
        assert (figures["c"]["retrying"], figures["c"]["waiting"]) == (1, 2)
        assert stats.dead_letters == 1

        # The bug is fixed: the key drains in order, at most ``limit`` messages a round.
        broken["yes"] = False
        await asyncio.sleep(0.15)
        options: dict[str, Any] = {"on_failure": judge, "retention_seconds": 60, "limit": 1}
        assert await store.redrive_consume_failures("c", handler, **options) == ["handled"]
        [failing] = (await store.stats()).consume_failures
        assert (failing.consumer, failing.retrying, failing.waiting) == ("c", 0, 2)
        options["limit"] = 10
        assert await store.redrive_consume_failures("c", handler, **options) == ["handled"] * 2
        stats = await store.stats()
        assert (list(stats.consume_failures), stats.to_json()["consume_failures"]) == ([], {})

        # A replayed consume dead letter waits (not tried since) until its re-drive.
        assert await store.replay_dead_letters(DeadLetterFilter(ids=["m-9"])) == ["m-9"]
        [failing] = (await store.stats()).consume_failures
        assert (failing.consumer, failing.retrying, failing.waiting) == ("d", 0, 1)
        fixed = effects.handler("d")
        assert await store.redrive_consume_failures("d", fixed, **options) == ["handled"]
        assert list((await store.stats()).consume_failures) == []

    async def test_a_batch_mixes_duplicates_fresh_and_waiting_messages(
        self, store: Mode, effects: Effects
    ) -> None:
        """One recording statement answers for a whole batch: what was there already, a
        repeat within the batch, a message behind a failing key and fresh ones, in any mix,
        and a batch of duplicates only."""
        judge = retry_after(60)
        handler = effects.handler(fail=lambda m, attempt: m.id == "m-1")
        options: dict[str, Any] = {"on_failure": judge, "retention_seconds": 60}
        assert await one(store, "c", message(1, key="a"), handler, **options) == "retrying"
        assert await one(store, "c", message(2), handler, **options) == "handled"
        batch = [message(2), message(3, key="a"), message(4, key="b"), message(4), message(5)]
        outcomes = await store.consume("c", batch, handler, **options)
        assert outcomes == ["duplicate", "waiting", "handled", "duplicate", "handled"]
        again = await store.consume("c", [message(5), message(2)], handler, **options)
        assert again == ["duplicate", "duplicate"]
        assert [i for i, _ in effects.calls] == ["m-1", "m-2", "m-4", "m-5"]
        if self.transactional:  # what the handlers wrote after the duplicates committed
            assert sorted(await effects.read()) == ["c:m-2", "c:m-4", "c:m-5"]

    async def test_one_call_commits_each_message_on_its_own(
        self, store: InboxStore, effects: Effects
    ) -> None:
        """A batch goes in one call, but every message is its own transaction: a failure
        undoes only its own writes, and a later message of its key waits behind it."""
        judge = retry_after(5)
        handler = effects.handler(fail=lambda m, attempt: m.id == "m-2")
        batch = [
            message(1, key="a"),
            message(1, key="a"),
            message(2, key="b"),
            message(3, key="b"),
            message(4, key="c"),
        ]
        outcomes = await store.consume("c", batch, handler, on_failure=judge, retention_seconds=60)
        assert outcomes == ["handled", "duplicate", "retrying", "waiting", "handled"]
        if self.transactional:
            assert sorted(await effects.read()) == ["c:m-1", "c:m-4"]

    async def test_a_failure_undoes_neither_an_earlier_success_nor_a_waiting_record(
        self, store: InboxStore, effects: Effects
    ) -> None:
        """In one batch transaction: m-2's success leaves the next savepoint open, m-3 is
        recorded as waiting behind m-1 after it, then m-4 fails: rolling m-4 back must undo
        m-4 alone, or m-3 would be acknowledged with no failure row and never run."""
        judge = retry_after(0.05)
        handler = effects.handler(fail=lambda m, attempt: m.id in ("m-1", "m-4") and attempt == 1)
        assert (
            await one(
                store, "c", message(1, key="a"), handler, on_failure=judge, retention_seconds=60
            )
            == "retrying"
        )
        batch = [message(2, key="b"), message(3, key="a"), message(4, key="c")]
        outcomes = await store.consume("c", batch, handler, on_failure=judge, retention_seconds=60)
        assert outcomes == ["handled", "waiting", "retrying"]

        async def drained() -> bool:
            await store.redrive_consume_failures(
                "c", handler, on_failure=judge, retention_seconds=60, limit=10
            )
            return ("m-3", 1) in effects.calls and ("m-4", 2) in effects.calls

        await wait_until(drained)
        if self.transactional:
            assert sorted(await effects.read()) == ["c:m-1", "c:m-2", "c:m-3", "c:m-4"]

    async def test_the_sweep_counts_consume_retries_and_failures_and_purges_the_inbox(
        self, store: Any, effects: Effects
    ) -> None:
        handler = effects.handler(fail=lambda m, attempt: m.id != "m-1")
        judge = retry_after(0.01, max_attempts=2)
        first = await store.sweep(sweeper="s", interval=0, retention_seconds=0, batch_size=50)
        assert first is not None
        assert (
            await one(store, "c", message(1), handler, on_failure=judge, retention_seconds=0.2)
            == "handled"
        )
        assert (
            await one(store, "c", message(2), handler, on_failure=judge, retention_seconds=0.2)
            == "retrying"
        )
        await asyncio.sleep(0.05)
        assert await store.redrive_consume_failures(
            "c", handler, on_failure=judge, retention_seconds=0.2, limit=10
        ) == ["dead"]
        await asyncio.sleep(0.25)  # both inbox rows expire
        report = await store.sweep(sweeper="s", interval=0, retention_seconds=0, batch_size=50)
        assert report is not None
        assert (report.consume_retries, report.consume_failures) == (1, 1)
        assert (await store.last_sweep()).consume_retries == 1
        # The inbox row of m-1 is gone: a (very late) redelivery would run again.
        assert (
            await one(store, "c", message(1), handler, on_failure=judge, retention_seconds=60)
            == "handled"
        )
        again = await store.sweep(sweeper="s", interval=0, retention_seconds=0, batch_size=50)
        assert (again.consume_retries, again.consume_failures) == (0, 0)

    async def test_replay_re_drives_to_every_consumer_that_gave_up(
        self, store: Any, effects: Effects
    ) -> None:
        broken = {"yes": True}
        judge = retry_after(0.01, max_attempts=1)
        for consumer in ("c", "d"):
            handler = effects.handler(consumer, fail=lambda m, a: broken["yes"])
            assert (
                await one(
                    store, consumer, message(9), handler, on_failure=judge, retention_seconds=60
                )
                == "dead"
            )
        [dead] = (await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)).items
        assert (dead.id, dead.direction) == ("m-9", "consume")
        broken["yes"] = False
        assert await store.replay_dead_letters(DeadLetterFilter(topic="things")) == ["m-9"]
        for consumer in ("c", "d"):
            assert await store.redrive_consume_failures(
                consumer,
                effects.handler(consumer),
                on_failure=judge,
                retention_seconds=60,
                limit=10,
            ) == ["handled"]
        if self.transactional:
            assert sorted(await effects.read()) == ["c:m-9", "d:m-9"]
        assert effects.calls[-2:] == [("m-9", 1), ("m-9", 1)]


class EndedTransactionContract(InboxStoreContract):
    """The SQL stores: a handler can end the inbox's transaction (the in-memory one has none)."""

    @pytest.mark.parametrize("how", ["commit", "rollback", "close"])
    async def test_a_handler_that_ends_the_inbox_transaction_stops_the_batch_and_loses_nothing(
        self, store: Mode, effects: Effects, end: Callable[[Any, str], Awaitable[None]], how: str
    ) -> None:
        """The handler of the 3rd of 5 messages commits, rolls back or closes ctx.connection.
        Before: after a commit the batch's inbox rows (recorded by its first statement) were
        committed, the chunk failed and was retried, and m-4 and m-5 came back as duplicates,
        never handled; a rollback or a close was retried as a database outage, forever (on
        SQLite the store's one connection stayed closed). Now the batch fails with
        HandlerEndedTransaction (no outage: no retry in place), what the commit committed
        stays, m-4 and m-5 are not recorded, and the redelivery handles each message once."""
        record = effects.handler()

        async def careless(message: Message, connection: Any, attempt: int) -> None:
            await record(message, connection, attempt)
            if message.id == "m-3":
                await end(connection, how)

        batch = [message(n, key=f"k{n}") for n in range(1, 6)]
        options: dict[str, Any] = {"on_failure": retry_after(9), "retention_seconds": 60}
        with pytest.raises(HandlerEndedTransaction, match=r"'m-3'.*ctx\.connection") as ended:
            await store.consume("c", batch, careless, **options)
        assert ended.value.message_id == "m-3"
        assert ended.value.closed == (how == "close")
        committed = ["c:m-1", "c:m-2", "c:m-3"] if how == "commit" else []
        if not store._single:  # a transaction per message: m-1 and m-2 committed on their own
            committed = ["c:m-1", "c:m-2", *committed[2:]]
        assert await effects.read() == committed
        # The broker delivers the batch again (nothing was acknowledged), to a fixed handler.
        outcomes = await store.consume("c", batch, record, **options)
        done = len(committed)
        assert outcomes == ["duplicate"] * done + ["handled"] * (5 - done)
        assert await effects.read() == [f"c:m-{n}" for n in range(1, 6)]
        assert await store.consume("c", batch, record, **options) == ["duplicate"] * 5

    async def test_two_instances_re_driving_a_keys_backlog_keep_its_order(
        self, store: Any, effects: Effects
    ) -> None:
        """Two instances of one consumer re-drive the same key's backlog at once (rounds that
        take a key's whole run): a message is locked only once nothing earlier of its key is
        left, so the run is handled once each, in order, however the rounds interleave."""
        judge = retry_after(0.1)
        flaky = effects.handler(fail=lambda m, attempt: m.id == "m-0" and attempt == 1)

        running: list[str] = []
        overlaps: list[tuple[str, ...]] = []

        async def handler(message: Message, connection: Any, attempt: int) -> None:
            if running:  # another message of the key is being handled right now
                overlaps.append((*running, message.id))
            running.append(message.id)
            try:
                await asyncio.sleep(0.002)  # let the other instance's round interleave
                await flaky(message, connection, attempt)
            finally:
                running.remove(message.id)

        for n in range(30):
            await one(store, "c", message(n, key="k"), handler, on_failure=judge,
                      retention_seconds=60)  # fmt: skip
        await asyncio.sleep(0.15)

        async def instance() -> None:
            for _ in range(100):
                if [i for i, _ in effects.calls].count("m-29") == 1:
                    return
                await store.redrive_consume_failures(
                    "c", handler, on_failure=judge, retention_seconds=60, limit=20
                )
                await asyncio.sleep(0.001)

        await asyncio.gather(instance(), instance())
        assert overlaps == []  # never two of the key at once
        expected = [f"c:m-{n}" for n in range(30)]
        assert await effects.read() == expected  # each once (m-0's failure undone), in order

    async def test_a_re_drive_whose_handler_commits_the_transaction_fails_and_stays(
        self, store: Mode, effects: Effects, end: Callable[[Any, str], Awaitable[None]]
    ) -> None:
        """A re-drive is one transaction holding the failure row: a handler that commits it
        raises HandlerEndedTransaction; the failure stays and is re-driven again (the effect
        the handler committed repeats once, as documented)."""
        judge = retry_after(0)
        record = effects.handler(fail=lambda m, attempt: attempt == 1)
        assert await one(
            store, "c", message(1), record, on_failure=judge, retention_seconds=60
        ) == ("retrying")

        async def committing(message: Message, connection: Any, attempt: int) -> None:
            await record(message, connection, attempt)
            await end(connection, "commit")

        with pytest.raises(HandlerEndedTransaction):
            await store.redrive_consume_failures(
                "c", committing, on_failure=judge, retention_seconds=60, limit=10
            )
        assert await effects.read() == ["c:m-1"]  # attempt 2, committed by the handler
        assert await store.redrive_consume_failures(
            "c", record, on_failure=judge, retention_seconds=60, limit=10
        ) == ["handled"]
        assert await effects.read() == ["c:m-1", "c:m-1"]
        assert await one(
            store, "c", message(1), record, on_failure=judge, retention_seconds=60
        ) == ("duplicate")


class ConcurrentRedriveContract:
    """Stores whose re-drives of different keys run side by side (row locks: not SQLite)."""

    async def test_a_key_whose_first_failure_is_held_does_not_stall_other_keys(
        self, store: Any, effects: Effects
    ) -> None:
        """Found by a probe: a round took the first 50 due failures by arrival, so while one
        instance re-drove a key's first failure (a slow handler), the 49 waiting behind it,
        none of which can be locked, filled every instance's round and the other keys'
        failures waited for it. Every key's first now comes before any key's second."""
        judge = retry_after(0.1)
        holding, release = asyncio.Event(), asyncio.Event()

        async def handler(message: Message, connection: Any, attempt: int) -> None:
            if message.id in ("m-0", "m-100") and attempt == 1:
                raise RuntimeError("first attempt fails")
            if message.id == "m-0":
                holding.set()
                await release.wait()  # a slow re-drive of key k's first failure
            await effects.record(connection, "c", message.id)

        options: dict[str, Any] = {"on_failure": judge, "retention_seconds": 60}
        for n in range(60):
            await one(store, "c", message(n, key="k"), handler, **options)
        assert await one(store, "c", message(100, key="other"), handler, **options) == "retrying"
        await asyncio.sleep(0.15)
        slow = asyncio.create_task(store.redrive_consume_failures("c", handler, limit=1, **options))
        await asyncio.wait_for(holding.wait(), 10)
        try:  # another instance's round, while m-0 is held
            assert await store.redrive_consume_failures("c", handler, limit=50, **options) == [
                "handled"
            ]
            assert await effects.read() == ["c:m-100"]
        finally:
            release.set()
        assert await slow == ["handled"]


class TestInMemoryInbox(InboxStoreContract):
    transactional = False

    @pytest.fixture
    def raw_store(self) -> InMemoryStore:
        return InMemoryStore()

    @pytest.fixture
    def effects(self) -> Effects:
        rows: list[str] = []

        async def record(connection: Any, consumer: str, message_id: str) -> None:
            assert connection is None
            rows.append(f"{consumer}:{message_id}")

        async def read() -> list[str]:
            return list(rows)

        return Effects(record, read)


class TestSqliteInbox(EndedTransactionContract):
    @pytest.fixture
    def end(self) -> Callable[[Any, str], Awaitable[None]]:
        async def end(connection: Any, how: str) -> None:
            await getattr(connection, how)()  # aiosqlite: commit(), rollback(), close()

        return end

    async def test_a_handler_that_closes_the_connection_leaves_the_store_working(
        self, raw_store: SqliteStore, effects: Effects
    ) -> None:
        """Before, the store's one connection stayed closed after a handler closed it, and
        every later batch (and everything else the store did) failed with ValueError; now the
        store opens a new one."""

        async def closing(message: Message, connection: Any, attempt: int) -> None:
            await connection.close()

        options: dict[str, Any] = {"on_failure": retry_after(9), "retention_seconds": 60}
        with pytest.raises(HandlerEndedTransaction, match=r"closed ctx\.connection"):
            await consume(raw_store, "c", [message(1)], closing, **options)
        assert await consume(raw_store, "c", [message(1)], effects.handler(), **options) == [
            "handled"
        ]
        assert (await raw_store.stats()).pending == 0

    @pytest.fixture
    async def raw_store(self, sqlite_store: SqliteStore) -> SqliteStore:
        await sqlite_store.execute("CREATE TABLE effects (consumer TEXT, message_id TEXT)")
        return sqlite_store

    @pytest.fixture
    def effects(self, raw_store: SqliteStore) -> Effects:
        store = raw_store

        async def record(connection: Any, consumer: str, message_id: str) -> None:
            await connection.execute("INSERT INTO effects VALUES (?, ?)", (consumer, message_id))

        async def read() -> list[str]:
            rows = await store.execute("SELECT consumer, message_id FROM effects ORDER BY rowid")
            return [f"{r[0]}:{r[1]}" for r in rows]

        return Effects(record, read)


class TestPostgresInbox(EndedTransactionContract, ConcurrentRedriveContract):
    @pytest.fixture
    def end(self) -> Callable[[Any, str], Awaitable[None]]:
        async def end(connection: Any, how: str) -> None:
            if how == "close":
                await connection.close()
            else:
                await connection.execute(how.upper())

        return end

    @pytest.fixture
    async def raw_store(self, pg_store: PostgresStore, pg_schema: str) -> PostgresStore:
        await pg_store.execute(
            f'CREATE TABLE "{pg_schema}".effects (n serial, consumer text, message_id text)'
        )
        return pg_store

    @pytest.fixture
    def effects(self, raw_store: PostgresStore, pg_schema: str) -> Effects:
        store = raw_store

        async def record(connection: Any, consumer: str, message_id: str) -> None:
            await connection.execute(
                f'INSERT INTO "{pg_schema}".effects (consumer, message_id) VALUES ($1, $2)',
                consumer,
                message_id,
            )

        async def read() -> list[str]:
            rows = await store.execute(
                f'SELECT consumer, message_id FROM "{pg_schema}".effects ORDER BY n'
            )
            return [f"{r[0]}:{r[1]}" for r in rows]

        return Effects(record, read)

    @pytest.fixture(autouse=True)
    def plain_inserts(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Each test starts recording batches with a plain INSERT: a redelivery in an earlier
        test of this process would have switched to ``ON CONFLICT`` for a minute."""
        monkeypatch.setattr(postgres_inbox._Session, "plain_insert_from", 0.0)

    async def test_after_a_redelivered_batch_batches_go_with_on_conflict_for_a_while(
        self, store: Mode, effects: Effects
    ) -> None:
        """A redelivered batch fails the plain INSERT (two round trips and an error line in the
        server's log); redeliveries come in runs, so for the next minute batches are recorded
        with ON CONFLICT instead, and still judged the same."""
        handler = effects.handler()
        options: dict[str, Any] = {"on_failure": retry_after(60), "retention_seconds": 60}
        first = await store.consume("c", [message(1), message(2)], handler, **options)
        assert first == ["handled", "handled"]
        assert postgres_inbox._Session.plain_insert_from == 0.0  # no conflict met yet
        before = time.monotonic()
        again = await store.consume("c", [message(2), message(3)], handler, **options)
        assert again == ["duplicate", "handled"]
        window = postgres_inbox._Session.plain_insert_from - before
        assert postgres_inbox.REDELIVERY_WINDOW <= window < postgres_inbox.REDELIVERY_WINDOW + 5
        more = await store.consume("c", [message(3), message(4)], handler, **options)
        assert more == ["duplicate", "handled"]
        assert await effects.read() == ["c:m-1", "c:m-2", "c:m-3", "c:m-4"]

    async def test_a_new_batch_costs_two_round_trips(
        self, pg_url: str, pg_schema: str, raw_store: PostgresStore
    ) -> None:
        """BEGIN, the recording and the handlers' savepoint go in one round trip, COMMIT in the
        other: counted on the one connection of a pool of one, by a handler that takes the
        connection and runs nothing."""
        seen: list[int | None] = []

        async def counting(message: Message, connection: Any, attempt: int) -> None:
            assert connection.is_in_transaction()
            seen.append(statements_run(connection))

        names = TableNames(schema=pg_schema)
        async with PostgresStore(pg_url, names, max_connections=1) as store:
            for n in range(3):
                batch = [message(2 * n, key="a"), message(2 * n + 1, key="b")]
                outcomes = await consume(
                    store, "c", batch, counting, on_failure=retry_after(9), retention_seconds=60
                )
                assert outcomes == ["handled", "handled"]
        assert postgres_inbox._Session.plain_insert_from == 0.0  # never fell back
        first, *_ = seen
        assert first is not None
        # the two handlers of a batch: no round trip between them; one batch to the next: two
        assert seen == [first, first, first + 2, first + 2, first + 4, first + 4]

    async def test_any_text_in_ids_and_keys_goes_the_one_round_trip_way(
        self, store: Mode, effects: Effects
    ) -> None:
        """The batch's ids and keys travel as SQL literals in that round trip: quotes,
        backslashes, JSON escapes and non-ASCII text arrive as they were sent."""
        odd = ["it's", "back\\slash", 'quo"te', "\\'; DROP TABLE x; --", "ünï €", "\u2028"]
        batch = [
            dataclasses.replace(message(n), id=f"{text}-{n}", key=text)
            for n, text in enumerate(odd)
        ]
        options: dict[str, Any] = {"on_failure": retry_after(9), "retention_seconds": 60}
        assert await store.consume("c", batch, effects.handler(), **options) == ["handled"] * 6
        assert postgres_inbox._Session.plain_insert_from == 0.0  # no fallback was needed
        assert await effects.read() == [f"c:{m.id}" for m in batch]
        again = await store.consume("c", batch, effects.handler(), **options)
        assert again == ["duplicate"] * 6

    async def test_a_handler_that_deallocates_prepared_statements_does_not_stop_the_inbox(
        self, pg_url: str, pg_schema: str, raw_store: PostgresStore
    ) -> None:
        """The recording statement is prepared on the connection (PREPARE): after a handler
        ran DEALLOCATE ALL the next batch prepares it again, and nothing is lost."""
        names = TableNames(schema=pg_schema)
        handled: list[str] = []

        async def deallocating(message: Message, connection: Any, attempt: int) -> None:
            await connection.execute("DEALLOCATE ALL")
            handled.append(message.id)

        async with PostgresStore(pg_url, names, max_connections=1) as store:
            for n in range(3):
                outcomes = await consume(
                    store,
                    "c",
                    [message(n)],
                    deallocating,
                    on_failure=retry_after(9),
                    retention_seconds=60,
                )
                assert outcomes == ["handled"]
        assert handled == ["m-0", "m-1", "m-2"]
        assert postgres_inbox._Session.plain_insert_from == 0.0

    async def test_a_handler_that_swallows_a_database_error_fails_instead_of_vanishing(
        self, store: PostgresStore, effects: Effects
    ) -> None:
        """PostgreSQL answers COMMIT in an aborted transaction with a silent ROLLBACK: without
        the explicit savepoint release the message would count as handled with no inbox row."""

        async def swallowing(message: Message, connection: Any, attempt: int) -> None:
            await effects.record(connection, "c", message.id)
            with contextlib.suppress(asyncpg.DivisionByZeroError):
                await connection.execute("SELECT 1/0")  # the transaction is aborted now

        outcome = await one(
            store, "c", message(1), swallowing, on_failure=retry_after(9), retention_seconds=60
        )
        assert outcome == "retrying"
        assert await effects.read() == []
        rows = await store.execute("SELECT attempts, last_error FROM {inbox_failures}")
        assert rows[0][0] == 1 and "transaction is aborted" in rows[0][1]

    async def test_handlers_may_open_nested_transactions(
        self, store: PostgresStore, effects: Effects
    ) -> None:
        """``ctx.connection.transaction()`` in a handler is a savepoint inside the inbox's."""

        async def nested(message: Message, connection: Any, attempt: int) -> None:
            async with connection.transaction():
                await effects.record(connection, "c", message.id)
            if message.id == "m-2":
                raise RuntimeError("after the nested block: undone all the same")

        outcomes = await store.consume(
            "c", [message(1), message(2)], nested, on_failure=retry_after(9), retention_seconds=60
        )
        assert outcomes == ["handled", "retrying"]
        assert await effects.read() == ["c:m-1"]

    @pytest.mark.parametrize("how", ["execute", "prepared", "cursor", "executemany", "copy"])
    async def test_a_write_by_any_query_path_survives_a_later_failure(
        self, store: PostgresStore, pg_schema: str, effects: Effects, how: str
    ) -> None:
        """A handler that ran no statement leaves its savepoint to the next one (no round
        trip); one that wrote, by whichever asyncpg call, gets it renewed: rolling the next
        handler's failure back must not undo its write."""
        table = f'"{pg_schema}".effects'
        insert = f"INSERT INTO {table} (consumer, message_id) VALUES ($1, $2)"

        async def write(connection: Any, message_id: str) -> None:
            if how == "execute":
                await connection.execute(insert, "c", message_id)
            elif how == "prepared":
                await (await connection.prepare(insert + " RETURNING n")).fetch("c", message_id)
            elif how == "cursor":
                async with connection.transaction():
                    cursor = await connection.cursor(insert + " RETURNING n", "c", message_id)
                    await cursor.fetch(1)
            elif how == "executemany":
                await connection.executemany(insert, [("c", message_id)])
            else:
                await connection.copy_records_to_table(
                    "effects",
                    records=[("c", message_id)],
                    columns=["consumer", "message_id"],
                    schema_name=pg_schema,
                )

        async def handler(message: Message, connection: Any, attempt: int) -> None:
            if message.id == "m-2":
                return  # takes the connection, runs nothing
            if message.id == "m-4":
                await effects.record(connection, "c", message.id)
                raise RuntimeError("fails after writing")
            await write(connection, message.id)

        batch = [message(1), message(2), message(3), message(4)]
        outcomes = await store.consume(
            "c", batch, handler, on_failure=retry_after(9), retention_seconds=60
        )
        assert outcomes == ["handled", "handled", "handled", "retrying"]
        assert sorted(await effects.read()) == ["c:m-1", "c:m-3"]

    async def test_handlers_that_run_no_statement_share_one_savepoint(
        self, raw_store: PostgresStore
    ) -> None:
        """Handlers that take the connection but do not use it cost no round trip each: a
        batch of them is BEGIN, the inbox rows, one SAVEPOINT, COMMIT."""
        queries: list[str] = []
        logging = False

        def log(query: Any) -> None:
            if logging:
                queries.append(query.query.split()[0])

        async def handler(message: Message, connection: Any, attempt: int) -> None:
            nonlocal logging
            if not logging:  # from the first handler on, after the SAVEPOINT
                logging = True
                connection.add_query_logger(log)

        batch = [message(n) for n in range(1, 6)]
        outcomes = await consume(
            raw_store, "c", batch, handler, on_failure=retry_after(9), retention_seconds=60
        )
        logging = False
        assert outcomes == ["handled"] * 5
        assert queries[0] == "COMMIT;"

    async def test_the_pool_resets_a_connection_only_after_a_handler_used_it(
        self, raw_store: PostgresStore, pg_url: str, pg_schema: str
    ) -> None:
        """The pool's reset costs a round trip per chunk: it is skipped when no handler ran a
        statement (the inbox's own change no session state), kept when one did (a ``SET``
        must not outlive the chunk)."""
        async with PostgresStore(pg_url, TableNames(schema=pg_schema), max_connections=1) as one:
            resets: list[str] = []

            async def setting(message: Message, connection: Any, attempt: int) -> None:
                if not resets:
                    connection.add_query_logger(lambda q: resets.append(q.query))
                if message.id == "m-2":
                    await connection.execute("SET statement_timeout = '1234ms'")

            for n in (1, 2):
                outcomes = await consume(
                    one, "c", [message(n)], setting, on_failure=retry_after(9), retention_seconds=60
                )
                assert outcomes == ["handled"]
            assert sum("RESET ALL" in q for q in resets) == 1  # after m-2's chunk only
            rows = await one.execute("SHOW statement_timeout")
            assert rows[0][0] == "0"  # the handler's SET was reset

    async def test_concurrent_deliveries_of_one_message_run_the_handler_once(
        self, pg_url: str, pg_schema: str, store: PostgresStore, effects: Effects
    ) -> None:
        """Two instances of one consumer receive the same message at the same moment (a Redis
        reclaim, a Kafka rebalance): the second waits on the first's inbox row, then skips."""
        started = asyncio.Event()
        release = asyncio.Event()

        async def slow(message: Message, connection: Any, attempt: int) -> None:
            await effects.record(connection, "c", message.id)
            started.set()
            await release.wait()

        async with PostgresStore(pg_url, TableNames(schema=pg_schema)) as other:
            first = asyncio.create_task(
                one(store, "c", message(1), slow, on_failure=retry_after(1), retention_seconds=60)
            )
            await started.wait()
            second = asyncio.create_task(
                one(other, "c", message(1), slow, on_failure=retry_after(1), retention_seconds=60)
            )
            await asyncio.sleep(0.2)
            assert not second.done()  # blocked on the first transaction's inbox row
            release.set()
            assert await first == "handled"
            assert await second == "duplicate"
        assert await effects.read() == ["c:m-1"]


class TestMysqlInbox(EndedTransactionContract, ConcurrentRedriveContract):
    @pytest.fixture
    def end(self) -> Callable[[Any, str], Awaitable[None]]:
        async def end(connection: Any, how: str) -> None:
            if how == "close":
                await connection.ensure_closed()
            else:
                await getattr(connection, how)()  # asyncmy: commit(), rollback()

        return end

    @pytest.fixture
    async def raw_store(self, mysql_store: MysqlStore, mysql_database: str) -> MysqlStore:
        await mysql_store.execute(
            f"CREATE TABLE `{mysql_database}`.effects "
            "(n INT AUTO_INCREMENT PRIMARY KEY, consumer VARCHAR(64), message_id VARCHAR(64))"
        )
        return mysql_store

    @pytest.fixture
    def effects(self, raw_store: MysqlStore, mysql_database: str) -> Effects:
        store = raw_store

        async def record(connection: Any, consumer: str, message_id: str) -> None:
            async with connection.cursor() as cursor:
                await cursor.execute(
                    f"INSERT INTO `{mysql_database}`.effects (consumer, message_id) "
                    "VALUES (%s, %s)",
                    (consumer, message_id),
                )

        async def read() -> list[str]:
            rows = await store.execute(
                f"SELECT consumer, message_id FROM `{mysql_database}`.effects ORDER BY n"
            )
            return [f"{r['consumer']}:{r['message_id']}" for r in rows]

        return Effects(record, read)

    async def test_a_failed_payload_over_max_allowed_packet_is_dead_lettered_without_it(
        self, store: Any, effects: Effects
    ) -> None:
        """A failed message whose payload makes a statement over the server's
        ``max_allowed_packet`` is stored without it, dead at once (it can never be handled
        again without its payload), the reason saying why; the batch commits. Before, the
        server refused the failure row, the batch failed with StoreError, and the broker
        delivered it again, forever. One byte over the limit, or half of it in bytes asyncmy
        escapes as two: both payloads the server would refuse; 2 MiB is stored and re-driven."""
        [row] = await store.execute("SELECT @@max_allowed_packet AS packet")
        limit = int(row["packet"])
        huge = dataclasses.replace(message(1), payload=b"x" * (limit + 1))
        half = dataclasses.replace(message(2, key="k"), payload=b"'" * (limit // 2 + 1))
        fits = dataclasses.replace(message(3), payload=bytes(range(256)) * (2 << 12))
        # nothing asyncmy escapes: three quarters of the limit fit (a bound of 2x dropped it)
        plain = dataclasses.replace(message(5, key="p"), payload=b"x" * (limit * 3 // 4))
        # waiting behind m-5's failure, too large to be kept for later: dead, without running
        behind = dataclasses.replace(message(7, key="p"), payload=b"x" * (limit + 1))
        # headers over the limit on their own: left out too (else the batch failed forever)
        loud = dataclasses.replace(message(6), headers={"h": '"' * (limit // 3)})
        failing = effects.handler(fail=lambda m, attempt: m.id != "m-4" and attempt == 1)
        payloads: dict[tuple[str, int], int] = {}  # (id, attempt): the payload's length

        async def handler(message: Message, connection: Any, attempt: int) -> None:
            payloads[message.id, attempt] = len(message.payload)
            await failing(message, connection, attempt)

        def judge(message: Message, attempts: int, error: Exception) -> ConsumeFailure:
            return ConsumeFailure(f"failed: {error}", None if message.id == "m-1" else 0.05)

        outcomes = await store.consume(
            "c",
            [huge, half, fits, message(4), plain, loud, behind],
            handler,
            on_failure=judge,
            retention_seconds=60,
        )
        # (m-2's policy said retry: without its payload it cannot be, it is dead)
        assert outcomes == ["dead", "dead", "retrying", "handled", "retrying", "dead", "dead"]
        failed = "failed: handler failed on attempt 1; "
        over = f" over max_allowed_packet ({limit:,}); not stored"
        reason = failed + "payload of {:,} bytes" + over
        behind_reason = "waiting behind an earlier failed message of key 'p'; "
        behind_reason += f"payload of {limit + 1:,} bytes{over}"
        headers = len(encode_headers(loud.headers).encode())
        loud_reason = f"{failed}payload of {len(loud.payload):,} bytes and headers of "
        loud_reason += f"{headers:,} bytes{over}"
        failures = await store.execute(
            "SELECT message_id, state, LENGTH(payload) AS n, headers, last_error "
            "FROM {inbox_failures} ORDER BY message_id"
        )
        once = "failed: handler failed on attempt 1"
        assert [tuple(f.values()) for f in failures] == [
            ("m-1", "dead", 0, encode_headers(huge.headers), reason.format(limit + 1)),
            ("m-2", "dead", 0, encode_headers(half.headers), reason.format(limit // 2 + 1)),
            ("m-3", "retrying", len(fits.payload), encode_headers(fits.headers), once),
            ("m-5", "retrying", len(plain.payload), encode_headers(plain.headers), once),
            ("m-6", "dead", 0, "{}", loud_reason),
            ("m-7", "dead", 0, encode_headers(behind.headers), behind_reason),
        ]
        dead = await store.execute(
            "SELECT id, LENGTH(payload) AS n, failure_reason FROM {dead_letters} ORDER BY id"
        )
        assert [tuple(d.values()) for d in dead] == [
            ("m-1", 0, reason.format(limit + 1)),
            ("m-2", 0, reason.format(limit // 2 + 1)),
            ("m-6", 0, loud_reason),
            ("m-7", 0, behind_reason),
        ]
        await asyncio.sleep(0.1)
        redriven = await store.redrive_consume_failures(
            "c", handler, on_failure=judge, retention_seconds=60, limit=10
        )
        assert redriven == ["handled", "handled"]  # nothing else is due
        assert payloads == {
            ("m-1", 1): limit + 1,
            ("m-2", 1): limit // 2 + 1,
            ("m-3", 1): 2 << 20,
            ("m-4", 1): len(message(4).payload),
            ("m-5", 1): len(plain.payload),
            ("m-6", 1): len(loud.payload),
            ("m-3", 2): 2 << 20,  # re-driven with its payload whole
            ("m-5", 2): len(plain.payload),
        }
