"""The consumer contract against NATS JetStream (127.0.0.1:4222): durable pull consumers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import nats
import nats.js.errors
import pytest

from outboxer.brokers.nats import NatsConsumerSettings
from outboxer.brokers.nats import consumer as nats_consumer
from outboxer.brokers.nats.consumer import NatsConsumer, durable_name
from outboxer.brokers.nats.publisher import NatsPublisher
from outboxer.errors import ConfigurationError, PermanentPublishError
from outboxer.message import Message
from tests.conftest import require_service, unique_name
from tests.contracts.consumer import ConsumerContract, Prepare, Publish, wait_for
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(90)

NATS = "nats://127.0.0.1:4222"


class TestNatsConsumer(ConsumerContract):
    @pytest.fixture
    def broker_url(self) -> str:
        require_service("NATS", "127.0.0.1", 4222)
        # Unacknowledged messages of a killed consumer come back after 2 s.
        return f"{NATS}?ack_wait=2"

    @pytest.fixture
    async def prepare(self) -> AsyncIterator[Prepare]:
        client = await nats.connect(NATS)
        js = client.jetstream()
        streams: list[str] = []

        async def prepare(topic: str, name: str) -> None:
            stream = unique_name("OB")
            await js.add_stream(name=stream, subjects=[topic])
            streams.append(stream)

        yield prepare
        for stream in streams:
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_stream(stream)
        await client.close()

    @pytest.fixture
    def publish(self) -> Publish:
        async def publish(topic: str, messages: Sequence[Message]) -> None:
            async with NatsPublisher.from_url(NATS) as publisher:
                assert list(await publisher.publish(messages)) == [None] * len(messages)

        return publish

    @pytest.fixture
    def publish_again(self) -> Publish:
        """JetStream drops a re-published ``Nats-Msg-Id`` inside its duplicate window, so the
        duplicate goes in without that header, carrying the id in ``ce-id`` only (as a copy
        published by another system, or after the window, would)."""

        async def publish(topic: str, messages: Sequence[Message]) -> None:
            client = await nats.connect(NATS)
            try:
                js = client.jetstream()
                for m in messages:
                    headers = {**m.headers, "ce-id": m.id, "content-type": m.content_type}
                    if m.type is not None:
                        headers["ce-type"] = m.type
                    await js.publish(topic, m.payload, headers=headers)
            finally:
                await client.close()

        return publish


def test_durable_names_are_valid_nats_names() -> None:
    assert durable_name("svc.v1", "orders.*.created") == "svc_v1_orders___created"
    long = durable_name("c" * 200, "s" * 255)
    assert len(long) == 255 and long != durable_name("c" * 200, "s" * 254 + "t")


@contextlib.asynccontextmanager
async def stream_of(subject: str) -> AsyncIterator[Any]:
    """JetStream with a fresh stream capturing ``subject``, deleted afterwards."""
    require_service("NATS", "127.0.0.1", 4222)
    client = await nats.connect(NATS)
    js = client.jetstream()
    stream = unique_name("OB")
    await js.add_stream(name=stream, subjects=[subject])
    try:
        yield js
    finally:
        await js.delete_stream(stream)
        await client.close()


async def consumed(url: str, name: str, subject: str, wanted: set[str]) -> list[str]:
    """The ids a consumer is handed until it has seen every one of ``wanted``."""
    seen: list[str] = []
    stop = asyncio.Event()

    async def deliver(batch: Sequence[Message]) -> None:
        seen.extend(m.id for m in batch)
        if wanted <= set(seen):
            stop.set()

    settings = NatsConsumerSettings.from_url(url, name=name, topics=[subject])
    async with NatsConsumer(settings) as consumer:
        await asyncio.wait_for(consumer.run(deliver, stop), 30)
    return seen


async def test_a_long_consumer_name_on_a_long_subject_consumes() -> None:
    """Found by a probe: a valid consumer name (200 characters at most) on a valid subject
    (255 bytes at most) made a durable name NATS refuses, an 'unexpected BadRequestError'."""
    subject = unique_name("ob") + "." + "s" * 200
    async with stream_of(subject) as js:
        await js.publish(subject, b"{}", headers={"ce-id": "m1"})
        assert await consumed(NATS, "c" * 200, subject, {"m1"}) == ["m1"]


async def test_two_subjects_that_would_share_a_durable_are_refused() -> None:
    """``a.b`` and ``a_b`` (or consumer ``x.y`` on ``z`` and consumer ``x`` on ``y.z``) give
    the same durable name. Sharing it, the second subject's messages were never fetched (the
    durable keeps the first one's filter), silently; or two consumers took each other's
    messages. A durable that filters another subject is refused in one line instead."""
    require_service("NATS", "127.0.0.1", 4222)
    prefix = unique_name("ob")
    dotted, underscored = f"{prefix}.b", f"{prefix}_b"
    client = await nats.connect(NATS)
    js = client.jetstream()
    stream = unique_name("OB")
    await js.add_stream(name=stream, subjects=[dotted, underscored])
    try:
        settings = NatsConsumerSettings.from_url(NATS, name="svc", topics=[underscored, dotted])
        consumer = NatsConsumer(settings)

        async def deliver(batch: Sequence[Message]) -> None:
            raise AssertionError("nothing is fetched")

        async with consumer:
            with pytest.raises(ConfigurationError, match="already filters"):
                await asyncio.wait_for(consumer.run(deliver, asyncio.Event()), 20)
    finally:
        await js.delete_stream(stream)
        await client.close()


async def test_a_foreign_message_with_a_status_header_does_not_stop_the_consumer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found by a probe: nats-py takes a message with a user header 'Status' for a JetStream
    status: without a 'Description' its fetch raised a KeyError that stopped the consumer (exit
    1, again at every restart), and the messages fetched with it came back after ack_wait to
    meet it again. It is delivered alone now; outboxer's own publisher never sends such a
    header."""
    subject = unique_name("ob")
    async with stream_of(subject) as js:
        await js.publish(subject, b"{}", headers={"ce-id": "m1"})
        await js.publish(subject, b"{}", headers={"ce-id": "m2", "Status": "500"})
        await js.publish(subject, b"{}", headers={"ce-id": "m3"})
        # (a fetch that meets the Status message loses what it had fetched with it: those
        # come again after ack_wait)
        await consumed(f"{NATS}?ack_wait=1", "svc", subject, {"m1", "m2", "m3"})
        assert any("'Status' header" in r.getMessage() for r in caplog.records)
        async with NatsPublisher.from_url(NATS) as publisher:
            message = Message(id="x", topic=subject, payload=b"{}", headers={"Status": "1"})
            [refused] = await publisher.publish([message])
        assert isinstance(refused, PermanentPublishError) and "'Status'" in str(refused)


async def test_a_durable_deleted_under_the_consumer_is_created_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An operator deletes the durable: JetStream then answers no fetch, and the consumer
    used to wait for messages that never came, alive and silent. It now looks for its durable
    while idle, creates it again and consumes what is published next."""
    require_service("NATS", "127.0.0.1", 4222)
    monkeypatch.setattr(nats_consumer, "_DURABLE_CHECK_SECONDS", 0.5)
    subject = unique_name("ob")
    client = await nats.connect(NATS)
    js = client.jetstream()
    stream = unique_name("OB")
    await js.add_stream(name=stream, subjects=[subject])
    seen: list[str] = []

    async def deliver(batch: Sequence[Message]) -> None:
        seen.extend(m.id for m in batch)

    async def until(what: str, check: Any) -> None:
        for _ in range(200):
            if check():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    stop = asyncio.Event()
    try:
        settings = NatsConsumerSettings.from_url(NATS, name="svc", topics=[subject])
        async with NatsConsumer(settings) as consumer:
            running = asyncio.create_task(consumer.run(deliver, stop))
            await js.publish(subject, b"{}", headers={"ce-id": "before"})
            await until("the first message", lambda: seen == ["before"])
            await js.delete_consumer(stream, durable_name("svc", subject))
            await asyncio.sleep(1.5)  # the durable is found missing and created again
            await js.publish(subject, b"{}", headers={"ce-id": "after"})
            # created again from the start: "before" again too (the inbox drops it)
            await until("the next message", lambda: "after" in seen)
            stop.set()
            await running
    finally:
        await js.delete_stream(stream)
        await client.close()


def test_consumer_options_are_taken_out_of_the_url() -> None:
    settings = NatsConsumerSettings.from_url(
        f"{NATS}?ack_wait=5&max_ack_pending=10&name=x", name="svc", topics=["a.b"]
    )
    assert (settings.ack_wait, settings.max_ack_pending, settings.connection.name) == (5, 10, "x")


async def test_a_restarted_consumer_takes_what_the_dead_one_left_before_anything_newer() -> None:
    """Found by a probe: a consumer killed with three messages of a key fetched and not
    acknowledged, a fourth published, the consumer restarted: JetStream delivered the fourth
    at once and the three only after ack_wait, so the key's effects came as [4, 1, 2, 3]."""
    subject = unique_name("ob")
    url = f"{NATS}?ack_wait=2"
    async with stream_of(subject) as js:
        for n in (1, 2, 3):
            await js.publish(subject, b"{}", headers={"ce-id": f"m{n}"})
        # the instance that was killed: its durable, its fetch, no acknowledgement
        settings = NatsConsumerSettings.from_url(url, name="svc", topics=[subject])
        durable = durable_name("svc", subject)
        dead = await nats.connect(NATS)
        try:
            config = nats.js.api.ConsumerConfig(
                ack_policy=nats.js.api.AckPolicy.EXPLICIT, ack_wait=settings.ack_wait
            )
            fetched = await dead.jetstream().pull_subscribe(subject, durable=durable, config=config)
            assert len(await fetched.fetch(3, timeout=5)) == 3
        finally:
            await dead.close()
        await js.publish(subject, b"{}", headers={"ce-id": "m4"})
        assert await consumed(url, "svc", subject, {"m1", "m2", "m3", "m4"}) == [
            "m1", "m2", "m3", "m4"
        ]  # fmt: skip


async def test_what_a_fetch_lost_with_the_connection_comes_before_anything_newer() -> None:
    """The connection is cut while a fetch waits, after JetStream handed it ``m1`` and before
    ``m1`` arrived. nats-py reconnected and the next fetch got ``m2`` at once; ``m1`` came only
    after ack_wait: ``[m0, m2, m1]``, one key's order broken (a probe). Now, after a lost
    connection, the consumer waits for what was delivered and not acknowledged (at most
    ack_wait) before fetching anything newer, and a batch fetched across the loss is left
    unacknowledged to come again in order."""
    subject = unique_name("ob")
    seen: list[str] = []

    async def deliver(batch: Sequence[Message]) -> None:
        seen.extend(m.id for m in batch)

    async with stream_of(subject) as js, TcpProxy("127.0.0.1", 4222) as proxy:

        async def publish(name: str) -> None:
            await js.publish(subject, b"{}", headers={"ce-id": name, "ce-partitionkey": "k"})

        async def given_to_the_fetch() -> bool:
            info = await js.consumer_info(stream, durable_name("svc", subject))
            return bool(info.num_ack_pending == 1 and info.delivered.stream_seq == 2)

        stream = await js.find_stream_name_by_subject(subject)
        settings = NatsConsumerSettings.from_url(
            f"nats://127.0.0.1:{proxy.port}?ack_wait=2", name="svc", topics=[subject]
        )
        stop = asyncio.Event()
        async with NatsConsumer(settings) as consumer:
            running = asyncio.create_task(consumer.run(deliver, stop))
            await publish("m0")
            await wait_for(lambda: _true(seen == ["m0"]), "m0")
            await proxy.pause()  # what the waiting fetch is handed is held back ...
            await publish("m1")
            await wait_for(given_to_the_fetch, "m1 handed to the fetch")
            await proxy.cut()  # ... and lost
            await publish("m2")
            await proxy.restore()
            await wait_for(lambda: _true("m2" in seen or running.done()), "m2")
            stop.set()
            await running
    assert seen[:3] == ["m0", "m1", "m2"]


async def _true(value: bool) -> bool:
    return value


async def test_a_consumer_started_beside_a_live_one_waits_only_for_its_batch() -> None:
    """The wait above ends as soon as what was delivered before the start is acknowledged (a
    live instance storing its batch), not after ack_wait."""
    subject = unique_name("ob")
    url = f"{NATS}?ack_wait=30"
    async with stream_of(subject) as js:
        await js.publish(subject, b"{}", headers={"ce-id": "m1"})
        settings = NatsConsumerSettings.from_url(url, name="svc", topics=[subject])
        live = await nats.connect(NATS)
        try:
            config = nats.js.api.ConsumerConfig(
                ack_policy=nats.js.api.AckPolicy.EXPLICIT, ack_wait=settings.ack_wait
            )
            reader = await live.jetstream().pull_subscribe(
                subject, durable=durable_name("svc", subject), config=config
            )
            [held] = await reader.fetch(1, timeout=5)
            await js.publish(subject, b"{}", headers={"ce-id": "m2"})
            starting = asyncio.create_task(consumed(url, "svc", subject, {"m2"}))
            await asyncio.sleep(3.0)
            assert not starting.done()  # waiting for m1's acknowledgement
            await held.ack_sync()
            started = asyncio.get_running_loop().time()
            assert await asyncio.wait_for(starting, 10) == ["m2"]
            assert asyncio.get_running_loop().time() - started < 5  # not ack_wait's 30 s
        finally:
            await live.close()
