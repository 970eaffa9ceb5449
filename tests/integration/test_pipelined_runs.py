"""Ordered mode with a publisher that keeps key order: a key's run is one pipelined call, and a
failure in the middle of it never lets the messages behind it count as published first.

Real brokers (Kafka on Tansu, RabbitMQ, NATS JetStream, Redis Streams, an HTTP receiver) and a
real PostgreSQL outbox, a relay in this process. Key ``A`` has eight messages in one batch; its
fourth one fails:

- **the broker refuses it** (a topic it cannot take: no stream, no bound queue, a missing Kafka
  topic, a Redis key that is not a stream, a 400 from the webhook): it is dead-lettered at once,
  and the broker, which was sent the rest of the run right behind it, took those anyway;
- **the publisher fails it** after the broker took it (a retryable failure, as when a confirm
  is a nack or lost): it is retried.

Either way the rest of ``A``'s run is released, not published, and published again after the
failed message: the broker holds every message of ``A`` after its predecessors (the early
copies are bounded duplicates; JetStream drops the second copy by its ``Nats-Msg-Id``), and key
``B`` is delivered once, untouched.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import pytest
import redis.asyncio as aioredis

import outboxer
from outboxer.brokers import publisher_from_url
from outboxer.config import Backoff, RelaySettings, TableNames
from outboxer.errors import PublishError, RetryablePublishError
from outboxer.message import Message
from outboxer.ports import DeadLetterFilter, Publisher, keeps_key_order
from outboxer.relay import Relay
from outboxer.stores.postgres import PostgresStore
from tests.conftest import unique_name
from tests.http_receiver import ReceivedRequest, Reply
from tests.integration.test_relay_brokers import BROKERS, Broker, HttpBroker, NatsBroker

SETTINGS = RelaySettings(
    retry=Backoff(base=0.05, factor=2, cap=0.2),
    min_poll_interval=0.01,
    poll_interval=0.05,
)
FAILED = 3  # the index of A's message that fails


@pytest.fixture(params=sorted(BROKERS))
async def broker(request: pytest.FixtureRequest) -> AsyncIterator[Broker]:
    end: Broker = BROKERS[request.param]()
    start = getattr(end, "start", None)
    if start is not None:
        await start()
    yield end
    await end.cleanup()


async def refusing_topic(broker: Broker) -> tuple[str, str]:
    """A topic the broker refuses for good, and the relay's URL for the broker."""
    bad = unique_name("refused")
    url = broker.url(broker.target[1])
    if isinstance(broker, HttpBroker):

        def refuse(request: ReceivedRequest) -> Reply:
            return Reply(status=400 if request.ce("topic") == bad else 200)

        broker.receiver.responder = refuse
    elif url.startswith("redis"):
        client = aioredis.Redis()
        await client.set(bad, "not a stream")  # XADD answers WRONGTYPE
        await client.aclose()
        broker.streams.append(bad)  # type: ignore[attr-defined]  # deleted at cleanup
    elif url.startswith("kafka"):
        url += "?missing_topic_timeout=1"  # the topic is never created
    # NATS: no stream captures the subject; RabbitMQ: no queue is bound for it.
    return bad, url


class FailsOnce:
    """The real publisher, except that one message's first success is reported as a retryable
    failure (the broker has it: as after a lost confirm)."""

    keeps_key_order = True

    def __init__(self, inner: Publisher, victim: str) -> None:
        self.inner, self.victim, self.failed = inner, victim, False

    async def __aenter__(self) -> FailsOnce:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
        results = list(await self.inner.publish(messages))
        for index, message in enumerate(messages):
            if message.id == self.victim and results[index] is None and not self.failed:
                self.failed = True
                results[index] = RetryablePublishError("injected: the confirm was lost")
        return results


async def write(pg_url: str, schema: str, rows: list[dict[str, Any]]) -> list[str]:
    import asyncpg

    conn = await asyncpg.connect(pg_url)
    try:
        async with conn.transaction():  # one commit: the relay claims the runs in one batch
            return await outboxer.Outbox(schema=schema).enqueue_many_async(conn, rows)
    finally:
        await conn.close()


@pytest.mark.parametrize("failure", ["refused by the broker", "failed by the publisher"])
async def test_a_failure_mid_run_never_lets_the_rest_of_the_key_settle_ahead(
    broker: Broker, failure: str, pg_url: str, pg_schema: str, topic: str
) -> None:
    await broker.prepare(topic)
    bad, url = await refusing_topic(broker)
    refused = failure == "refused by the broker"
    rows = [
        {
            "topic": bad if refused and n == FAILED else topic,
            "payload": {"n": n},
            "key": "A",
        }
        for n in range(8)
    ]
    rows += [{"topic": topic, "payload": {"n": n}, "key": "B"} for n in range(4)]
    async with PostgresStore(pg_url, TableNames(schema=pg_schema)) as store:
        await store.migrate()
        ids = await write(pg_url, pg_schema, rows)
        a, b = ids[:8], ids[8:]
        async with publisher_from_url(url) as real:
            assert keeps_key_order(real)
            publisher = real if refused else FailsOnce(real, a[FAILED])
            relay = Relay(store, publisher, replace(SETTINGS))
            counters = await asyncio.wait_for(relay.drain(), 60)
        stats = await store.stats()
        dead = (await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)).items
    delivered = await broker.delivered_ids(topic, len(ids))
    if refused:  # the webhook receiver records the request it answered with a 400
        delivered = [i for i in delivered if i != a[FAILED]]

    assert stats.pending == stats.in_flight == 0
    assert [d.id for d in dead] == ([a[FAILED]] if refused else [])
    assert counters.retried == (0 if refused else 1)
    behind = a[FAILED + 1 :]
    # The rest of A's run waited for its failed message (a batch claimed while the failed one
    # was being settled may be released once more: it was claimed behind it).
    assert counters.released >= len(behind)
    if not refused:  # the broker took all of A, then A from the failed message on again
        first, after = a, a[FAILED:]
    elif isinstance(broker, HttpBroker):  # the webhook publisher sends nothing behind a failure
        first, after = a[:FAILED], behind
    else:  # pipelined behind the refused message: the broker took the rest of A's run
        first, after = a[:FAILED] + behind, behind
    if isinstance(broker, NatsBroker):
        after = []  # JetStream drops a re-publish of a stored Nats-Msg-Id (duplicate window)
    assert [i for i in delivered if i in a] == [*first, *after], (
        "A's messages are all in the broker again after the failed one, in write order"
    )
    assert [i for i in delivered if i in b] == b, "B is not held back"
