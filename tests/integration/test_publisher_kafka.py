"""The Kafka publisher against a real Kafka-protocol broker (Tansu, started by ``tests.tansu``).

Topics are created per test with the admin client: the publisher never auto-creates them unless
asked to. The recovery tests start their own Tansu so that stopping it touches no other test.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from outboxer._ids import new_message_id
from outboxer.brokers import publisher_from_url
from outboxer.brokers.kafka import KafkaPublisher, KafkaSettings
from outboxer.errors import (
    BrokerUnavailable,
    ConfigurationError,
    PermanentPublishError,
    PublishError,
)
from outboxer.message import TEXT, Message
from tests.conftest import unique_name
from tests.contracts.publisher import PublisherContract, Received, make_message
from tests.tansu import TansuBroker, create_topic, free_port, kafka_bootstrap  # noqa: F401

_client_log = logging.getLogger("tests.kafka.consumer")


@dataclass(frozen=True)
class Record:
    """One Kafka record as a consumer sees it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]

    def header(self, name: str) -> str | None:
        values = [v.decode() for n, v in self.headers if n == name]
        assert len(values) <= 1, f"header {name} appears {len(values)} times"
        return values[0] if values else None


def _consume(bootstrap: str, topic: str, count: int, timeout: float) -> list[Record]:
    """Read ``topic`` from the beginning of every partition (no consumer group join) until
    ``count`` records arrived, then a moment longer so that extra records would show."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            # assign() never joins the group; the id is only required by the client.
            "group.id": f"read-back-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "logger": _client_log,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(metadata.partitions)]
        )
        records: list[Record] = []
        deadline = time.monotonic() + timeout
        settle_until: float | None = None
        while time.monotonic() < (settle_until or deadline):
            for message in consumer.consume(1000, 0.2):
                error = message.error()
                assert error is None, error
                value = message.value()
                records.append(
                    Record(
                        partition=message.partition() or 0,
                        offset=message.offset() or 0,
                        key=message.key(),
                        value=value if value is not None else b"",
                        headers=[(n, v or b"") for n, v in message.headers() or []],
                    )
                )
            if len(records) >= count and settle_until is None:
                settle_until = time.monotonic() + 0.3
        return records
    finally:
        consumer.close()


async def read_records(bootstrap: str, topic: str, count: int, timeout: float = 20) -> list[Record]:
    return await asyncio.to_thread(_consume, bootstrap, topic, count, timeout)


def _received(record: Record) -> Received:
    return Received(
        id=record.header("ce_id") or "",
        key=record.key.decode() if record.key is not None else None,
        type=record.header("ce_type"),
        payload=record.value,
        headers={n: v.decode() for n, v in record.headers},
    )


def _new_topic(bootstrap: str) -> str:
    name = unique_name("topic").replace("_", "-")
    create_topic(bootstrap, name, partitions=3)
    return name


@pytest.fixture
def kafka_topic(kafka_bootstrap: str) -> str:  # noqa: F811 - the fixture imported above
    return _new_topic(kafka_bootstrap)


@pytest.fixture
async def kafka_publisher(kafka_bootstrap: str) -> AsyncIterator[KafkaPublisher]:  # noqa: F811
    # A missing topic fails after 1 s instead of 5 s: these tests create topics beforehand.
    url = f"kafka://{kafka_bootstrap}?missing_topic_timeout=1"
    async with KafkaPublisher.from_url(url) as publisher:
        yield publisher


class TestKafkaPublisher(PublisherContract):
    @pytest.fixture
    def topic(self, kafka_topic: str) -> str:
        return kafka_topic

    @pytest.fixture
    def publisher(self, kafka_publisher: KafkaPublisher) -> KafkaPublisher:
        return kafka_publisher

    @pytest.fixture
    def read_back(self, kafka_bootstrap: str) -> Any:  # noqa: F811
        async def read(topic: str, count: int) -> Sequence[Received]:
            return [_received(r) for r in await read_records(kafka_bootstrap, topic, count)]

        return read

    @pytest.fixture
    def unreachable_publisher(self) -> KafkaPublisher:
        return KafkaPublisher.from_url(f"kafka://127.0.0.1:{free_port()}")

    @pytest.fixture
    def permanent_failure(self) -> Callable[[str], Message]:
        # A topic nobody created: auto-creation is off, so it can never be published to.
        return lambda topic: make_message(f"{topic}-missing", 0)


# -- wire format ---------------------------------------------------------------------------


async def test_wire_format_is_cloudevents_binary_mode(
    kafka_bootstrap: str,  # noqa: F811
    kafka_topic: str,
) -> None:
    created = dt.datetime(2025, 1, 31, 12, 0, 0, 123456, tzinfo=dt.UTC)
    message = Message(
        id=new_message_id(),
        topic=kafka_topic,
        payload=b"hello \xff binary",
        key="order-42",
        type="OrderCreated",
        headers={"tenant": "acme", "ce_id": "forged", "ce_subject": "orders/42"},
        content_type=TEXT,
        created_at=created,
    )
    settings = KafkaSettings.from_url(f"kafka://{kafka_bootstrap}?source=/shop/orders")
    async with KafkaPublisher(settings) as publisher:
        assert list(await publisher.publish([message])) == [None]
    [record] = await read_records(kafka_bootstrap, kafka_topic, 1)
    assert record.key == b"order-42"
    assert record.value == b"hello \xff binary"
    assert [name for name, _ in record.headers] == [
        "ce_id",
        "ce_source",
        "ce_specversion",
        "ce_time",
        "content-type",
        "ce_type",
        "tenant",
        "ce_subject",
    ]
    assert record.header("ce_id") == message.id  # the user's "ce_id" header is not sent
    assert record.header("ce_type") == "OrderCreated"
    assert record.header("ce_source") == "/shop/orders"
    assert record.header("ce_specversion") == "1.0"
    assert record.header("ce_time") == "2025-01-31T12:00:00.123456Z"
    assert record.header("content-type") == "text/plain; charset=utf-8"
    assert record.header("tenant") == "acme"
    assert record.header("ce_subject") == "orders/42"


async def test_message_without_type_or_key(
    kafka_publisher: KafkaPublisher,
    kafka_bootstrap: str,  # noqa: F811
    kafka_topic: str,
) -> None:
    message = Message(id=new_message_id(), topic=kafka_topic, payload=b"{}")
    assert list(await kafka_publisher.publish([message])) == [None]
    [record] = await read_records(kafka_bootstrap, kafka_topic, 1)
    assert record.key is None
    assert record.header("ce_type") is None  # omitted, not an empty string
    assert record.header("ce_id") == message.id
    assert record.header("ce_source") == "outboxer"
    assert record.header("content-type") == "application/json"


async def test_same_key_lands_on_one_partition_in_order(
    kafka_publisher: KafkaPublisher,
    kafka_bootstrap: str,  # noqa: F811
    kafka_topic: str,
) -> None:
    messages = [make_message(kafka_topic, n, key="one-key") for n in range(50)]
    assert list(await kafka_publisher.publish(messages)) == [None] * 50
    records = await read_records(kafka_bootstrap, kafka_topic, 50)
    assert len({r.partition for r in records}) == 1
    assert [r.header("ce_id") for r in records] == [m.id for m in messages]


async def test_concurrent_batches_are_all_acknowledged(
    kafka_publisher: KafkaPublisher,
    kafka_bootstrap: str,  # noqa: F811
    kafka_topic: str,
) -> None:
    batches = [
        [make_message(kafka_topic, b * 500 + n, key=f"k{b}-{n % 50}") for n in range(500)]
        for b in range(4)
    ]
    results = await asyncio.gather(*(kafka_publisher.publish(batch) for batch in batches))
    assert all(list(r) == [None] * 500 for r in results)
    records = await read_records(kafka_bootstrap, kafka_topic, 2000)
    assert sorted(r.header("ce_id") or "" for r in records) == sorted(
        m.id for batch in batches for m in batch
    )
    for batch in batches:  # per-key order within every call
        for key in {m.key for m in batch}:
            expected = [m.id for m in batch if m.key == key]
            assert [r.header("ce_id") for r in records if r.key == key.encode()] == expected


# -- error classification ------------------------------------------------------------------


async def test_missing_topic_is_permanent_and_named(
    kafka_publisher: KafkaPublisher, kafka_topic: str
) -> None:
    missing = f"{kafka_topic}-nobody-created-me"
    results = await kafka_publisher.publish(
        [make_message(missing, 1), make_message(kafka_topic, 2), make_message(missing, 3)]
    )
    assert results[1] is None
    for result in (results[0], results[2]):
        assert isinstance(result, PermanentPublishError)
        assert repr(missing) in str(result)
        assert "auto_create_topics" in str(result)
    # Once librdkafka knows the topic is missing, produce() refuses at once: same verdict.
    [again] = await kafka_publisher.publish([make_message(missing, 4)])
    assert isinstance(again, PermanentPublishError)
    assert repr(missing) in str(again)


async def test_a_topic_created_after_its_records_failed_is_published_to(
    kafka_publisher: KafkaPublisher,
    kafka_topic: str,
    kafka_bootstrap: str,  # noqa: F811
) -> None:
    # The operator's fix for a missing topic: create it, replay the dead letter. librdkafka
    # keeps the topic as absent until its next periodic metadata refresh (minutes); the
    # publisher asks for the topic's metadata again before the next record for it.
    late = f"{kafka_topic}-created-late"
    [missing] = await kafka_publisher.publish([make_message(late, 1)])
    assert isinstance(missing, PermanentPublishError)
    await asyncio.to_thread(create_topic, kafka_bootstrap, late, 1)
    assert await kafka_publisher.publish([make_message(late, 2)]) == [None]


async def test_auto_create_topics_when_asked(
    kafka_bootstrap: str,  # noqa: F811
) -> None:
    topic = unique_name("auto").replace("_", "-")
    url = f"kafka://{kafka_bootstrap}?auto_create_topics=true"
    async with KafkaPublisher.from_url(url) as publisher:
        message = make_message(topic, 1)
        assert list(await publisher.publish([message])) == [None]
    [record] = await read_records(kafka_bootstrap, topic, 1)
    assert record.header("ce_id") == message.id


async def test_too_large_record_is_permanent_and_alone(
    kafka_publisher: KafkaPublisher,
    kafka_bootstrap: str,  # noqa: F811
    kafka_topic: str,
) -> None:
    big = dataclasses.replace(make_message(kafka_topic, 0), payload=b"x" * 2_000_000)
    good = make_message(kafka_topic, 1)
    results = await kafka_publisher.publish([big, good])
    assert isinstance(results[0], PermanentPublishError)
    assert "MSG_SIZE_TOO_LARGE" in str(results[0])
    assert results[1] is None
    [record] = await read_records(kafka_bootstrap, kafka_topic, 1)
    assert record.header("ce_id") == good.id


# -- recovery ------------------------------------------------------------------------------


def _all_unavailable(results: Sequence[PublishError | None]) -> bool:
    return all(isinstance(r, BrokerUnavailable) for r in results)


async def test_recovers_after_the_broker_went_away() -> None:
    broker = TansuBroker().start()
    try:
        topic = _new_topic(broker.bootstrap)
        async with KafkaPublisher.from_url(f"kafka://{broker.bootstrap}") as publisher:
            before = make_message(topic, 0, key="a")
            assert list(await publisher.publish([before])) == [None]

            broker.stop()
            started = time.monotonic()
            down = await publisher.publish([make_message(topic, n, key="a") for n in range(1, 4)])
            assert _all_unavailable(down), down
            assert time.monotonic() - started < 15
            assert broker.bootstrap in str(down[0])
            # Still down: the next call tries again (a fresh connection) and says so quickly.
            started = time.monotonic()
            assert _all_unavailable(await publisher.publish([make_message(topic, 4)]))
            assert time.monotonic() - started < 15

            broker.start()  # same port, empty in-memory storage
            create_topic(broker.bootstrap, topic)
            after = make_message(topic, 5, key="a")
            assert list(await publisher.publish([after])) == [None]
            [record] = await read_records(broker.bootstrap, topic, 1)
            assert record.header("ce_id") == after.id
    finally:
        broker.stop()


async def test_recovers_after_a_restart_between_calls() -> None:
    """The broker restarts while the publisher is idle (Tansu then fences the old idempotent
    producer): at most one call reports the outage, and the publisher never stays stuck."""
    broker = TansuBroker().start()
    try:
        topic = _new_topic(broker.bootstrap)
        async with KafkaPublisher.from_url(f"kafka://{broker.bootstrap}") as publisher:
            assert list(await publisher.publish([make_message(topic, 0)])) == [None]
            broker.stop()
            broker.start()
            create_topic(broker.bootstrap, topic)
            outcomes = []
            for n in range(1, 4):
                results = await publisher.publish([make_message(topic, n)])
                outcomes.append(results[0])
                if results[0] is None:
                    break
            assert outcomes[-1] is None, outcomes
            assert len(outcomes) <= 2, outcomes
            assert all(isinstance(o, BrokerUnavailable) for o in outcomes[:-1]), outcomes
    finally:
        broker.stop()


@pytest.mark.parametrize("delay", [0, 0.005])
async def test_broker_killed_during_a_publish_reports_every_message(delay: float) -> None:
    """Killed while the records are queued or in flight: every message is acknowledged or
    reported as an outage, quickly, and nothing hangs."""
    broker = TansuBroker().start()
    try:
        topic = _new_topic(broker.bootstrap)
        async with KafkaPublisher.from_url(f"kafka://{broker.bootstrap}") as publisher:
            assert list(await publisher.publish([make_message(topic, 0)])) == [None]
            messages = [make_message(topic, n, key=f"k{n % 7}") for n in range(2000)]
            call = asyncio.create_task(publisher.publish(messages))
            await asyncio.sleep(delay)
            broker.stop()
            started = time.monotonic()
            results = await asyncio.wait_for(call, timeout=30)
            assert time.monotonic() - started < 15
            assert len(results) == len(messages)
            assert all(r is None or isinstance(r, BrokerUnavailable) for r in results), {
                str(r) for r in results
            }
    finally:
        broker.stop()


async def test_a_broker_that_never_answers_is_reported_within_the_delivery_timeout() -> None:
    """A black hole (the TCP connection opens, no Kafka response ever comes) with the default
    settings: reported as BrokerUnavailable after about 10 s, not librdkafka's 5 minutes."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)
        port = hole.getsockname()[1]
        async with KafkaPublisher.from_url(f"kafka://127.0.0.1:{port}") as publisher:
            started = time.monotonic()
            results = await publisher.publish([make_message("t", n) for n in range(3)])
            elapsed = time.monotonic() - started
    assert _all_unavailable(results), results
    assert 5 < elapsed < 15


# -- lifecycle and configuration -----------------------------------------------------------


async def test_closed_publisher_refuses_to_publish(kafka_bootstrap: str) -> None:  # noqa: F811
    publisher = KafkaPublisher.from_url(f"kafka://{kafka_bootstrap}")
    async with publisher:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        await publisher.publish([make_message("t", 1)])


def test_url_defaults_and_options() -> None:
    settings = KafkaSettings.from_url("kafka://k1:9093,k2,[::1]:9094")
    assert settings.bootstrap_servers == "k1:9093,k2:9092,[::1]:9094"
    assert settings.source == "outboxer"
    assert settings.auto_create_topics is False
    config = settings.producer_config()
    assert config["enable.idempotence"] is True
    assert config["acks"] == "all"
    assert config["allow.auto.create.topics"] is False
    assert config["message.timeout.ms"] == 10_000
    settings = KafkaSettings.from_url(
        "kafka://k1:9092?source=/shop&auto_create_topics=true&linger_ms=2&delivery_timeout=12"
        "&missing_topic_timeout=3&compression=zstd&client_id=relay-1"
    )
    assert (settings.source, settings.auto_create_topics, settings.linger_ms) == ("/shop", True, 2)
    assert (settings.delivery_timeout, settings.missing_topic_timeout) == (12, 3)
    assert (settings.compression, settings.client_id) == ("zstd", "relay-1")
    assert settings.producer_config()["topic.metadata.propagation.max.ms"] == 3000


def test_url_credentials_become_sasl_and_never_show() -> None:
    url = "kafka://alice:s3cr%40t@k1:9092?security_protocol=sasl_ssl&sasl_mechanism=SCRAM-SHA-512"
    settings = KafkaSettings.from_url(url)
    assert (settings.sasl_username, settings.sasl_password) == ("alice", "s3cr@t")
    assert settings.security_protocol == "sasl_ssl"
    assert settings.sasl_mechanism == "SCRAM-SHA-512"
    publisher = KafkaPublisher(settings)
    for text in (repr(settings), repr(publisher), settings.safe_url()):
        assert "s3cr" not in text
    assert settings.safe_url() == "kafka://alice:***@k1:9092"
    assert isinstance(publisher_from_url(url), KafkaPublisher)


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("kafka://", "host"),
        ("kafka://k1:notaport", "port"),
        ("kafka://k1:70000", "port"),
        ("kafka://k1:9092,", "host"),
        ("kafka://k1:9092/topic", "path"),
        ("kafka://k1?linger=5", "unknown option 'linger'"),
        ("kafka://k1?source=a&source=b", "more than once"),
        ("kafka://k1?auto_create_topics=maybe", "true or false"),
        ("kafka://k1?delivery_timeout=soon", "not a number"),
        ("kafka://k1?delivery_timeout=0", "delivery_timeout"),
        ("kafka://k1?compression=brotli", "compression"),
        ("kafka://k1?security_protocol=tls", "security_protocol"),
        ("kafka://u:hunter2@k1?sasl_mechanism=GSSAPI", "sasl_mechanism"),
        ("kafka://u:hunter2@:9092", "host"),
        ("kafkas://k1:9092", "scheme kafkas:// is not accepted"),
    ],
)
def test_bad_urls_are_refused_in_one_line(url: str, complaint: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        KafkaPublisher.from_url(url)
    text = str(info.value)
    assert complaint in text
    assert "\n" not in text
    assert "hunter2" not in text


def test_extra_cannot_weaken_the_guarantees() -> None:
    with pytest.raises(ConfigurationError, match=r"enable\.idempotence"):
        KafkaSettings("k1:9092", extra={"enable.idempotence": False})
    settings = KafkaSettings("k1:9092", extra={"batch.size": 500_000})
    assert settings.producer_config()["batch.size"] == 500_000


async def test_settings_librdkafka_refuses_are_a_configuration_error() -> None:
    publisher = KafkaPublisher(KafkaSettings("127.0.0.1:9092", extra={"no.such.property": 1}))
    with pytest.raises(ConfigurationError, match=r"no\.such\.property"):
        await publisher.__aenter__()


async def test_the_producer_id_is_acquired_before_the_first_claim(
    kafka_bootstrap: str,  # noqa: F811
) -> None:
    # librdkafka's statistics say where its idempotent producer stands ("eos": "idemp_state");
    # the first report emitted after __aenter__ returned must show the producer id requested or
    # assigned.
    # Without the warm-up it shows "WaitTransport" for 0.5-1 s: the first batch waited for it.
    import json

    entered = asyncio.Event()
    states: list[str] = []

    def statistics(report: str) -> None:
        if entered.is_set():
            states.append(json.loads(report)["eos"]["idemp_state"])

    settings = KafkaSettings.from_url(f"kafka://{kafka_bootstrap}")
    extra = {"statistics.interval.ms": 10, "stats_cb": statistics}
    publisher = KafkaPublisher(dataclasses.replace(settings, extra=extra))  # type: ignore[arg-type]
    async with publisher:
        entered.set()
        while not states:
            await asyncio.sleep(0.01)
    # Assigned, or requested already over the connection the warm-up brought up (WaitPID: the
    # answer is one round trip away, seen on a loaded machine); never still waiting for a
    # transport or for librdkafka's 500 ms timer (Init, WaitTransport).
    assert states[0] in ("Assigned", "WaitPID"), states


async def test_an_invalid_topic_name_is_permanent_and_says_so(
    kafka_publisher: KafkaPublisher, kafka_topic: str
) -> None:
    """A probe: a topic Kafka can never have ("orders created", "..", "ü", 250 characters) was
    dead-lettered as "does not exist (auto-creation is off: create it …)", which no one can."""
    invalid = ["orders created", ".", "..", "bestellungen-ü", "x" * 250, "a/b"]
    results = await kafka_publisher.publish(
        [make_message(topic, n) for n, topic in enumerate([*invalid, kafka_topic])]
    )
    assert results[-1] is None
    for topic, result in zip(invalid, results, strict=False):
        assert isinstance(result, PermanentPublishError), (topic, result)
        assert f"{topic!r} is not a valid Kafka topic name" in str(result)
