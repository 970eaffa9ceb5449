"""Handlers through the inbox: typed payloads, the handler context, batches, outages.

The registry's calling convention is checked on its own and through both users of a registry:
the in-process publisher and the inbox (in-memory, SQLite and PostgreSQL stores).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
from typing import Any

import asyncpg
import pydantic
import pytest

import outboxer
from outboxer.brokers.inprocess.publisher import InProcessPublisher
from outboxer.config import Backoff, TableNames
from outboxer.errors import (
    ConfigurationError,
    PermanentPublishError,
    RetryablePublishError,
    StoreUnavailable,
)
from outboxer.inbox import (
    ConsumerStopping,
    HandlerContext,
    HandlerRegistry,
    Inbox,
    InboxSettings,
    PermanentHandlerError,
    UndecodablePayload,
)
from outboxer.inbox.consumer import Deliveries, run_consumer
from outboxer.message import Message, encode_payload
from outboxer.ports import MAX_REASON, DeadLetterFilter
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.sqlite import SqliteStore
from outboxer.testing import InMemoryStore
from tests.acceptance.conftest import PYTHONPATH
from tests.conftest import mysql_connect, unique_name
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(30)


@dataclasses.dataclass(frozen=True)
class UserRegistered:
    user_id: int
    email: str


class OrderCreated(pydantic.BaseModel):
    order_id: int
    item: str


def event(payload: object, type: str | None = None, **fields: Any) -> Message:
    body, content_type = encode_payload(payload)
    fields.setdefault("id", f"id-{time.monotonic_ns()}")
    return Message(topic="t", payload=body, content_type=content_type, type=type, **fields)


# -- the registry's calling convention ---------------------------------------------------------


def test_payloads_are_decoded_into_the_annotated_type() -> None:
    registry = HandlerRegistry()
    seen: list[object] = []

    @registry.handler()  # the type is the annotation's class name
    def welcome(user: UserRegistered) -> None:
        seen.append(user)

    @registry.handler()
    def ship(order: OrderCreated, ctx: HandlerContext) -> None:
        seen.append((order, ctx.message.type, ctx.attempt))

    @registry.handler(topic="raw")
    def raw(message: Message) -> None:
        seen.append(message.id)

    @registry.handler("AsDict")
    def as_dict(data: dict[str, Any]) -> None:
        seen.append(data)

    @registry.handler("AsText")
    def as_text(text: str, ctx: HandlerContext) -> None:
        seen.append(text)

    # A newer producer added a field: a tolerant reader ignores it.
    user = event({"user_id": 1, "email": "a@example.com", "plan": "pro"}, "UserRegistered")
    order = event(OrderCreated(order_id=7, item="book"), "OrderCreated")
    for message in (user, order, event(b"\x00", id="r1"), event({"k": 1}, "AsDict")):
        message = dataclasses.replace(message, topic="raw") if message.id == "r1" else message
        for handler in registry.handlers_for(message):
            registry.call(handler, message, HandlerContext(message, attempt=3))
    text = event("hello", "AsText")
    [handler] = registry.handlers_for(text)
    registry.call(handler, text, HandlerContext(text))
    assert seen == [
        UserRegistered(1, "a@example.com"),
        (OrderCreated(order_id=7, item="book"), "OrderCreated", 3),
        "r1",
        {"k": 1},
        "hello",
    ]


def test_a_payload_that_does_not_fit_is_a_permanent_failure() -> None:
    registry = HandlerRegistry()
    registry.register(lambda user: None, "Lambda")  # unannotated: the Message

    @registry.handler()
    def welcome(user: UserRegistered) -> None:
        raise AssertionError("not reached")

    @registry.handler()
    def ship(order: OrderCreated) -> None:
        raise AssertionError("not reached")

    for bad in (
        event({"user_id": 1}, "UserRegistered"),  # a required field is missing
        event([1, 2], "UserRegistered"),  # not an object
        event(b"\xff not json", "UserRegistered"),
        event({"order_id": "x", "item": "book"}, "OrderCreated"),  # pydantic refuses
    ):
        [handler] = registry.handlers_for(bad)
        with pytest.raises(UndecodablePayload, match="does not decode"):
            registry.call(handler, bad, HandlerContext(bad))
    assert issubclass(UndecodablePayload, PermanentHandlerError)


def test_classes_and_callable_objects_are_handlers() -> None:
    registry = HandlerRegistry()
    calls: list[str] = []

    @registry.handler("UserRegistered")
    class SendWelcomeEmail:
        def __call__(self, user: UserRegistered, ctx: HandlerContext) -> None:
            calls.append(f"class:{user.email}")

    class Audit:
        def __init__(self, prefix: str) -> None:
            self.prefix = prefix

        async def __call__(self, user: UserRegistered) -> None:
            calls.append(f"{self.prefix}:{user.user_id}")

    audit = registry.register(Audit("audit"))  # type inferred from the annotation
    assert isinstance(SendWelcomeEmail, type)  # the decorator leaves the class in place
    assert registry.is_async(audit)
    message = event({"user_id": 5, "email": "e@example.com"}, "UserRegistered")
    for handler in registry.handlers_for(message):
        result = registry.call(handler, message, HandlerContext(message))
        if registry.is_async(handler):
            asyncio.run(result)
    assert calls == ["class:e@example.com", "audit:5"]


async def test_a_handler_registered_after_a_message_was_routed_runs_too() -> None:
    """The inbox looks handlers up through a route worked out once per (type, topic); a later
    registration for that type must not be missed, nor make the context-taking one lose it."""
    registry = HandlerRegistry()
    calls: list[str] = []

    @registry.handler("Step")
    async def first(data: dict[str, int]) -> None:
        calls.append(f"first:{data['n']}")

    inbox = Inbox(InMemoryStore(), registry, settings())
    assert await inbox.receive(event({"n": 1}, "Step")) == "handled"
    route = registry.route(event({"n": 0}, "Step"))
    assert route is not None and not route.wants_context

    @registry.handler("Step")
    async def second(data: dict[str, int], ctx: HandlerContext) -> None:
        calls.append(f"second:{data['n']}:{ctx.attempt}")

    assert registry.wants_context(event({"n": 0}, "Step"))
    assert await inbox.receive(event({"n": 2}, "Step")) == "handled"
    assert registry.route(event({"n": 0}, "Other")) is None
    assert await inbox.receive(event({"n": 3}, "Other")) == "ignored"
    assert calls == ["first:1", "first:2", "second:2:1"]


def test_registration_refuses_what_it_cannot_call() -> None:
    registry = HandlerRegistry()
    with pytest.raises(ConfigurationError, match="type or a topic"):
        registry.register(lambda message: None)
    with pytest.raises(ConfigurationError, match=r"\(payload\) or \(payload, ctx\)"):
        registry.register(lambda a, b, c: None, "T")
    with pytest.raises(ConfigurationError, match="cannot decode"):

        @registry.handler("T")
        def wrong(value: int) -> None: ...

    with pytest.raises(ConfigurationError, match="not callable"):
        registry.register(42, "T")  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_handler_registered_twice_for_one_type_is_refused_not_run_twice(
    kind: str, tmp_path: pathlib.Path
) -> None:
    # register(h, "T") twice (a decorator and a register() call, say) ran h twice per message:
    # two e-mails for one event, through an inbox meant to make effects happen once (a probe).
    registry = HandlerRegistry()
    calls: list[str] = []

    @registry.handler("UserRegistered", topic="users")
    def welcome(user: UserRegistered) -> None:
        calls.append(user.email)

    with pytest.raises(ConfigurationError, match="already registered for type 'UserRegistered'"):
        registry.register(welcome, "UserRegistered")
    with pytest.raises(ConfigurationError, match="already registered for topic 'users'"):
        registry.register(welcome, topic="users")
    registry.register(welcome, "UserMigrated")  # another type: fine
    message = event({"user_id": 1, "email": "once@example.com"}, "UserRegistered")
    async with contextlib.AsyncExitStack() as stack:
        store: InMemoryStore | SqliteStore = InMemoryStore()
        if kind == "sqlite":
            store = await stack.enter_async_context(SqliteStore(tmp_path / "inbox.db"))
            await store.migrate()
        assert await Inbox(store, registry, settings()).receive(message) == "handled"
    assert calls == ["once@example.com"]


def test_payload_annotations_are_resolved_or_refused() -> None:
    """This module uses ``from __future__ import annotations``: annotations are strings."""
    registry = HandlerRegistry()

    @dataclasses.dataclass
    class Local:  # defined in a function: its name cannot be resolved from the handler
        n: int

    with pytest.raises(ConfigurationError, match="cannot resolve the payload annotation 'Local'"):

        @registry.handler("Local")
        def local(event: Local) -> None: ...

    # An unresolvable annotation elsewhere (ctx) does not matter: the payload type resolves.
    @registry.handler()
    def welcome(user: UserRegistered, ctx: NotImportedAtRuntime) -> None:  # type: ignore[name-defined]  # noqa: F821
        seen.append(user.email)

    seen: list[str] = []
    message = event({"user_id": 1, "email": "x@example.com"}, "UserRegistered")
    registry.call(welcome, message, HandlerContext(message))
    assert seen == ["x@example.com"]


def welcome_in(user: UserRegistered, ctx: HandlerContext, *, seen: list[str], tag: str) -> None:
    seen.append(f"{tag}:{user.email}:{ctx.attempt}")


async def audit_in(user: UserRegistered, *, seen: list[str]) -> None:
    seen.append(f"audit:{user.user_id}")


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_partial_of_a_handler_gets_its_annotated_payload(
    kind: str, tmp_path: pathlib.Path
) -> None:
    # functools.partial(handler, ...) took no annotation (the partial's __call__ has none): the
    # handler was given the Message instead of the dataclass, and `user.id`-like reads of the
    # payload quietly read the message's own fields (a probe).
    registry = HandlerRegistry()
    seen: list[str] = []
    registry.register(functools.partial(welcome_in, seen=seen, tag="welcome"))  # type inferred
    registry.register(functools.partial(audit_in, seen=seen), "UserRegistered")
    message = event({"user_id": 7, "email": "p@example.com"}, "UserRegistered")
    async with contextlib.AsyncExitStack() as stack:
        store: InMemoryStore | SqliteStore = InMemoryStore()
        if kind == "sqlite":
            store = await stack.enter_async_context(SqliteStore(tmp_path / "inbox.db"))
            await store.migrate()
        assert await Inbox(store, registry, settings()).receive(message) == "handled"
    assert seen == ["welcome:p@example.com:1", "audit:7"]


async def test_the_in_process_publisher_calls_handlers_the_same_way() -> None:
    registry = HandlerRegistry()
    seen: list[tuple[str, Any, int]] = []

    @registry.handler()
    async def welcome(user: UserRegistered, ctx: HandlerContext) -> None:
        seen.append((user.email, ctx.connection, ctx.attempt))

    @registry.handler()
    def ship(order: OrderCreated) -> None:
        seen.append((order.item, None, 0))

    publisher = InProcessPublisher(registry)
    good = dataclasses.replace(
        event({"user_id": 1, "email": "a@example.com"}, "UserRegistered"), attempts=2
    )
    results = await publisher.publish(
        [good, event({"order_id": 1, "item": "pen"}, "OrderCreated"), event({}, "OrderCreated")]
    )
    assert results[:2] == [None, None]
    assert isinstance(results[2], PermanentPublishError)
    assert "does not decode" in str(results[2])
    assert sorted(seen, key=str) == [("a@example.com", None, 3), ("pen", None, 0)]


# -- the inbox ---------------------------------------------------------------------------------


def settings(**overrides: Any) -> InboxSettings:
    base: dict[str, Any] = {
        "consumer": "svc",
        "max_attempts": 3,
        "retry": Backoff(base=0.05, cap=0.05),
        "redrive_interval": 0.02,
        "sweep_interval": 0,
    }
    return InboxSettings(**{**base, **overrides})


async def test_messages_without_a_handler_are_ignored_and_plain_handlers_leave_the_loop_free() -> (
    None
):
    registry = HandlerRegistry()
    threads: list[str] = []

    @registry.handler("Slow")
    def slow(message: Message) -> None:
        threads.append(threading.current_thread().name)
        time.sleep(0.2)

    store = InMemoryStore()
    inbox = Inbox(store, registry, settings())
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    outcomes = await inbox.receive_batch([event({}, "Slow"), event({}, "Unknown")])
    ticker.cancel()
    assert outcomes == ["handled", "ignored"]
    assert threads and threads[0] != threading.current_thread().name
    assert ticks >= 10  # the loop kept running while the handler slept in its thread
    assert inbox.counters.to_json()["ignored"] == 1


async def test_a_batch_keeps_key_order_and_runs_keys_concurrently() -> None:
    registry = HandlerRegistry()
    log: list[tuple[str, str]] = []
    running = 0
    peak = 0

    @registry.handler("Step")
    async def step(data: dict[str, Any]) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        log.append((data["key"], "start"))
        await asyncio.sleep(0.02)
        log.append((data["key"], f"end {data['n']}"))
        running -= 1

    batch = [event({"key": k, "n": n}, "Step", key=k) for n in range(3) for k in "abcd"]
    inbox = Inbox(InMemoryStore(), registry, settings(concurrency=3))
    assert await inbox.receive_batch(batch) == ["handled"] * 12
    assert peak == 3  # three keys at once, never more
    for key in "abcd":
        ends = [what for k, what in log if k == key and what.startswith("end")]
        assert ends == ["end 0", "end 1", "end 2"]


class SessionCountingStore(InMemoryStore):
    """Counts inbox sessions: one per chunk of a batch (a transaction, a connection)."""

    sessions = 0

    def inbox_session(self) -> Any:
        self.sessions += 1
        return super().inbox_session()


async def test_a_batch_is_split_into_as_many_chunks_as_its_handlers_time_pays_for() -> None:
    """Each chunk costs a transaction: handlers that return at once share one, slow handlers
    (waiting on I/O) get ``concurrency`` chunks to wait side by side; the first batch, before
    anything is measured, gets ``concurrency``."""
    registry = HandlerRegistry()
    delay = 0.0

    @registry.handler("Step")
    async def step(data: dict[str, Any]) -> None:
        if delay:
            await asyncio.sleep(delay)

    store = SessionCountingStore()
    inbox = Inbox(store, registry, settings(concurrency=4))
    sessions = []
    for n, pause in enumerate([0.0, 0.0, 0.02, 0.02]):
        delay = pause
        batch = [event({"n": n}, "Step", key=f"k{k}") for k in range(12)]
        before = store.sessions
        assert await inbox.receive_batch(batch) == ["handled"] * 12
        sessions.append(store.sessions - before)
    assert sessions == [4, 1, 1, 4]  # the third batch still had the fast handlers' mean


async def test_batches_in_flight_together_keep_each_keys_order() -> None:
    """A broker adapter hands over its next batch before the previous one is stored: a key of
    both waits for the earlier batch, other keys do not; acknowledgements follow fetch order
    even when the later batch is stored first."""
    registry = HandlerRegistry()
    log: list[str] = []
    release = asyncio.Event()

    @registry.handler("Step")
    async def step(data: dict[str, str]) -> None:
        if data["id"] == "a1":
            await release.wait()
        log.append(data["id"])

    inbox = Inbox(InMemoryStore(), registry, settings(concurrency=4))
    acked: list[str] = []

    def ack(name: str) -> Any:
        async def acknowledge() -> None:
            acked.append(name)

        return acknowledge

    deliveries = Deliveries(inbox.receive_batch)
    first = [event({"id": "a1"}, "Step", key="a")]
    second = [event({"id": "a2"}, "Step", key="a"), event({"id": "b2"}, "Step", key="b")]
    assert await deliveries.submit(first, ack("first"))
    assert await deliveries.submit(second, ack("second"))
    for _ in range(20):  # b2 is stored meanwhile; a2 waits behind a1
        await asyncio.sleep(0.005)
    assert log == ["b2"] and acked == []
    release.set()
    assert await deliveries.finish()
    assert log == ["b2", "a1", "a2"]
    assert acked == ["first", "second"]


async def test_a_batch_not_stored_holds_back_the_batches_after_it() -> None:
    """Stop requested while the database is down: the batch is not acknowledged, nor is any
    batch after it (a cumulative acknowledgement would cover the first), and its keys' later
    messages are not stored ahead of it."""
    store = FlakyStore(down=1000)
    registry = HandlerRegistry()
    ran: list[str] = []

    @registry.handler("Step")
    async def step(data: dict[str, str]) -> None:
        ran.append(data["id"])

    inbox = Inbox(store, registry, settings(outage=Backoff(base=0.05, cap=0.05)))
    acked: list[str] = []

    async def acknowledge() -> None:
        acked.append("acked")

    deliveries = Deliveries(inbox.receive_batch)
    assert await deliveries.submit([event({"id": "a1"}, "Step", key="a")], acknowledge)
    assert await deliveries.submit([event({"id": "a2"}, "Step", key="a")], acknowledge)
    await asyncio.sleep(0.02)
    inbox.stop()
    assert not await deliveries.finish()
    assert ran == [] and acked == []


class RefusingStore(InMemoryStore):
    """Every inbox session fails with an error that is no outage (a value the driver refuses,
    a bug): the inbox does not retry it in place."""

    def inbox_session(self) -> Any:
        raise ConfigurationError("invalid value: date value out of range")


async def test_a_batch_that_fails_stops_the_consumer_at_once_even_when_nothing_else_arrives() -> (
    None
):
    """The adapter learns of a batch's failure only when it settles it, i.e. when it hands
    over later batches. With nothing more to read the consumer must still stop (loudly, so a
    supervisor restarts it), not sit there alive and idle, and acknowledge nothing."""
    registry = HandlerRegistry()
    registry.register(lambda message: None, "T")
    inbox = Inbox(RefusingStore(), registry, settings())
    acked: list[str] = []

    async def acknowledge() -> None:
        acked.append("acked")

    class OneBatchBroker:
        async def __aenter__(self) -> OneBatchBroker:
            return self

        async def __aexit__(self, *exc_info: object) -> None:
            return None

        async def run(self, deliver: Any, stop: asyncio.Event) -> None:
            async with Deliveries(deliver) as deliveries:
                assert await deliveries.submit([event({}, "T")], acknowledge)
                await stop.wait()  # no new message: nothing more is submitted

    with pytest.raises(ConfigurationError, match="out of range"):
        await asyncio.wait_for(run_consumer(inbox, OneBatchBroker()), 5)
    assert acked == []


HUNG_PLAIN_HANDLER = """
import asyncio, time
from outboxer.inbox import HandlerRegistry, Inbox, InboxSettings, run_consumer
from outboxer.inbox.consumer import Deliveries
from outboxer.message import Message
from outboxer.testing import InMemoryStore

registry = HandlerRegistry()
registry.register(lambda message: time.sleep(3600), "Hangs")  # a plain handler that never returns

class OneBatchBroker:
    async def __aenter__(self): return self
    async def __aexit__(self, *exc_info): return None
    async def run(self, deliver, stop):
        async def acknowledge(): raise AssertionError("an abandoned batch is acknowledged")
        async with Deliveries(deliver) as deliveries:
            hangs = Message(id="m", topic="t", payload=b"", type="Hangs")
            await deliveries.submit([hangs], acknowledge)
            await stop.wait()

async def main():
    inbox = Inbox(InMemoryStore(), registry, InboxSettings(consumer="svc", sweep_interval=0))
    asyncio.get_running_loop().call_later(0.5, inbox.stop)
    await run_consumer(inbox, OneBatchBroker(), shutdown_timeout=0.5)
    print("stopped", flush=True)

asyncio.run(main())
"""


def test_a_plain_handler_that_never_returns_does_not_keep_a_stopped_consumer_alive() -> None:
    """The batch in progress is abandoned after ``shutdown_timeout``; the process must then
    end, although a plain handler's worker thread still blocks (a hung SMTP call)."""
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", HUNG_PLAIN_HANDLER], capture_output=True, text=True, env=env,
        timeout=20,
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (0, "stopped\n"), result.stderr
    assert time.monotonic() - started < 15


async def test_a_handler_that_raises_cancelled_error_fails_like_any_other(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handler that awaits a task cancelled elsewhere gets ``CancelledError``, though nobody
    cancelled the handler. It ended the batch as if the consumer were being stopped: nothing
    recorded, nothing acknowledged, and the consumer stopped reading (exit status 0). It is the
    message's failure instead; a real cancellation (a stop) still cancels."""
    registry = HandlerRegistry()

    @registry.handler("Awaits")
    async def awaits(message: Message) -> None:
        shared = asyncio.create_task(asyncio.sleep(10))
        shared.cancel()
        await shared

    store = InMemoryStore()
    inbox = Inbox(store, registry, settings())
    assert await inbox.receive_batch([event({}, "Awaits", id="a"), event({}, "X")]) == [
        "retrying",
        "ignored",
    ]
    [warning] = [r.getMessage() for r in caplog.records if "attempt 1 of" in r.getMessage()]
    assert "CancelledError" in warning


async def test_a_failure_is_logged_as_it_is_stored_cut_and_escaped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found by a probe: a handler's 6-million-character error was logged whole, twice (the
    retry's warning, the dead letter's error: 12 MB of log for one message) where the stored
    reason and the relay's log line are cut to MAX_REASON."""
    registry = HandlerRegistry()

    @registry.handler("Loud")
    def loud(message: Message) -> None:
        raise ValueError("x\0y" * 1_000_000)

    store = InMemoryStore()
    inbox = Inbox(store, registry, settings(max_attempts=2))
    assert await inbox.receive_batch([event({}, "Loud", id="l")]) == ["retrying"]
    await asyncio.sleep(0.1)  # the retry's delay
    assert await inbox.redrive() == ["dead"]
    logged = [r.getMessage() for r in caplog.records if "message l " in r.getMessage()]
    assert [line.split(" ", 3)[2] for line in logged] == ["(key", "(key"]  # retry, dead letter
    assert all(len(line) < MAX_REASON + 300 and "\0" not in line for line in logged)
    assert "ValueError: x\ufffdy" in logged[0]  # the NUL as the stored reason has it


@pytest.mark.parametrize("backend", ["memory", "postgres"])
async def test_an_instance_without_the_handler_fails_the_attempt_never_handles_it(
    backend: str, pg_url: str, pg_schema: str
) -> None:
    """Found by a probe: an instance of the consumer without a handler for a failed message
    (another --handlers, a rolling deploy) re-drove it as handled: failure deleted, inbox row
    done, no handler ever succeeded. Its re-drive is a failed attempt like any other: the
    instance that has the handler takes a later one; if none has it, the message ends as a
    dead letter that says why (its key is not blocked for good)."""
    has, lacks = HandlerRegistry(), HandlerRegistry()
    calls: list[int] = []

    @has.handler("Pay")
    def pay(message: Message, ctx: HandlerContext) -> None:
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("declined")

    @lacks.handler("Other")
    def other(message: Message) -> None: ...

    async with contextlib.AsyncExitStack() as stack:
        if backend == "memory":
            store: Any = InMemoryStore()
        else:
            store = await stack.enter_async_context(
                PostgresStore(pg_url, TableNames(schema=pg_schema))
            )
            await store.migrate()
        fast = {"retry": Backoff(base=0.05, cap=0.05), "max_attempts": 4}
        with_handler = Inbox(store, has, settings(**fast))
        without = Inbox(store, lacks, settings(**fast))
        batch = [event({}, "Pay", id="p"), event({}, "Pay", id="q")]
        assert await with_handler.receive_batch(batch) == ["retrying", "retrying"]
        await asyncio.sleep(0.1)
        assert await without.redrive() == ["retrying", "retrying"]  # never "handled"
        await asyncio.sleep(0.1)
        assert await with_handler.redrive() == ["handled", "handled"]
        assert calls == [1, 1, 3, 3]  # attempt 2 was the other instance's
        await with_handler.receive_batch([event({}, "Pay", id="r")])
        for _ in range(3):
            await asyncio.sleep(0.1)
            outcomes = await without.redrive()
        assert outcomes == ["dead"]
        dead = await store.get_dead_letter("r")
        assert "LookupError: no handler for type 'Pay'" in dead.failure_reason


async def test_a_handler_raising_cancelled_error_through_inprocess_fails_its_message_alone() -> (
    None
):
    """Found by a probe: through ``inprocess://`` the CancelledError passed for the relay's
    stop; the relay released the batch and claimed it again at once, forever, running the
    other handler of the batch ~1,000 times a second, nothing retried or dead-lettered. Now it
    is its message's failure; a real cancellation of the publish still cancels."""
    registry = HandlerRegistry()
    ran: list[str] = []

    @registry.handler("Cancels")
    async def cancels(message: Message) -> None:
        raise asyncio.CancelledError

    @registry.handler("Fine")
    async def fine(message: Message) -> None:
        ran.append(message.id)
        await asyncio.sleep(0)

    publisher = InProcessPublisher(registry)
    results = await publisher.publish([event({}, "Cancels", id="c"), event({}, "Fine", id="f")])
    assert isinstance(results[0], RetryablePublishError)
    assert "HandlerCancelled" in str(results[0]) and results[1] is None
    assert ran == ["f"]

    @registry.handler("Slow")
    async def slow(message: Message) -> None:
        await asyncio.sleep(10)

    stopping = asyncio.create_task(publisher.publish([event({}, "Slow")]))
    await asyncio.sleep(0.05)
    stopping.cancel()  # the relay stopping
    with pytest.raises(asyncio.CancelledError):
        await stopping


class BrokenText(Exception):
    """A handler's exception whose ``__str__`` has a bug of its own."""

    def __str__(self) -> str:
        return f"payment declined: {self.detail}"  # type: ignore[attr-defined]


async def test_an_exception_that_cannot_say_what_it_is_still_fails_only_its_message() -> None:
    """Found by a probe: formatting the failure reason raised the exception's own
    AttributeError: the relay backed off as if the broker were down (the batch's other
    messages re-run every round) and ``outboxer consume`` crash-looped on the batch."""
    registry = HandlerRegistry()

    @registry.handler("Pay")
    def pay(message: Message) -> None:
        raise BrokenText

    @registry.handler("Async")
    async def pay_async(message: Message) -> None:
        raise BrokenText

    store = InMemoryStore()
    inbox = Inbox(store, registry, settings(max_attempts=1))
    batch = [event({}, "Pay", id="p"), event({}, "Async", id="a"), event({}, "X", id="x")]
    assert await inbox.receive_batch(batch) == ["dead", "dead", "ignored"]
    assert (await store.get_dead_letter("p")).failure_reason == "consumer 'svc': BrokenText"
    results = await InProcessPublisher(registry).publish(batch[:2])
    assert [str(r) for r in results] == ["handler raised BrokenText"] * 2


async def test_generator_handlers_are_refused_and_a_returned_generator_fails() -> None:
    """Found by a probe: a handler with ``yield`` never ran its body, and its message counted
    as handled (published, from ``inprocess://``)."""
    registry = HandlerRegistry()

    def generator(message: Message) -> Any:
        yield message

    async def async_generator(message: Message) -> Any:
        yield message

    for handler in (generator, async_generator):
        with pytest.raises(ConfigurationError, match="is a generator"):
            registry.register(handler, "Gen")
    registry.register(lambda message: generator(message), "Wrapped")
    store = InMemoryStore()
    inbox = Inbox(store, registry, settings(max_attempts=1))
    assert await inbox.receive_batch([event({}, "Wrapped", id="w")]) == ["dead"]
    assert "returned a generator" in (await store.get_dead_letter("w")).failure_reason
    [result] = await InProcessPublisher(registry).publish([event({}, "Wrapped", id="v")])
    assert result is not None and "returned a generator" in str(result)


class Escape(BaseException):
    """A handler's own BaseException."""


@pytest.mark.parametrize("thrown", [SystemExit(0), SystemExit(3), KeyboardInterrupt(), Escape()])
async def test_a_handler_that_raises_a_base_exception_fails_its_message_and_nothing_hangs(
    thrown: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by a probe: a handler raising ``sys.exit()``, ``KeyboardInterrupt`` or a
    ``BaseException`` of its own ended the task that stored the batch: the consumer waited for it
    forever (or exited 0 on ``sys.exit(0)``), the relay's drain never finished. Now it is its
    message's failure, retried and then dead-lettered, in the inbox and in ``inprocess://``."""
    registry = HandlerRegistry()

    @registry.handler("Async")
    async def leaves(message: Message) -> None:
        raise thrown

    @registry.handler("Plain")
    def leaves_too(message: Message) -> None:
        raise thrown

    store = InMemoryStore()
    inbox = Inbox(store, registry, settings(max_attempts=1))
    batch = [event({}, "Async", id="a"), event({}, "Plain", id="p"), event({}, "X", id="x")]
    assert await asyncio.wait_for(inbox.receive_batch(batch), 10) == ["dead", "dead", "ignored"]
    for dead_id in ("a", "p"):
        reason = (await store.get_dead_letter(dead_id)).failure_reason
        assert f"HandlerExited: the handler raised {type(thrown).__name__}" in reason
    results = await InProcessPublisher(registry).publish(batch[:2])
    assert all(isinstance(r, RetryablePublishError) for r in results), results
    assert all(type(thrown).__name__ in str(r) for r in results)


async def test_a_plain_handler_that_returns_a_coroutine_fails_instead_of_passing(
    recwarn: pytest.WarningsRecorder,
) -> None:
    """Found by a probe: ``registry.register(lambda m: send(m))`` around an ``async def send``
    returned a coroutine nothing awaited; the message counted as handled (and published, from
    ``inprocess://``), with a "never awaited" warning as the only trace."""
    registry = HandlerRegistry()
    sent: list[str] = []

    async def send(message: Message) -> None:
        sent.append(message.id)

    registry.register(lambda message: send(message), "Mail")
    store = InMemoryStore()
    inbox = Inbox(store, registry, settings(max_attempts=1))
    assert await inbox.receive_batch([event({}, "Mail", id="m")]) == ["dead"]
    reason = (await store.get_dead_letter("m")).failure_reason
    assert "returned coroutine, which nothing awaits: declare it 'async def'" in reason
    [result] = await InProcessPublisher(registry).publish([event({}, "Mail", id="n")])
    assert result is not None and "nothing awaits" in str(result)
    assert sent == []
    assert not [w for w in recwarn.list if "never awaited" in str(w.message)]


async def test_permanent_handler_errors_are_dead_letters_at_once() -> None:
    registry = HandlerRegistry()

    @registry.handler("Bad")
    def bad(message: Message) -> None:
        raise PermanentHandlerError("this can never work")

    @registry.handler()
    def typed(user: UserRegistered) -> None:
        raise AssertionError("not reached")

    store = InMemoryStore()
    inbox = Inbox(store, registry, settings())
    outcomes = await inbox.receive_batch(
        [event({}, "Bad", id="bad"), event({"nope": 1}, "UserRegistered", id="undecodable")]
    )
    assert outcomes == ["dead", "dead"]
    for dead_id in ("bad", "undecodable"):
        dead = await store.get_dead_letter(dead_id)
        assert (dead.direction, dead.attempts) == ("consume", 1)


async def test_an_async_handler_whose_payload_does_not_decode_is_a_dead_letter_at_once() -> None:
    """A route's one async handler is called directly (``Route.start``), so its payload is
    decoded before there is a coroutine to await: the error is still the message's."""
    registry = HandlerRegistry()

    @registry.handler()
    async def welcome(user: UserRegistered, ctx: HandlerContext) -> None:
        raise AssertionError("not reached")

    store = InMemoryStore()
    inbox = Inbox(store, registry, settings())
    undecodable = event({"nope": 1}, "UserRegistered", id="undecodable")
    assert await inbox.receive_batch([undecodable]) == ["dead"]
    dead = await store.get_dead_letter("undecodable")
    assert (dead.direction, dead.attempts) == ("consume", 1)
    [published] = await InProcessPublisher(registry).publish([undecodable])
    assert isinstance(published, PermanentPublishError)
    assert "does not decode" in str(published)


class FlakyStore(InMemoryStore):
    """The database is down for the first ``down`` inbox sessions."""

    def __init__(self, down: int) -> None:
        super().__init__()
        self.down = down

    def inbox_session(self) -> Any:
        if self.down > 0:
            self.down -= 1
            raise StoreUnavailable("connection refused")
        return super().inbox_session()


async def test_while_the_database_is_down_a_delivery_waits_and_is_not_lost() -> None:
    registry = HandlerRegistry()
    registry.register(lambda message: None, "T")
    fast = settings(outage=Backoff(base=0.01, cap=0.02))
    inbox = Inbox(FlakyStore(down=3), registry, fast)
    assert await inbox.receive_batch([event({}, "T")]) == ["handled"]
    # Asked to stop during the outage: the batch is given up (not acknowledged) instead.
    stopping = Inbox(FlakyStore(down=1000), registry, fast)
    asyncio.get_running_loop().call_later(0.1, stopping.stop)
    with pytest.raises(ConsumerStopping):
        await stopping.receive_batch([event({}, "T"), event({}, "T", key="k")])


async def test_the_redrive_loop_retries_until_success(tmp_path: Any) -> None:
    registry = HandlerRegistry()
    attempts: list[int] = []

    @registry.handler("T")
    def flaky(message: Message, ctx: HandlerContext) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RuntimeError("not yet")

    store = InMemoryStore()
    inbox = Inbox(store, registry, settings(max_attempts=5))
    assert await inbox.receive(event({}, "T")) == "retrying"
    loop = asyncio.create_task(inbox.run_redrives())
    try:
        deadline = time.monotonic() + 5
        # Until the outcome is counted, not merely the handler run: the loop may be
        # cancelled between the two.
        while not inbox.counters.handled and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        loop.cancel()
    assert attempts == [1, 2, 3]
    assert inbox.counters.redriven == 2 and inbox.counters.handled == 1
    report = await store.sweep(sweeper="s", interval=0, retention_seconds=0, batch_size=50)
    assert report is not None and report.consume_retries == 2


class BuggyOnceStore(InMemoryStore):
    """The next ``bugs`` inbox sessions fail with an error that is no outage (a bug)."""

    bugs = 0

    def inbox_session(self) -> Any:
        if self.bugs:
            self.bugs -= 1
            raise RuntimeError("a bug")
        return super().inbox_session()


async def test_the_redrive_loop_outlives_an_unexpected_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only outages (StoreError) were caught: any other error ended the re-drive loop, and the
    consumer went on without it, silently: no failure was retried again and the keys waiting
    behind one were blocked for good. The error is logged with its traceback; the loop goes on."""
    registry = HandlerRegistry()

    @registry.handler("T")
    def flaky(message: Message, ctx: HandlerContext) -> None:
        if ctx.attempt < 2:
            raise RuntimeError("not yet")

    store = BuggyOnceStore()
    inbox = Inbox(store, registry, settings(outage=Backoff(base=0.01, cap=0.01)))
    assert await inbox.receive(event({}, "T")) == "retrying"
    store.bugs = 2
    loop = asyncio.create_task(inbox.run_redrives())
    try:
        await _redriven(inbox, loop)
    finally:
        loop.cancel()
    assert inbox.counters.handled == 1
    [logged, *_] = [r for r in caplog.records if "a bug" in str(r.exc_info)]
    assert logged.levelname == "ERROR"


async def _redriven(inbox: Inbox, loop: asyncio.Task[None]) -> None:
    """Wait (10 s at most) for the re-drive loop to handle a message; it must still run."""
    deadline = time.monotonic() + 10
    while not inbox.counters.handled and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert not loop.done(), loop.exception()


async def test_the_redrive_loop_backs_off_while_the_database_is_down(
    pg_store: PostgresStore, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by a probe: while the database was down the re-drive loop tried again (and logged
    a warning) every ``redrive_interval``: a line a second for the whole outage, a hundred
    with ``--retry-interval 0.01``. Now it waits the outage backoff, as deliveries do, and
    re-drives once the database is back."""
    registry = HandlerRegistry()

    @registry.handler("T")
    def flaky(message: Message, ctx: HandlerContext) -> None:
        if ctx.attempt < 2:
            raise RuntimeError("not yet")

    async with TcpProxy("127.0.0.1", 5432) as proxy:
        url = f"postgresql://postgres@127.0.0.1:{proxy.port}/test"
        async with PostgresStore(url, TableNames(schema=pg_schema)) as store:
            fast = settings(redrive_interval=0.01, outage=Backoff(base=1.0, cap=1.0))
            inbox = Inbox(store, registry, fast)
            assert await inbox.receive(event({}, "T")) == "retrying"
            await proxy.cut()
            loop = asyncio.create_task(inbox.run_redrives())
            try:
                outage = "re-drive of failed consumptions failed"

                async def warned() -> bool:
                    return any(outage in r.getMessage() for r in caplog.records)

                deadline = time.monotonic() + 10
                while not await warned() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.5)  # fifty rounds of the re-drive interval
                lines = [r for r in caplog.records if outage in r.getMessage()]
                assert len(lines) == 1, [r.getMessage() for r in lines]
                assert lines[0].levelname == "WARNING" and "retrying in 1 s" in lines[0].message
                await proxy.restore()
                await _redriven(inbox, loop)
            finally:
                loop.cancel()
    assert inbox.counters.handled == 1


async def test_handler_writes_and_new_outbox_messages_commit_with_the_inbox_row(
    pg_store: PostgresStore, pg_schema: str, pg_url: str
) -> None:
    """A handler reacting to an event writes a row and enqueues a follow-up event through
    ``ctx.connection``: both exist iff the inbox row does (the outbox chains through it)."""
    await pg_store.execute(f'CREATE TABLE "{pg_schema}".welcomed (user_id int PRIMARY KEY)')
    registry = HandlerRegistry()
    outbox = outboxer.Outbox(schema=pg_schema)

    @registry.handler()
    async def welcome(user: UserRegistered, ctx: HandlerContext) -> None:
        assert isinstance(ctx.connection, asyncpg.pool.PoolConnectionProxy)
        assert ctx.consumer == "svc"
        await ctx.connection.execute(
            f'INSERT INTO "{pg_schema}".welcomed VALUES ($1)', user.user_id
        )
        await outbox.enqueue_async(
            ctx.connection, "emails", {"to": user.email}, type="WelcomeEmailQueued"
        )
        if user.user_id == 2:
            raise RuntimeError("rolled back, follow-up event included")

    inbox = Inbox(pg_store, registry, settings(max_attempts=1))
    ok = event({"user_id": 1, "email": "a@example.com"}, "UserRegistered")
    bad = event({"user_id": 2, "email": "b@example.com"}, "UserRegistered")
    assert await inbox.receive_batch([ok, bad, ok]) == ["handled", "dead", "duplicate"]
    rows = await pg_store.execute(f'SELECT user_id FROM "{pg_schema}".welcomed')
    assert [r[0] for r in rows] == [1]
    outbox_rows = await pg_store.execute("SELECT type, payload FROM {outbox}")
    assert [(r[0], json.loads(r[1])) for r in outbox_rows] == [
        ("WelcomeEmailQueued", {"to": "a@example.com"})
    ]
    dead = await pg_store.list_dead_letters(DeadLetterFilter(), limit=5, cursor=None)
    assert [(d.id, d.direction) for d in dead.items] == [(bad.id, "consume")]


async def test_on_sqlite_the_handler_gets_the_aiosqlite_connection(
    sqlite_store: SqliteStore,
) -> None:
    await sqlite_store.execute("CREATE TABLE welcomed (user_id INTEGER PRIMARY KEY)")
    registry = HandlerRegistry()

    @registry.handler()
    async def welcome(user: UserRegistered, ctx: HandlerContext) -> None:
        await ctx.connection.execute("INSERT INTO welcomed VALUES (?)", (user.user_id,))
        await outboxer.enqueue_async(ctx.connection, "emails", {"to": user.email})

    inbox = Inbox(sqlite_store, registry, settings())
    message = event({"user_id": 9, "email": "z@example.com"}, "UserRegistered")
    assert await inbox.receive_batch([message, message]) == ["handled", "duplicate"]
    assert [tuple(r) for r in await sqlite_store.execute("SELECT * FROM welcomed")] == [(9,)]
    assert (await sqlite_store.stats()).pending == 1


@pytest.mark.parametrize("per_message", [False, True], ids=["per-chunk", "per-message"])
async def test_a_chunk_commits_once_and_a_failure_undoes_only_its_own_writes(
    pg_store: PostgresStore, pg_schema: str, per_message: bool
) -> None:
    """By default the messages of a chunk share one transaction (one txid); a failing handler
    that wrote is rolled back to its savepoint, one that takes no context (so cannot write in
    the transaction, and runs without a savepoint) just fails; the others keep their effects.
    With ``--transaction-per-message`` every message has a transaction of its own."""
    await pg_store.execute(f'CREATE TABLE "{pg_schema}".seen (n int, tx bigint)')
    registry = HandlerRegistry()

    @registry.handler("Write")
    async def write(payload: dict[str, int], ctx: HandlerContext) -> None:
        await ctx.connection.execute(
            f'INSERT INTO "{pg_schema}".seen VALUES ($1, txid_current())', payload["n"]
        )
        if payload["n"] == 2:
            raise RuntimeError("undone")

    @registry.handler("Plain")
    async def plain(payload: dict[str, int]) -> None:
        if payload["n"] == 4:
            raise RuntimeError("nothing to undo")

    inbox = Inbox(pg_store, registry, settings(concurrency=1, batch_transactions=not per_message))
    kinds = {1: "Write", 2: "Write", 3: "Plain", 4: "Plain", 5: "Write"}
    batch = [event({"n": n}, kind, id=f"m-{n}") for n, kind in kinds.items()]
    assert await inbox.receive_batch(batch) == [
        "handled",
        "retrying",
        "handled",
        "retrying",
        "handled",
    ]
    rows = await pg_store.execute(f'SELECT n, tx FROM "{pg_schema}".seen ORDER BY n')
    assert [r[0] for r in rows] == [1, 5]
    assert (rows[0][1] == rows[1][1]) is not per_message
    failures = await pg_store.execute("SELECT message_id FROM {inbox_failures} ORDER BY seq")
    assert [r[0] for r in failures] == ["m-2", "m-4"]
    assert await inbox.receive_batch(batch) == ["duplicate"] * 5


class OneBatch:
    """A broker adapter that hands over one batch, then waits for the stop."""

    def __init__(self, batch: list[Message], acked: list[str]) -> None:
        self.batch = batch
        self.acked = acked

    async def __aenter__(self) -> OneBatch:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def run(self, deliver: Any, stop: asyncio.Event) -> None:
        async def acknowledge() -> None:
            self.acked.extend(m.id for m in self.batch)

        async with Deliveries(deliver) as deliveries:
            if self.batch:
                assert await deliveries.submit(self.batch, acknowledge)
            await stop.wait()


async def _end(connection: Any, how: str) -> None:
    """What a careless handler does to the inbox's transaction: ``commit`` or ``rollback`` it,
    then ``begin`` one of its own if ``how`` says so."""
    end, _, begin = how.partition("-")
    if isinstance(connection, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
        await connection.execute(f"{end.upper()}; {begin.upper()}")
        return
    await getattr(connection, end)()  # asyncmy and aiosqlite
    if begin:
        is_sqlite = hasattr(connection, "in_transaction")
        await (connection.execute("BEGIN") if is_sqlite else connection.begin())


@pytest.fixture(params=["postgres", "mariadb", "sqlite"])
def sql_store(request: pytest.FixtureRequest) -> tuple[str, Any, str]:
    """(dialect, store, a table name for the test's effects) on each SQL store."""
    fixture = {"postgres": "pg_store", "mariadb": "mysql_store", "sqlite": "sqlite_store"}
    store = request.getfixturevalue(fixture[request.param])
    table = unique_name("effects")
    if request.param == "postgres":
        table = f'"{request.getfixturevalue("pg_schema")}".{table}'
    elif request.param == "mariadb":
        table = f"`{request.getfixturevalue('mysql_database')}`.{table}"
    return request.param, store, table


@pytest.mark.parametrize(
    ("how", "fails"),
    [
        ("commit", False),
        ("commit-begin", False),
        ("commit-begin", True),
        ("rollback", False),
        ("rollback-begin", False),
        ("rollback-begin", True),
    ],
)
async def test_a_handler_that_ends_the_inbox_transaction_stops_the_consumer(
    sql_store: tuple[str, Any, str], how: str, fails: bool
) -> None:
    """The handler of the 3rd of 5 messages (one key: one chunk, one transaction) commits or
    rolls back the inbox's transaction, maybe begins one of its own, maybe raises then.

    Before: a commit was retried in place and the messages after it came back as
    duplicates, never handled; one followed by a ``BEGIN`` went unnoticed that way (a probe).
    Now the consumer stops at once with HandlerEndedTransaction (a ``BEGIN`` after it is
    given away by the savepoint the commit or rollback took with it), acknowledges nothing,
    and the redelivery handles what was not committed: after a commit the messages after it,
    after a rollback all five."""
    dialect, store, table = sql_store
    await store.execute(f"CREATE TABLE {table} (n INTEGER)")
    registry = HandlerRegistry()
    careless = {"yes": True}

    @registry.handler("job")
    async def job(payload: dict[str, int], ctx: HandlerContext) -> None:
        connection = ctx.connection
        if dialect == "mariadb":
            async with connection.cursor() as cursor:
                await cursor.execute(f"INSERT INTO {table} VALUES (%s)", (payload["n"],))
        elif dialect == "postgres":
            await connection.execute(f"INSERT INTO {table} VALUES ($1)", payload["n"])
        else:
            await connection.execute(f"INSERT INTO {table} VALUES (?)", (payload["n"],))
        if payload["n"] == 3 and careless["yes"]:
            await _end(connection, how)
            if fails:
                raise RuntimeError("and then it fails")

    batch = [event({"n": n}, "job", key="k") for n in range(1, 6)]
    acked: list[str] = []
    inbox = Inbox(store, registry, settings())
    with pytest.raises(outboxer.HandlerEndedTransaction):
        await asyncio.wait_for(run_consumer(inbox, OneBatch(batch, acked)), 10)
    assert acked == []
    committed = [1, 2, 3] if how.startswith("commit") else []
    rows = await store.execute(f"SELECT n FROM {table} ORDER BY n")
    assert [r["n"] for r in rows] == committed
    careless["yes"] = False
    again = Inbox(store, registry, settings())
    outcomes = await again.receive_batch(batch)
    assert outcomes == ["duplicate"] * len(committed) + ["handled"] * (5 - len(committed))
    rows = await store.execute(f"SELECT n FROM {table} ORDER BY n")
    assert [r["n"] for r in rows] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("how", ["rollback", "rollback-begin", "commit-begin"])
async def test_a_re_drive_whose_handler_ends_the_transaction_stops_the_consumer(
    sql_store: tuple[str, Any, str], how: str
) -> None:
    """The re-drive loop outlives other errors, retrying them; this one it would repeat with
    every retry (and what the handler committed with it): the consumer stops with it."""
    _, store, _ = sql_store
    registry = HandlerRegistry()

    @registry.handler("job")
    async def job(payload: dict[str, int], ctx: HandlerContext) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("the first attempt fails")
        await _end(ctx.connection, how)

    inbox = Inbox(store, registry, settings())
    assert await inbox.receive_batch([event({"n": 1}, "job")]) == ["retrying"]
    with pytest.raises(outboxer.HandlerEndedTransaction):
        await asyncio.wait_for(run_consumer(inbox, OneBatch([], [])), 10)
    rows = await store.execute("SELECT attempts AS n FROM {inbox_failures}")
    assert [r["n"] for r in rows] == [1]  # the failure stays, re-driven after the restart


async def test_a_handler_chosen_as_a_deadlock_victim_on_mariadb_is_retried_not_blamed(
    mysql_store: Any, mysql_database: str
) -> None:
    """InnoDB rolls a deadlock victim's whole transaction back: the inbox's own. Found by a
    probe: the inbox took that for the handler ending the transaction and stopped the consumer
    ("fix the handler"). The chunk is stored again instead; its effects happen once."""
    db = f"`{mysql_database}`"  # (the store's connections default to another database)
    await mysql_store.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT)")
    await mysql_store.execute(f"INSERT INTO {db}.t VALUES (1, 0), (2, 0)")
    await mysql_store.execute(f"CREATE TABLE {db}.big (id INT PRIMARY KEY, v INT)")
    rows = ", ".join(f"({n}, 0)" for n in range(3, 2003))
    await mysql_store.execute(f"INSERT INTO {db}.big VALUES {rows}")
    registry = HandlerRegistry()
    attempts: list[int] = []

    @registry.handler("Deadlocks")
    async def deadlocks(message: Message, ctx: HandlerContext) -> None:
        attempts.append(len(attempts))
        async with ctx.connection.cursor() as mine:
            await mine.execute(f"UPDATE {db}.t SET v = v + 1 WHERE id = 1")
            if len(attempts) > 1:
                return
            other = await mysql_connect(mysql_database)
            try:
                await other.begin()
                async with other.cursor() as theirs:
                    await theirs.execute("UPDATE big SET v = v + 1")  # heavier: not the victim
                    await theirs.execute("UPDATE t SET v = v + 1 WHERE id = 2")
                    update = f"UPDATE {db}.t SET v = 1 WHERE id = 2"
                    waiting = asyncio.create_task(mine.execute(update))
                    await asyncio.sleep(0.3)
                    closing = asyncio.create_task(theirs.execute("UPDATE t SET v = 5 WHERE id = 1"))
                    try:
                        await waiting  # the deadlock victim: raises 1213
                    finally:
                        await closing
                await other.rollback()
            finally:
                other.close()

    outage = Backoff(base=0.05, cap=0.05)
    inbox = Inbox(mysql_store, registry, settings(outage=outage))
    batch = [event({}, "Deadlocks", id="d-1")]
    assert await asyncio.wait_for(inbox.receive_batch(batch), 20) == ["handled"]
    assert len(attempts) == 2
    rows = await mysql_store.execute(f"SELECT id, v FROM {db}.t ORDER BY id")
    assert [(r["id"], r["v"]) for r in rows] == [(1, 1), (2, 0)]
