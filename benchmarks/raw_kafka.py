"""Kafka: the raw confluent-kafka ceiling next to the KafkaPublisher's rate.

``raw_ceiling`` produces the messages with confluent-kafka alone (the same producer settings:
idempotent, ``acks=all``, the adapter's ``linger.ms``; the same records: key, value and the
CloudEvents headers built inline) and waits for every delivery report, with no outboxer code;
``adapter_rate`` sends the same messages through
:class:`~outboxer.brokers.kafka.KafkaPublisher` the way the relay calls it (batches of 500,
up to 4 batches at once). Both are warmed up outside the clock (connection, metadata, producer
id) and each run writes to a fresh topic with 3 partitions.

``python benchmarks/raw_kafka.py [kafka://host:port]`` uses the given broker, or else starts a
Tansu broker (``tests/tansu.py``) for the run, sends 20,000 messages of ~120 bytes each way and
prints both rates and their ratio.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Producer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from benchmarks.common import build_messages, publisher_rate  # noqa: E402
from outboxer._ids import new_message_id  # noqa: E402
from outboxer.brokers.kafka import KafkaPublisher, KafkaSettings  # noqa: E402
from outboxer.message import Message  # noqa: E402


def _raw_produce(url: str, messages: Sequence[Message]) -> float:
    settings = KafkaSettings.from_url(url)
    producer = Producer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": settings.linger_ms,
            "partitioner": "murmur2_random",
            "logger": logging.getLogger("raw_kafka"),
        }
    )
    failures: list[KafkaError] = []

    def report(error: KafkaError | None, _record: Any) -> None:
        if error is not None:
            failures.append(error)

    # Warm-up outside the clock: connection, metadata and producer id, as for the adapter.
    producer.produce(messages[0].topic, b"warm-up", on_delivery=report)
    producer.flush(30)
    started = time.perf_counter()
    for m in messages:
        headers: list[tuple[str, str | bytes | None]] = [
            ("ce_id", m.id),
            ("ce_source", "outboxer"),
            ("ce_specversion", "1.0"),
            ("ce_time", m.created_at.replace(tzinfo=None).isoformat("T", "microseconds") + "Z"),
            ("content-type", m.content_type),
        ]
        if m.type is not None:
            headers.append(("ce_type", m.type))
        headers.extend(m.headers.items())
        while True:
            try:
                producer.produce(m.topic, m.payload, m.key, on_delivery=report, headers=headers)
                break
            except BufferError:  # queue full: serve delivery reports to make room
                producer.poll(0.01)
    remaining = producer.flush(60)
    rate = len(messages) / (time.perf_counter() - started)
    producer.close()
    if failures or remaining:
        raise RuntimeError(f"raw produce failed: {failures[:1]} ({remaining} left)")
    return rate


async def raw_ceiling(url: str, messages: list[Message]) -> float:
    """confluent-kafka alone: produce everything, wait for every delivery report; msg/s.

    The client is synchronous, so it runs in one thread (as fast as the client allows, the
    event loop is not involved at all).
    """
    return await asyncio.to_thread(_raw_produce, url, messages)


async def adapter_rate(url: str, messages: list[Message]) -> float:
    """KafkaPublisher.publish with batches of 500, up to 4 concurrently; msg/s."""
    async with KafkaPublisher.from_url(url) as publisher:
        warm_up = Message(id=new_message_id(), topic=messages[0].topic, payload=b"warm-up")
        await publisher.publish([warm_up])  # connection, metadata, producer id: off the clock

        return await publisher_rate(publisher, messages)


def _fresh_topic(bootstrap: str, messages: list[Message]) -> list[Message]:
    from tests.tansu import create_topic

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions=3)
    return [dataclasses.replace(m, topic=topic) for m in messages]


async def main(url: str | None, count: int = 20_000) -> None:
    broker = None
    if url is None:
        from tests.tansu import TansuBroker

        broker = TansuBroker().start()
        url = f"kafka://{broker.bootstrap}"
    try:
        bootstrap = KafkaSettings.from_url(url).bootstrap_servers
        messages = build_messages(count, "unused", keys=None)
        # Interleave the runs and keep the best of each, so neither side profits from warm-up.
        raw = adapter = 0.0
        for _ in range(5):
            raw = max(raw, await raw_ceiling(url, _fresh_topic(bootstrap, messages)))
            adapter = max(adapter, await adapter_rate(url, _fresh_topic(bootstrap, messages)))
    finally:
        if broker is not None:
            broker.stop()
    size = sum(len(m.payload) for m in messages) / len(messages)
    where = "a Tansu started for this run" if broker is not None else url
    print(f"{count} messages, {size:.0f}-byte payloads, broker: {where}")
    print(f"raw confluent-kafka ceiling : {raw:10,.0f} msg/s")
    print(f"KafkaPublisher              : {adapter:10,.0f} msg/s")
    print(f"ratio adapter / raw         : {adapter / raw:10.2f}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
