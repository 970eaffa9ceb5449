"""A txoutbox relay process, as a user of txoutbox would write it (``benchmarks.peers`` starts it).

txoutbox (PyPI) is a relay only: the storage is its ``PostgresStorage`` (asyncpg) and the
publisher one async function per message. Each function below publishes with the usual asyncio
client of its broker and the durability outboxer's adapters use, and returns only once the broker
has the message:

- Kafka: confluent-kafka, ``acks=all``, idempotent producer, ``linger.ms=1`` (as outboxer's),
  one future per message resolved by the delivery callback (aiokafka, the client txoutbox's
  README shows, cannot start an idempotent producer on Tansu: ``InitProducerId`` fails);
- RabbitMQ: aio-pika with publisher confirms, persistent messages, ``mandatory``;
- NATS: nats-py JetStream ``publish`` (awaits the PubAck), ``Nats-Msg-Id`` for deduplication;
- Redis: redis-py ``XADD`` (awaits the reply).

Settings follow txoutbox's README: ``batch_size`` and ``concurrency`` raised (a round claims
``batch_size`` rows and publishes up to ``concurrency`` keys at once), a lease that covers the
worst round, ``delete_on_ack`` (outboxer deletes published rows too), strict per-key ordering
(its default). Idle polling is capped at 50 ms so that the relay notices the backlog's commit as
soon as outboxer's relay does (outboxer is woken by NOTIFY).

Run: ``python -m benchmarks.txoutbox_relay BROKER_URL DATABASE_URL SCHEMA [BATCH CONCURRENCY]``;
prints ``ready`` once the relay runs, stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import asyncpg
from txoutbox import OutboxMessage, Relay, RelayConfig
from txoutbox.adapters.postgres import PostgresStorage

Publish = Callable[[OutboxMessage], Awaitable[None]]
TABLE = "txoutbox"
BATCH = 1000
#: redis-py's asyncio pool refuses a 101st connection by default; 10/50/100 keys at once and
#: batches of 100-1,000 measured within the noise of each other on Redis.
CONCURRENCY = 100


@contextlib.asynccontextmanager
async def kafka(url: str) -> AsyncIterator[Publish]:
    import threading

    from confluent_kafka import KafkaException, Producer

    producer = Producer(
        {
            "bootstrap.servers": urllib.parse.urlsplit(url).netloc,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 1,
        }
    )
    loop = asyncio.get_running_loop()
    running = True

    def poll() -> None:  # librdkafka calls delivery callbacks from poll()
        while running:
            producer.poll(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()

    async def publish(message: OutboxMessage) -> None:
        done: asyncio.Future[None] = loop.create_future()

        def delivered(error: Any, _record: Any) -> None:
            if error is None:
                loop.call_soon_threadsafe(done.set_result, None)
            else:
                loop.call_soon_threadsafe(done.set_exception, KafkaException(error))

        producer.produce(message.topic, message.payload, key=message.key, on_delivery=delivered)
        await done

    try:
        yield publish
    finally:
        await asyncio.to_thread(producer.flush, 10)
        running = False
        poller.join()


@contextlib.asynccontextmanager
async def rabbitmq(url: str) -> AsyncIterator[Publish]:
    import aio_pika

    parts = urllib.parse.urlsplit(url)
    exchange_name = urllib.parse.parse_qs(parts.query)["exchange"][0]
    connection = await aio_pika.connect(parts._replace(query="").geturl())
    channel = await connection.channel(publisher_confirms=True)
    exchange = await channel.get_exchange(exchange_name, ensure=False)

    async def publish(message: OutboxMessage) -> None:
        body = aio_pika.Message(
            message.payload,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=str(message.id),
            content_type="application/json",
        )
        await exchange.publish(body, routing_key=message.topic, mandatory=True)

    try:
        yield publish
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def nats(url: str) -> AsyncIterator[Publish]:
    import nats as nats_py

    client = await nats_py.connect(url)
    js = client.jetstream()

    async def publish(message: OutboxMessage) -> None:
        await js.publish(message.topic, message.payload, headers={"Nats-Msg-Id": str(message.id)})

    try:
        yield publish
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def redis(url: str) -> AsyncIterator[Publish]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)

    async def publish(message: OutboxMessage) -> None:
        fields: dict[Any, Any] = {"id": str(message.id), "payload": message.payload}
        if message.key is not None:
            fields["key"] = message.key
        await client.xadd(message.topic, fields)

    try:
        yield publish
    finally:
        await client.aclose()


PUBLISHERS = {"kafka": kafka, "amqp": rabbitmq, "nats": nats, "redis": redis}


async def create_table(pool_or_conn: Any, schema: str) -> None:
    """txoutbox's own DDL (``schema_sql``), in ``schema``."""
    await pool_or_conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    storage = PostgresStorage(pool_or_conn, table=TABLE, schema=schema, delete_on_ack=True)
    await pool_or_conn.execute(storage.schema_sql())


async def main(
    broker: str, database: str, schema: str, batch: int = BATCH, concurrency: int = CONCURRENCY
) -> None:
    pool = await asyncpg.create_pool(database, min_size=2, max_size=4)
    storage = PostgresStorage(pool, table=TABLE, schema=schema, delete_on_ack=True)
    config = RelayConfig(
        batch_size=batch,
        concurrency=concurrency,
        lease=timedelta(seconds=60),
        poll_min=0.05,
        poll_max=0.05,
    )
    async with PUBLISHERS[urllib.parse.urlsplit(broker).scheme](broker) as publish:
        relay = Relay(storage, publish, config=config)
        task = asyncio.create_task(relay.run(handle_signals=True))
        print("ready", flush=True)
        await task
    await pool.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(args[0], args[1], args[2], *(int(a) for a in args[3:])))
