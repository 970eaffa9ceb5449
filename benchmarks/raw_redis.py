"""Raw Redis Streams ceiling versus the outboxer Redis publisher.

``raw_ceiling`` publishes with redis-py alone (no database, no outboxer code): pipelines of
``XADD`` with the same fields the adapter writes, ``CHUNK`` messages per pipeline and up to
``WINDOW`` pipelines in flight on pooled connections, every reply read. ``adapter_rate`` sends
the same messages through :class:`~outboxer.brokers.redis.RedisPublisher` with batches of 500,
up to 4 batches concurrently, as the relay does.

Run: ``.venv/bin/python benchmarks/raw_redis.py [redis://127.0.0.1:6379/0]``
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Sequence

import redis.asyncio as aioredis

from benchmarks.common import WINDOW, build_messages, publisher_rate, windowed
from outboxer.brokers.redis.publisher import RedisPublisher
from outboxer.message import Message


async def raw_ceiling(url: str, messages: list[Message]) -> float:
    """redis-py alone: pipelined XADD, every reply read, WINDOW pipelines in flight; msg/s."""
    client = aioredis.Redis.from_url(url, max_connections=WINDOW * 2)
    try:
        await client.ping()  # connect before the clock starts, as the adapter's warm-up does

        async def send(chunk: Sequence[Message]) -> None:
            pipe = client.pipeline(transaction=False)
            for m in chunk:
                # Pre-encoded arguments through execute_command: redis-py's fastest path
                # (pipe.xadd with a str dict measured ~10% slower on this payload).
                args: list[bytes] = [b"XADD", m.topic.encode(), b"*", b"id", m.id.encode()]
                if m.type is not None:
                    args += (b"type", m.type.encode())
                if m.key is not None:
                    args += (b"key", m.key.encode())
                args += (
                    b"payload",
                    m.payload,
                    b"headers",
                    json.dumps(dict(m.headers)).encode(),
                    b"content_type",
                    m.content_type.encode(),
                )
                pipe.execute_command(*args)
            replies = await pipe.execute()
            assert len(replies) == len(chunk)

        return await windowed(messages, send)
    finally:
        await client.aclose()


async def adapter_rate(url: str, messages: list[Message]) -> float:
    """RedisPublisher.publish with batches of 500, up to 4 concurrently; msg/s."""
    async with RedisPublisher.from_url(url) as publisher:
        await publisher.publish(messages[:1])  # warm-up: open a connection outside the clock

        return await publisher_rate(publisher, messages)


async def main(url: str, count: int = 20_000) -> None:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    messages = build_messages(count, topic)
    cleanup = aioredis.Redis.from_url(url)
    try:
        # Interleave the runs and keep the best of each, so neither side profits from warm-up.
        raw = adapter = 0.0
        for _ in range(3):
            raw = max(raw, await raw_ceiling(url, messages))
            await cleanup.delete(topic)
            adapter = max(adapter, await adapter_rate(url, messages))
            await cleanup.delete(topic)
    finally:
        await cleanup.delete(topic)
        await cleanup.aclose()
    size = sum(len(m.payload) for m in messages) / len(messages)
    print(f"{count} messages, {size:.0f}-byte payloads, stream {topic} (deleted)")
    print(f"raw redis-py ceiling : {raw:10,.0f} msg/s")
    print(f"RedisPublisher       : {adapter:10,.0f} msg/s")
    print(f"ratio adapter / raw  : {adapter / raw:10.2f}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379/0"))
