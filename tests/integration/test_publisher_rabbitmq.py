"""RabbitMQPublisher against the real RabbitMQ on 127.0.0.1:5672 (guest/guest).

Every test gets its own exchange (deleted afterwards). What the broker received is read back
through an exclusive queue bound to the exchange with routing key = the test's topic, declared
*before* anything is published (a topic exchange drops messages no queue is bound for yet).
The reading side is pika's BlockingConnection, run in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pika
import pika.exceptions
import pytest

from outboxer.brokers import publisher_from_url
from outboxer.brokers.rabbitmq import RabbitMQPublisher, RabbitMQSettings
from outboxer.brokers.rabbitmq.wire import KEY_HEADER
from outboxer.errors import (
    BrokerUnavailable,
    ConfigurationError,
    PermanentPublishError,
    RetryablePublishError,
)
from outboxer.message import TEXT, Message
from tests.conftest import require_service, unique_name
from tests.contracts.publisher import PublisherContract, Received, make_message
from tests.tcp_proxy import TcpProxy

HOST, PORT = "127.0.0.1", 5672
BASE_URL = f"amqp://guest:guest@{HOST}:{PORT}/"


class Inspector:
    """Declares, binds and reads on its own blocking pika connection (call it via to_thread)."""

    def __init__(self, exchange: str) -> None:
        self.exchange = exchange
        self.connection = pika.BlockingConnection(
            pika.ConnectionParameters(HOST, PORT, heartbeat=0)
        )
        self.channel = self.connection.channel()
        self.queues: dict[str, str] = {}  # routing key -> exclusive queue bound for it

    def declare_exchange(self) -> None:
        self.channel.exchange_declare(self.exchange, exchange_type="topic", durable=True)

    def bind(self, routing_key: str, arguments: dict[str, Any] | None = None) -> str:
        self.declare_exchange()
        queue = self.channel.queue_declare("", exclusive=True, arguments=arguments).method.queue
        self.channel.queue_bind(queue, self.exchange, routing_key=routing_key)
        self.queues[routing_key] = queue
        return str(queue)

    def get(self, routing_key: str, count: int, timeout: float = 5.0) -> list[Any]:
        """Up to ``count`` deliveries ``(method, properties, body)``, in queue order."""
        queue = self.queues[routing_key]
        got: list[Any] = []
        waited = 0.0
        while len(got) < count and waited < timeout:
            method, properties, body = self.channel.basic_get(queue, auto_ack=True)
            if method is None:
                self.connection.sleep(0.05)
                waited += 0.05
                continue
            got.append((method, properties, body))
        return got

    def count(self, routing_key: str) -> int:
        queue = self.queues[routing_key]
        return int(self.channel.queue_declare(queue, passive=True).method.message_count)

    def delete_exchange(self) -> None:
        self.channel.exchange_delete(self.exchange)

    def close(self) -> None:
        with contextlib.suppress(pika.exceptions.AMQPError):
            if self.channel.is_open:
                self.channel.exchange_delete(self.exchange)
        with contextlib.suppress(pika.exceptions.AMQPError):
            self.connection.close()


def _received(delivery: Any) -> Received:
    _, properties, body = delivery
    headers = {
        str(k): v.decode() if isinstance(v, bytes) else str(v)
        for k, v in (properties.headers or {}).items()
    }
    return Received(
        id=properties.message_id,
        key=headers.pop(KEY_HEADER, None),
        type=properties.type,
        payload=body,
        headers=headers,
    )


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _outcome(publisher: RabbitMQPublisher, messages: Sequence[Message]) -> list[Any]:
    """The per-message results, or the BrokerUnavailable raised for all of them."""
    try:
        return list(await publisher.publish(messages))
    except BrokerUnavailable as exc:
        return [exc] * len(messages)


@pytest.fixture
def amqp_url() -> str:
    require_service("RabbitMQ", HOST, PORT)
    return BASE_URL


@pytest.fixture
def exchange() -> str:
    return unique_name("outboxer-test")


@pytest.fixture
async def inspector(amqp_url: str, exchange: str) -> AsyncIterator[Inspector]:
    spy = await asyncio.to_thread(Inspector, exchange)
    try:
        yield spy
    finally:
        await asyncio.to_thread(spy.close)


@pytest.fixture
async def bound(inspector: Inspector, topic: str) -> Inspector:
    """The test's topic is bound to a fresh exclusive queue before anything is published."""
    await asyncio.to_thread(inspector.bind, topic)
    return inspector


@pytest.fixture
def url(amqp_url: str, exchange: str) -> str:
    return f"{amqp_url}?exchange={exchange}&connect_timeout=3&confirm_timeout=5"


@pytest.fixture
async def publisher(url: str, bound: Inspector) -> AsyncIterator[RabbitMQPublisher]:
    async with RabbitMQPublisher.from_url(url) as pub:
        yield pub


class TestRabbitMQContract(PublisherContract):
    @pytest.fixture
    def read_back(self, bound: Inspector) -> Any:
        async def read(topic: str, count: int) -> Sequence[Received]:
            deliveries = await asyncio.to_thread(bound.get, topic, count)
            return [_received(d) for d in deliveries]

        return read

    @pytest.fixture
    def unreachable_publisher(self, exchange: str) -> RabbitMQPublisher:
        return RabbitMQPublisher.from_url(
            f"amqp://guest:guest@127.0.0.1:{_closed_port()}/?exchange={exchange}"
        )

    @pytest.fixture
    def permanent_failure(self, bound: Inspector) -> Any:
        # Only the test's own topic is bound: this routing key reaches no queue and is returned.
        return lambda topic: make_message(f"{topic}-nowhere", 0)


# -- wire format -------------------------------------------------------------------------------


async def test_wire_format(publisher: RabbitMQPublisher, bound: Inspector, topic: str) -> None:
    created = dt.datetime(2024, 5, 17, 12, 30, 45, 250_000, tzinfo=dt.UTC)
    keyed = make_message(
        topic,
        1,
        key="order-7",
        type="OrderCreated",
        headers={"tenant": "acme"},
        created_at=created,
    )
    plain = Message(id="custom-id-1", topic=topic, payload=b"hello", content_type=TEXT)
    assert list(await publisher.publish([keyed, plain])) == [None, None]
    (m1, p1, b1), (_, p2, b2) = await asyncio.to_thread(bound.get, topic, 2)

    assert (m1.exchange, m1.routing_key) == (bound.exchange, topic)
    assert p1.message_id == keyed.id
    assert p1.type == "OrderCreated"
    assert p1.timestamp == int(created.timestamp())  # AMQP timestamps are whole seconds
    assert p1.content_type == "application/json"
    assert p1.delivery_mode == 2  # persistent
    assert dict(p1.headers) == {
        "tenant": "acme",
        KEY_HEADER: "order-7",
    }
    assert b1 == keyed.payload

    assert p2.message_id == "custom-id-1"
    assert p2.type is None
    assert p2.content_type == TEXT
    assert not p2.headers  # no key, no user headers: no x-outbox-key either
    assert b2 == b"hello"


async def test_exchange_is_declared_topic_and_durable(
    publisher: RabbitMQPublisher, inspector: Inspector
) -> None:
    # Redeclaring with the same settings succeeds; with another type RabbitMQ refuses (406).
    await asyncio.to_thread(inspector.declare_exchange)

    def redeclare_direct() -> None:
        inspector.channel.exchange_declare(inspector.exchange, "direct", durable=True)

    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        await asyncio.to_thread(redeclare_direct)
    assert refused.value.reply_code == 406
    inspector.channel = await asyncio.to_thread(inspector.connection.channel)

    def redeclare_transient() -> None:
        inspector.channel.exchange_declare(inspector.exchange, "topic", durable=False)

    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        await asyncio.to_thread(redeclare_transient)
    inspector.channel = await asyncio.to_thread(inspector.connection.channel)


async def test_publisher_from_url_picks_this_adapter(url: str) -> None:
    publisher = publisher_from_url(url)
    assert isinstance(publisher, RabbitMQPublisher)
    assert publisher_from_url(url.replace("amqp://", "amqps://")).settings.tls


# -- outcomes ----------------------------------------------------------------------------------


async def test_unroutable_is_permanent_by_default(
    publisher: RabbitMQPublisher, bound: Inspector, topic: str
) -> None:
    lost = make_message(f"{topic}.elsewhere", 1)
    ok = make_message(topic, 2)
    results = await publisher.publish([lost, ok, dataclasses.replace(lost, id="x2")])
    assert isinstance(results[0], PermanentPublishError)
    assert results[1] is None
    assert isinstance(results[2], PermanentPublishError)
    text = str(results[0])
    assert bound.exchange in text
    assert f"{topic}.elsewhere" in text
    assert await asyncio.to_thread(bound.count, topic) == 1


async def test_unroutable_ack_counts_as_delivered(url: str, bound: Inspector, topic: str) -> None:
    async with RabbitMQPublisher.from_url(f"{url}&unroutable=ack") as publisher:
        results = await publisher.publish(
            [make_message(f"{topic}.elsewhere", 1), make_message(topic, 2)]
        )
    assert list(results) == [None, None]
    assert await asyncio.to_thread(bound.count, topic) == 1


async def test_nack_is_retryable(url: str, inspector: Inspector, topic: str) -> None:
    # A queue that refuses everything: RabbitMQ nacks with overflow=reject-publish when full.
    await asyncio.to_thread(
        inspector.bind, topic, {"x-max-length": 0, "x-overflow": "reject-publish"}
    )
    async with RabbitMQPublisher.from_url(url) as publisher:
        results = await publisher.publish([make_message(topic, n) for n in range(3)])
        assert all(isinstance(r, RetryablePublishError) for r in results), results
        assert "nack" in str(results[0])
        # The channel survives a nack: the publisher keeps working.
        other = make_message(f"{topic}.elsewhere", 9)
        assert isinstance((await publisher.publish([other]))[0], PermanentPublishError)


async def test_refuses_what_amqp_cannot_carry(url: str, bound: Inspector, topic: str) -> None:
    async with RabbitMQPublisher.from_url(f"{url}&max_message_size=1000") as publisher:
        long_topic = make_message("t" * 256, 1)
        long_type = make_message(topic, 2, type="T" * 300)
        long_header = make_message(topic, 3, headers={"h" * 256: "v"})
        big = Message(id="big", topic=topic, payload=b"x" * 1001)
        fine = make_message(topic, 4, type="é" * 127)  # 254 bytes: still fits
        broken = make_message(topic, 5, type="bad \udc80 surrogate")  # not encodable
        # Headers over one frame (a probe: RabbitMQ closed the connection, an outage forever)
        huge_headers = make_message(topic, 6, headers={"trace": "x" * 200_000})
        batch = [long_topic, long_type, long_header, big, broken, huge_headers, fine]
        results = await publisher.publish(batch)
        assert (await publisher.publish([make_message(topic, 7)])) == [None]  # still connected
    assert [type(r) for r in results[:6]] == [PermanentPublishError] * 6
    assert "routing key" in str(results[0])
    assert "max_message_size" in str(results[3])
    assert "cannot encode" in str(results[4])
    assert "more than one AMQP frame holds" in str(results[5])
    assert results[6] is None
    assert await asyncio.to_thread(bound.count, topic) == 2


async def test_large_payloads_span_several_frames(
    publisher: RabbitMQPublisher, bound: Inspector, topic: str
) -> None:
    # frame_max is 128 KiB: these bodies are split into 3 and 9 body frames.
    big = [
        Message(id=f"big-{n}", topic=topic, payload=bytes([n]) * size)
        for n, size in enumerate((300_000, 1_100_000))
    ]
    small = make_message(topic, 1)
    assert list(await publisher.publish([big[0], small, big[1]])) == [None] * 3
    received = [_received(d) for d in await asyncio.to_thread(bound.get, topic, 3)]
    assert [(r.id, r.payload) for r in received] == [
        (big[0].id, big[0].payload),
        (small.id, small.payload),
        (big[1].id, big[1].payload),
    ]


async def test_concurrent_calls_share_the_window(url: str, bound: Inspector, topic: str) -> None:
    calls = [
        [make_message(topic, 100 * c + n, key=f"c{c}-k{n % 5}") for n in range(100)]
        for c in range(6)
    ]
    async with RabbitMQPublisher.from_url(f"{url}&max_unconfirmed=37") as publisher:
        outcomes = await asyncio.gather(*(publisher.publish(call) for call in calls))
        assert publisher._link is not None
        assert len(publisher._link.unconfirmed) == 0
    assert all(list(o) == [None] * 100 for o in outcomes)
    received = [_received(d) for d in await asyncio.to_thread(bound.get, topic, 600)]
    assert sorted(r.id for r in received) == sorted(m.id for call in calls for m in call)
    for call in calls:  # every key keeps its write order
        for key in {m.key for m in call}:
            assert [r.id for r in received if r.key == key] == [m.id for m in call if m.key == key]


# -- connection loss and recovery --------------------------------------------------------------


@pytest.fixture
async def proxy(amqp_url: str) -> AsyncIterator[TcpProxy]:
    async with TcpProxy(HOST, PORT) as running:
        yield running


def _via(proxy: TcpProxy, exchange: str, **options: object) -> RabbitMQPublisher:
    query = {"exchange": exchange, "connect_timeout": 2, "confirm_timeout": 5, **options}
    return RabbitMQPublisher.from_url(
        f"amqp://guest:guest@127.0.0.1:{proxy.port}/?"
        + "&".join(f"{k}={v}" for k, v in query.items())
    )


async def test_recovers_after_the_connection_is_cut(
    proxy: TcpProxy, bound: Inspector, topic: str
) -> None:
    before, during, still, after = (make_message(topic, n) for n in range(4))
    async with _via(proxy, bound.exchange) as publisher:
        assert list(await publisher.publish([before])) == [None]
        await proxy.cut()
        [outcome] = await _outcome(publisher, [during])
        assert isinstance(outcome, BrokerUnavailable)
        # Still down: the next call tries once more, and fails fast (refused).
        [outcome] = await _outcome(publisher, [still])
        assert isinstance(outcome, BrokerUnavailable)
        await proxy.restore()
        assert list(await publisher.publish([after])) == [None]
    received = [_received(d) for d in await asyncio.to_thread(bound.get, topic, 2)]
    assert [r.id for r in received] == [before.id, after.id]
    assert proxy.accepted == 2  # the refused attempts never reached the proxy's handler


async def test_unconfirmed_messages_are_unavailable_when_the_connection_breaks(
    proxy: TcpProxy, bound: Inspector, topic: str
) -> None:
    confirmed = [make_message(topic, n) for n in range(50)]
    stranded = [make_message(topic, 100 + n) for n in range(300)]
    async with _via(proxy, bound.exchange) as publisher:
        assert list(await publisher.publish(confirmed)) == [None] * 50
        await proxy.pause()  # writes go nowhere, so no confirm can come back
        task = asyncio.ensure_future(publisher.publish(stranded))
        link = publisher._link
        assert link is not None
        while len(link.unconfirmed) < 300:
            await asyncio.sleep(0.01)
        await proxy.cut()
        results = await task
        assert all(isinstance(r, BrokerUnavailable) for r in results), results
        assert "connection lost" in str(results[0])
        await proxy.restore()
        assert list(await publisher.publish(stranded[:1])) == [None]
    # Never None before the broker confirmed: only what was confirmed (and the retry) is there.
    received = [_received(d) for d in await asyncio.to_thread(bound.get, topic, 51)]
    assert [r.id for r in received] == [m.id for m in confirmed] + [stranded[0].id]


async def test_missing_confirms_time_out_as_unavailable(
    proxy: TcpProxy, bound: Inspector, topic: str
) -> None:
    async with _via(proxy, bound.exchange, confirm_timeout=0.5) as publisher:
        await proxy.pause()
        results = await publisher.publish([make_message(topic, n) for n in range(5)])
        assert all(isinstance(r, BrokerUnavailable) for r in results)
        assert "confirm_timeout=0.5" in str(results[0])
        await proxy.resume()
        assert list(await publisher.publish([make_message(topic, 9)])) == [None]
    assert proxy.accepted == 2  # the stalled connection was dropped and replaced


async def test_channel_closed_by_the_broker_then_recovers(
    publisher: RabbitMQPublisher, bound: Inspector, topic: str
) -> None:
    assert list(await publisher.publish([make_message(topic, 1)])) == [None]
    # Deleting the exchange makes RabbitMQ close the channel on the next publish (404).
    await asyncio.to_thread(bound.delete_exchange)
    [outcome] = await _outcome(publisher, [make_message(topic, 2)])
    assert isinstance(outcome, BrokerUnavailable)
    assert "404" in str(outcome) or "NOT_FOUND" in str(outcome)
    await asyncio.to_thread(bound.bind, topic)  # the exchange and the binding come back
    third = make_message(topic, 3)
    assert list(await publisher.publish([third])) == [None]  # reconnected and redeclared
    [delivery] = await asyncio.to_thread(bound.get, topic, 1)
    assert _received(delivery).id == third.id


async def test_connection_closed_by_the_broker_then_recovers(
    url: str, bound: Inspector, topic: str
) -> None:
    name = unique_name("outboxer-conn")
    async with RabbitMQPublisher.from_url(f"{url}&connection_name={name}") as publisher:
        assert list(await publisher.publish([make_message(topic, 1)])) == [None]
        await asyncio.to_thread(_close_connection_named, name)
        assert publisher._link is not None
        await asyncio.wait_for(asyncio.shield(publisher._link.gone), 10)
        [outcome] = await _outcome(publisher, [make_message(topic, 2)])
        # The broker's close arrived first, so this call reconnected and published.
        assert outcome is None


def _close_connection_named(name: str) -> None:
    listing = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "pid", "client_properties"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    [line] = [line for line in listing.splitlines() if name in line]
    subprocess.run(
        ["rabbitmqctl", "-q", "close_connection", line.split("\t")[0], "test closes it"],
        capture_output=True,
        check=True,
        timeout=60,
    )


async def test_closed_publisher_refuses_and_reenters(
    url: str, bound: Inspector, topic: str
) -> None:
    publisher = RabbitMQPublisher.from_url(url)
    async with publisher:
        assert list(await publisher.publish([make_message(topic, 1)])) == [None]
    with pytest.raises(BrokerUnavailable, match="closed"):
        await publisher.publish([make_message(topic, 2)])
    async with publisher:
        assert list(await publisher.publish([make_message(topic, 3)])) == [None]


async def test_login_refused_is_unavailable_and_hides_the_password(exchange: str) -> None:
    require_service("RabbitMQ", HOST, PORT)
    publisher = RabbitMQPublisher.from_url(
        f"amqp://guest:s3cr3t-w0rd@{HOST}:{PORT}/?exchange={exchange}"
    )
    with pytest.raises(BrokerUnavailable) as refused:
        async with publisher:
            pass
    assert "login refused" in str(refused.value)
    assert "s3cr3t-w0rd" not in str(refused.value)
    assert "s3cr3t-w0rd" not in repr(publisher)


async def test_exchange_of_another_type_is_unavailable(
    url: str, inspector: Inspector, topic: str
) -> None:
    def declare_direct() -> None:
        inspector.channel.exchange_declare(inspector.exchange, "direct", durable=True)

    await asyncio.to_thread(declare_direct)
    publisher = RabbitMQPublisher.from_url(url)
    with pytest.raises(BrokerUnavailable, match="PRECONDITION_FAILED"):
        async with publisher:
            pass
    assert publisher._link is None  # nothing half-open is kept


async def test_missing_vhost_is_unavailable(amqp_url: str, exchange: str) -> None:
    publisher = RabbitMQPublisher.from_url(f"{amqp_url}no-such-vhost?exchange={exchange}")
    with pytest.raises(BrokerUnavailable, match="access refused"):
        async with publisher:
            pass


async def test_empty_batch_needs_no_broker() -> None:
    assert (
        list(await RabbitMQPublisher.from_url(f"amqp://127.0.0.1:{_closed_port()}/").publish([]))
        == []
    )


# -- URL parsing -------------------------------------------------------------------------------


def test_url_defaults() -> None:
    s = RabbitMQSettings.from_url("amqp://rabbit.internal")
    assert (s.host, s.port, s.username, s.password, s.virtual_host) == (
        "rabbit.internal",
        5672,
        "guest",
        "guest",
        "/",
    )
    assert (s.exchange, s.unroutable, s.tls) == ("outbox", "dead-letter", False)
    assert RabbitMQSettings.from_url("amqps://h/").port == 5671


def test_url_with_everything() -> None:
    s = RabbitMQSettings.from_url(
        "amqps://relay%40corp:p%3Ass@mq.example:5000/prod%2Forders?exchange=events.v1"
        "&unroutable=ack&max_unconfirmed=64&confirm_timeout=2.5&connect_timeout=1"
        "&heartbeat=0&max_message_size=4096&connection_name=relay-1"
    )
    assert (s.host, s.port, s.username, s.password) == ("mq.example", 5000, "relay@corp", "p:ss")
    assert s.virtual_host == "prod/orders"
    assert s.tls
    assert (s.exchange, s.unroutable, s.max_unconfirmed) == ("events.v1", "ack", 64)
    assert (s.confirm_timeout, s.connect_timeout, s.heartbeat) == (2.5, 1.0, 0)
    assert (s.max_message_size, s.connection_name) == (4096, "relay-1")
    assert s.safe_url() == "amqps://relay%40corp@mq.example:5000/prod%2Forders"
    assert "p:ss" not in repr(s)


def test_amqps_connects_with_tls() -> None:
    plain = RabbitMQSettings.from_url("amqp://h").connection_parameters()
    assert plain.ssl_options is None
    tls = RabbitMQSettings.from_url("amqps://rabbit.internal").connection_parameters()
    assert tls.ssl_options is not None
    assert tls.ssl_options.server_hostname == "rabbit.internal"
    assert tls.ssl_options.context.verify_mode == ssl.CERT_REQUIRED
    assert (tls.port, tls.connection_attempts) == (5671, 1)


@pytest.mark.parametrize("path", ["", "/", "/%2F", "/%2f"])
def test_default_vhost_spellings(path: str) -> None:
    assert RabbitMQSettings.from_url(f"amqp://h{path}").virtual_host == "/"


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("kafka://h:9092", "scheme kafka:// is not accepted"),
        ("amqp://u:topsecret@h:99999/", "port '99999'"),
        ("amqp://u:topsecret@h:abc/", "port 'abc'"),
        ("amqp://u:topsecret@h/?exchnage=x", "unknown option 'exchnage'"),
        ("amqp://u:topsecret@h/?exchange=", "invalid RabbitMQ exchange name"),
        ("amqp://u:topsecret@h/?exchange=a%20b", "invalid RabbitMQ exchange name"),
        ("amqp://u:topsecret@h/?unroutable=drop", "unroutable='drop'"),
        ("amqp://u:topsecret@h/?confirm_timeout=soon", "confirm_timeout='soon'"),
        ("amqp://u:topsecret@h/?confirm_timeout=0", "confirm_timeout=0.0"),
        ("amqp://u:topsecret@h/?max_unconfirmed=0", "max_unconfirmed=0"),
        ("amqp://u:topsecret@h/?heartbeat=-1", "heartbeat=-1"),
        ("amqp://u:topsecret@h/?exchange=a&exchange=b", "'exchange' is given more than once"),
    ],
)
def test_bad_urls_are_one_readable_line(url: str, complaint: str) -> None:
    with pytest.raises(ConfigurationError) as bad:
        RabbitMQPublisher.from_url(url)
    message = str(bad.value)
    assert complaint in message
    assert "\n" not in message
    assert "topsecret" not in message
