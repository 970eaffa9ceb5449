"""The consumer contract against Redis Streams (127.0.0.1:6379): groups, XACK, XAUTOCLAIM."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Sequence

import pytest
from redis.asyncio import Redis

from outboxer.brokers.redis import RedisConsumer, RedisConsumerSettings
from outboxer.brokers.redis.publisher import RedisPublisher
from outboxer.errors import ConfigurationError
from outboxer.message import Message
from tests.conftest import require_service, unique_name
from tests.contracts.consumer import ConsumerContract, Prepare, Publish, wait_for
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(90)

REDIS = "redis://127.0.0.1:6379/0"


class TestRedisConsumer(ConsumerContract):
    @pytest.fixture
    def broker_url(self) -> str:
        require_service("Redis", "127.0.0.1", 6379)
        # Entries of a killed member are reclaimed after 1 s of idleness.
        return f"{REDIS}?claim_idle=1"

    @pytest.fixture
    async def prepare(self) -> AsyncIterator[Prepare]:
        streams: list[str] = []

        async def prepare(topic: str, name: str) -> None:
            streams.append(topic)  # the group is created by the consumer, from the start

        yield prepare
        client = Redis.from_url(REDIS)
        try:
            if streams:
                await client.delete(*streams)
        finally:
            await client.aclose()

    @pytest.fixture
    def publish(self) -> Publish:
        async def publish(topic: str, messages: Sequence[Message]) -> None:
            async with RedisPublisher.from_url(REDIS) as publisher:
                assert list(await publisher.publish(messages)) == [None] * len(messages)

        return publish

    @pytest.fixture
    def publish_foreign(self) -> Publish:
        """Entries XADDed by redis-py itself, their headers JSON as ``json.dumps`` writes it
        (escapes: ``\\u0000``), with a lone surrogate added (``\\ud800``, which JSON
        allows and no UTF-8 encoder takes)."""

        async def publish(topic: str, messages: Sequence[Message]) -> None:
            client = Redis.from_url(REDIS)
            try:
                for m in messages:
                    headers = json.dumps({**m.headers, "odd": "\ud800"})
                    fields = {"id": m.id, "type": m.type or "", "payload": m.payload}
                    if m.key is not None:
                        fields["key"] = m.key
                    await client.xadd(topic, {**fields, "headers": headers})
            finally:
                await client.aclose()

        return publish


async def test_a_stream_deleted_under_a_blocked_read_is_consumed_again() -> None:
    """An operator deletes the stream while the consumer blocks on it (Redis answers the read
    ``UNBLOCKED the stream key no longer exists``, not ``NOGROUP``): the consumer creates its
    group again and goes on with what is written next, instead of stopping."""
    require_service("Redis", "127.0.0.1", 6379)
    stream = unique_name("ob")
    consumer = RedisConsumer(
        RedisConsumerSettings.from_url(f"{REDIS}?block=3", name="svc", topics=[stream])
    )
    seen: list[str] = []

    async def deliver(batch: Sequence[Message]) -> None:
        seen.extend(m.id for m in batch)

    client = Redis.from_url(REDIS)
    stop = asyncio.Event()
    try:
        await client.xadd(stream, {"id": "before", "payload": "x"})
        async with consumer:
            running = asyncio.create_task(consumer.run(deliver, stop))
            await wait_for(lambda: _true(seen == ["before"]), "the first entry")
            await asyncio.sleep(0.2)  # blocked in XREADGROUP by now
            await client.delete(stream)
            await client.xadd(stream, {"id": "after", "payload": "y"})
            await wait_for(lambda: _true(seen == ["before", "after"] or running.done()), "more")
            assert not running.done(), running.exception()
            assert seen == ["before", "after"]
            stop.set()
            await running
    finally:
        await client.delete(stream)
        await client.aclose()


async def test_pending_entries_trimmed_before_their_ack_are_reported_not_dropped_silently(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A member read two entries and died; the stream was trimmed (``MAXLEN``, ``XTRIM``) before
    they were taken over. ``XAUTOCLAIM`` then returns them as deleted and drops them from the
    group: they may never have been handled and nothing can deliver them again. The consumer
    says so in a warning naming the stream, the count and the ids, instead of nothing (a
    probe)."""
    require_service("Redis", "127.0.0.1", 6379)
    stream = unique_name("ob")
    client = Redis.from_url(REDIS)
    seen: list[str] = []

    async def deliver(batch: Sequence[Message]) -> None:
        seen.extend(m.id for m in batch)

    try:
        await client.xgroup_create(stream, "svc", id="0", mkstream=True)
        lost = [_text(await client.xadd(stream, {"id": f"m{i}", "payload": "x"})) for i in (0, 1)]
        await client.xreadgroup("svc", "dead-member", {stream: ">"}, count=2)
        await client.xtrim(stream, maxlen=0)
        await client.xadd(stream, {"id": "after", "payload": "y"})
        consumer = RedisConsumer(
            RedisConsumerSettings.from_url(
                f"{REDIS}?block=1&claim_idle=0.2", name="svc", topics=[stream]
            )
        )
        stop = asyncio.Event()
        with caplog.at_level(logging.WARNING, logger="outboxer.consumer.redis"):
            async with consumer:
                running = asyncio.create_task(consumer.run(deliver, stop))
                await wait_for(lambda: _true(seen == ["after"] or running.done()), "after")
                stop.set()
                await running
        warnings = [r.message for r in caplog.records if "deleted from the stream" in r.message]
        assert len(warnings) == 1, caplog.text
        assert f"2 entries of stream {stream!r}" in warnings[0]
        assert all(entry_id in warnings[0] for entry_id in lost)
        assert seen == ["after"]
    finally:
        await client.delete(stream)
        await client.aclose()


async def test_streams_the_acl_forbids_are_named_in_one_line() -> None:
    """The consumer's ACL user may not touch its stream's key: Redis answers ``NOPERM``, which
    only an operator can fix. The consumer stops with a ``ConfigurationError`` naming the user
    and the streams (``consume`` exits 2 in one line), not "unexpected NoPermissionError"
    naming neither (a probe). The password is never in it."""
    require_service("Redis", "127.0.0.1", 6379)
    stream = unique_name("ob")
    name, password = unique_name("user"), "s3cret-probe"
    client = Redis.from_url(REDIS)
    await client.execute_command(
        "ACL", "SETUSER", name, "on", f">{password}", f"~{stream}-allowed*", "+@all"
    )
    consumer = RedisConsumer(
        RedisConsumerSettings.from_url(
            f"redis://{name}:{password}@127.0.0.1:6379/0?block=1", name="svc", topics=[stream]
        )
    )

    async def deliver(batch: Sequence[Message]) -> None:
        raise AssertionError("nothing can be read")

    try:
        async with consumer:
            with pytest.raises(ConfigurationError) as raised:
                await asyncio.wait_for(consumer.run(deliver, asyncio.Event()), 10)
        text = str(raised.value)
        assert f"Redis user {name!r} may not use the streams {stream!r}" in text
        assert "NOPERM" in text
        assert password not in text
    finally:
        await client.execute_command("ACL", "DELUSER", name)
        await client.delete(stream)
        await client.aclose()


async def test_entries_of_a_read_whose_reply_was_lost_come_before_newer_ones() -> None:
    """The connection is cut while the consumer blocks in ``XREADGROUP``, after Redis gave it
    ``m1`` (now pending with this live member) and before the reply arrived. redis-py retried
    the read on a new connection and got ``m2``; ``m1`` came only when reclaimed ``claim_idle``
    later: ``[m0, m2, m1]``, one key's order broken (a probe). Now the error reaches the
    consumer, which reads its own pending entries again before anything new."""
    require_service("Redis", "127.0.0.1", 6379)
    stream = unique_name("ob")
    client = Redis.from_url(REDIS)
    seen: list[str] = []

    async def deliver(batch: Sequence[Message]) -> None:
        seen.extend(m.id for m in batch)

    async def pending() -> int:
        return int((await client.xpending(stream, "svc"))["pending"])

    try:
        async with TcpProxy("127.0.0.1", 6379) as proxy:
            consumer = RedisConsumer(
                RedisConsumerSettings.from_url(
                    f"redis://127.0.0.1:{proxy.port}/0?block=2&claim_idle=60",
                    name="svc",
                    topics=[stream],
                )
            )
            stop = asyncio.Event()
            async with consumer:
                running = asyncio.create_task(consumer.run(deliver, stop))
                await client.xadd(stream, {"id": "m0", "payload": "x", "key": "k"})
                await wait_for(lambda: _true(seen == ["m0"]), "m0")
                await asyncio.sleep(0.2)  # blocked in XREADGROUP by now
                await proxy.pause()  # the reply to the blocked read is held back ...
                await client.xadd(stream, {"id": "m1", "payload": "x", "key": "k"})
                await wait_for(lambda: _equal(pending(), 1), "m1 given to the blocked read")
                await proxy.cut()  # ... and lost
                await client.xadd(stream, {"id": "m2", "payload": "x", "key": "k"})
                await proxy.restore()
                await wait_for(lambda: _true("m2" in seen or running.done()), "m2")
                stop.set()
                await running
        assert seen == ["m0", "m1", "m2"]
    finally:
        await client.delete(stream)
        await client.aclose()


async def _equal(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@pytest.mark.parametrize("when", ["at-start", "while-reading"])
async def test_a_topic_whose_key_is_not_a_stream_is_named_in_one_line(when: str) -> None:
    """A topic's key holds a string (a careless operator, another application): Redis answers
    ``WRONGTYPE``, which nothing but an operator can fix. The consumer stops with a
    ``ConfigurationError`` naming the key and what it holds (``consume`` exits 2 in one line),
    not redis-py's bare ``ResponseError`` naming no key (a probe)."""
    require_service("Redis", "127.0.0.1", 6379)
    stream, other = unique_name("ob"), unique_name("ob")
    consumer = RedisConsumer(
        RedisConsumerSettings.from_url(f"{REDIS}?block=1", name="svc", topics=[other, stream])
    )
    seen: list[str] = []

    async def deliver(batch: Sequence[Message]) -> None:
        seen.extend(m.id for m in batch)

    client = Redis.from_url(REDIS)
    try:
        if when == "at-start":
            await client.set(stream, "not a stream")
        else:
            await client.xadd(stream, {"id": "before", "payload": "x"})
        async with consumer:
            running = asyncio.create_task(consumer.run(deliver, asyncio.Event()))
            if when == "while-reading":
                await wait_for(lambda: _true(seen == ["before"]), "the first entry")
                async with client.pipeline(transaction=True) as pipe:
                    await pipe.delete(stream).set(stream, "not a stream").execute()
            with pytest.raises(ConfigurationError) as raised:
                await asyncio.wait_for(running, 10)
        assert f"Redis key {stream!r} holds a string, not a stream" in str(raised.value)
        assert "\n" not in str(raised.value)
    finally:
        await client.delete(stream, other)
        await client.aclose()


async def _true(value: bool) -> bool:
    return value


def test_consumer_options_are_taken_out_of_the_url() -> None:
    settings = RedisConsumerSettings.from_url(
        f"{REDIS}?claim_idle=2.5&block=0.5&socket_timeout=3", name="svc", topics=["s"]
    )
    assert (settings.group, settings.claim_idle, settings.block) == ("svc", 2.5, 0.5)
    assert settings.connection.socket_timeout == 3


@pytest.mark.parametrize("reclaimed_own", [False, True], ids=["read", "read-and-reclaimed"])
async def test_a_restarted_member_takes_over_what_the_dead_one_left_before_reading_anew(
    reclaimed_own: bool,
) -> None:
    """A member killed with entries pending; a new member starts while more of the same key are
    written. Found by a probe: the new member read the new entries at once and handled them
    before the dead member's, which it reclaimed ``claim_idle`` later: the key's order broken
    after one kill -9. Now the pending entries go first. And in entry order: a member that had
    reclaimed its own oldest entries (a slow batch) reset their idle time, so XAUTOCLAIM took
    the newer ones first (a probe); they are taken over once all of them are idle."""
    require_service("Redis", "127.0.0.1", 6379)
    stream = unique_name("ob")
    client = Redis.from_url(REDIS)
    seen: list[str] = []

    async def deliver(batch: Sequence[Message]) -> None:
        seen.extend(m.id for m in batch)

    stop = asyncio.Event()
    try:
        await client.xgroup_create(stream, "svc", id="0", mkstream=True)
        for n in range(5):
            await client.xadd(stream, {"id": f"m{n}", "key": "k", "payload": "{}"})
        dead = await client.xreadgroup("svc", "dead-member", {stream: ">"}, count=5)
        assert len(dead[0][1]) == 5  # read, never acknowledged: the member was killed
        if reclaimed_own:  # ... after it had reclaimed its two oldest (their idle time reset)
            await asyncio.sleep(0.6)
            first_two = [entry_id for entry_id, _ in dead[0][1][:2]]
            await client.xclaim(stream, "svc", "dead-member", 0, first_two)
        for n in range(5, 10):
            await client.xadd(stream, {"id": f"m{n}", "key": "k", "payload": "{}"})
        url = f"{REDIS}?claim_idle=1&block=0.2"
        consumer = RedisConsumer(RedisConsumerSettings.from_url(url, name="svc", topics=[stream]))
        async with consumer:
            running = asyncio.create_task(consumer.run(deliver, stop))
            await wait_for(lambda: _true(len(seen) >= 10 or running.done()), "ten entries")
            stop.set()
            await running
        assert seen == [f"m{n}" for n in range(10)]
        assert (await client.xpending(stream, "svc"))["pending"] == 0
    finally:
        await client.delete(stream)
        await client.aclose()
