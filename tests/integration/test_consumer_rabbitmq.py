"""The consumer contract against RabbitMQ (127.0.0.1:5672): durable queue, manual acks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pika  # type: ignore[import-untyped]
import pika.exceptions  # type: ignore[import-untyped]
import pytest

from outboxer.brokers import consumer_from_url
from outboxer.brokers.rabbitmq import RabbitMQConsumerSettings, wire
from outboxer.brokers.rabbitmq.publisher import RabbitMQPublisher
from outboxer.message import Message
from tests.conftest import require_service, unique_name
from tests.contracts.consumer import ConsumerContract, Prepare, Publish

pytestmark = pytest.mark.timeout(90)

AMQP = "amqp://guest:guest@127.0.0.1:5672/"


def _delete(exchange: str, queues: list[str]) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP))
    try:
        channel = connection.channel()
        for queue in queues:
            channel.queue_delete(queue)
        channel.exchange_delete(exchange)
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError):
            connection.close()


class TestRabbitMQConsumer(ConsumerContract):
    @pytest.fixture
    def exchange(self) -> str:
        require_service("RabbitMQ", "127.0.0.1", 5672)
        return unique_name("x")

    @pytest.fixture
    def broker_url(self, exchange: str) -> str:
        return f"{AMQP}?exchange={exchange}"

    @pytest.fixture
    async def prepare(self, broker_url: str, exchange: str) -> AsyncIterator[Prepare]:
        queues: list[str] = []

        async def prepare(topic: str, name: str) -> None:
            # Entering the adapter declares the queue and binds it: published messages are
            # routed to it from now on, even before the consumer runs.
            async with consumer_from_url(broker_url, name=name, topics=[topic]):
                queues.append(name)

        yield prepare
        await asyncio.to_thread(_delete, exchange, queues)

    @pytest.fixture
    def publish(self, broker_url: str) -> Publish:
        async def publish(topic: str, messages: Sequence[Message]) -> None:
            async with RabbitMQPublisher.from_url(broker_url) as publisher:
                assert list(await publisher.publish(messages)) == [None] * len(messages)

        return publish


def _queue_exists(queue: str) -> bool:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP))
    try:
        connection.channel().queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker:
        return False
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError):
            connection.close()
    return True


async def test_a_queue_deleted_under_the_consumer_is_declared_again_and_consumed() -> None:
    """An operator deletes the queue: RabbitMQ cancels the consumer (``basic.cancel``). It
    used to go on waiting for deliveries that would never come, alive and silent; now it
    reconnects, declares and binds the queue again and consumes what is published next."""
    require_service("RabbitMQ", "127.0.0.1", 5672)
    exchange, queue, topic = unique_name("x"), unique_name("q"), unique_name("t")
    url = f"{AMQP}?exchange={exchange}"
    seen: list[str] = []

    async def deliver(batch: Sequence[Message]) -> None:
        seen.extend(m.id for m in batch)

    async def publish(message_id: str) -> None:
        message = Message(id=message_id, topic=topic, payload=b"{}")
        async with RabbitMQPublisher.from_url(url) as publisher:
            assert list(await publisher.publish([message])) == [None]

    async def routed(message_id: str) -> bool:
        message = Message(id=message_id, topic=topic, payload=b"{}")
        async with RabbitMQPublisher.from_url(url) as publisher:
            [result] = await publisher.publish([message])
        return result is None

    async def until(check: Any, what: str) -> None:
        for _ in range(200):
            if await check():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    stop = asyncio.Event()
    try:
        async with consumer_from_url(url, name=queue, topics=[topic]) as consumer:
            running = asyncio.create_task(consumer.run(deliver, stop))
            await publish("before")
            await until(lambda: _now(seen == ["before"]), "the first message")
            await asyncio.to_thread(_delete, exchange, [queue])
            await until(lambda: asyncio.to_thread(_queue_exists, queue), "the queue again")
            # Declared is not yet bound: until it is, a publish comes back unroutable (and is
            # not delivered), so publish until one is routed.
            await until(lambda: routed("after"), "the queue bound again")
            await until(lambda: _now(seen == ["before", "after"]), "the next message")
            stop.set()
            await running
    finally:
        await asyncio.to_thread(_delete, exchange, [queue])


async def _now(value: bool) -> bool:
    return value


def test_the_key_header_is_the_documented_one() -> None:
    assert wire.KEY_HEADER == "x-outbox-key"


def test_consumer_options_are_taken_out_of_the_url() -> None:
    settings = RabbitMQConsumerSettings.from_url(
        f"{AMQP}?exchange=ex&prefetch=7&queue_type=quorum&heartbeat=10",
        name="svc",
        topics=["orders.*"],
    )
    assert (settings.queue, settings.window, settings.queue_type) == ("svc", 7, "quorum")
    assert (settings.connection.exchange, settings.connection.heartbeat) == ("ex", 10)
