"""The consumer contract against Kafka (Tansu, started by the tests): a consumer group whose
offsets are committed only after the inbox transaction."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import pytest
from confluent_kafka import Producer

from outboxer.brokers.kafka import KafkaConsumer, KafkaConsumerSettings
from outboxer.brokers.kafka.publisher import KafkaPublisher
from outboxer.brokers.kafka.wire import header_encoder
from outboxer.errors import ConfigurationError
from outboxer.message import Message
from tests.conftest import unique_name
from tests.contracts.consumer import ConsumerContract, Prepare, Publish
from tests.tansu import TansuBroker, create_topic, free_port, kafka_bootstrap  # noqa: F401

pytestmark = pytest.mark.timeout(120)


class TestKafkaConsumer(ConsumerContract):
    @pytest.fixture
    def broker_url(self, kafka_bootstrap: str) -> str:  # noqa: F811 - the fixture
        # A short session: the partitions of the killed member move on sooner.
        return f"kafka://{kafka_bootstrap}?session_timeout_ms=3000&heartbeat_interval_ms=300"

    @pytest.fixture
    def prepare(self, kafka_bootstrap: str) -> Prepare:  # noqa: F811 - the fixture
        async def prepare(topic: str, name: str) -> None:
            await asyncio.to_thread(create_topic, kafka_bootstrap, topic, 3)

        return prepare

    @pytest.fixture
    def publish(self, kafka_bootstrap: str) -> Publish:  # noqa: F811 - the fixture
        async def publish(topic: str, messages: Sequence[Message]) -> None:
            async with KafkaPublisher.from_url(f"kafka://{kafka_bootstrap}") as publisher:
                assert list(await publisher.publish(messages)) == [None] * len(messages)

        return publish

    @pytest.fixture
    def publish_foreign(self, kafka_bootstrap: str) -> Publish:  # noqa: F811 - the fixture
        """Records from confluent-kafka's own producer, headers as bytes: given a ``str``, it
        cuts a header at its first NUL (a C string), which a client in another language
        does not."""

        def produce(topic: str, messages: Sequence[Message]) -> None:
            producer = Producer({"bootstrap.servers": kafka_bootstrap})
            encode = header_encoder("foreign")
            for m in messages:
                headers = [(name, str(value).encode()) for name, value in encode(m)]
                key = None if m.key is None else m.key.encode()
                producer.produce(topic, m.payload, key=key, headers=headers)
            assert producer.flush(10) == 0

        async def publish(topic: str, messages: Sequence[Message]) -> None:
            await asyncio.to_thread(produce, topic, messages)

        return publish


def test_consumer_options_are_taken_out_of_the_url() -> None:
    settings = KafkaConsumerSettings.from_url(
        "kafka://b1:9092,b2?session_timeout_ms=10000&heartbeat_interval_ms=1000"
        "&auto_offset_reset=latest&client_id=svc",
        name="group-1",
        topics=["orders"],
    )
    config = settings.consumer_config()
    assert config["group.id"] == "group-1"
    assert config["bootstrap.servers"] == "b1:9092,b2:9092"
    assert config["enable.auto.commit"] is False
    assert (config["session.timeout.ms"], config["heartbeat.interval.ms"]) == (10000, 1000)
    assert (config["auto.offset.reset"], config["client.id"]) == ("latest", "svc")


def test_fetch_wait_defaults_to_100_ms_and_a_bad_value_is_refused_in_one_line() -> None:
    def config(query: str) -> dict[str, object]:
        url = f"kafka://b1{query}"
        return KafkaConsumerSettings.from_url(url, name="g", topics=["t"]).consumer_config()

    assert config("")["fetch.wait.max.ms"] == 100
    assert config("?fetch_wait_max_ms=10")["fetch.wait.max.ms"] == 10
    for bad in ("0", "ten", "60001"):
        with pytest.raises(ConfigurationError, match="fetch_wait_max_ms") as refused:
            config(f"?fetch_wait_max_ms={bad}")
        assert "\n" not in str(refused.value)


async def test_an_unreachable_broker_is_one_warning_not_one_per_reconnect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While no broker answers, librdkafka reports every failed reconnect (about 20 a second
    here): the consumer warns once when the outage begins and once when it ends, the rest at
    DEBUG (a probe: it logged each one as a WARNING, ~1,200 lines a minute)."""
    caplog.set_level(logging.DEBUG, logger="outboxer.consumer.kafka")
    port = free_port()
    url = f"kafka://127.0.0.1:{port}?session_timeout_ms=3000&heartbeat_interval_ms=300"
    topic = unique_name("topic")
    settings = KafkaConsumerSettings.from_url(url, name=unique_name("g"), topics=[topic])

    def lines(level: int) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "outboxer.consumer.kafka" and r.levelno == level
        ]

    async def deliver(messages: Sequence[Message]) -> None:
        return None

    async def until(check: Callable[[], bool], what: str) -> None:
        deadline = asyncio.get_running_loop().time() + 30
        while not check():
            assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    stop = asyncio.Event()
    broker = TansuBroker(port)
    try:
        async with KafkaConsumer(settings) as consumer:
            running = asyncio.create_task(consumer.run(deliver, stop))
            try:
                await until(
                    lambda: len(lines(logging.DEBUG) + lines(logging.WARNING)) >= 20,
                    "20 failed reconnects",
                )
                await asyncio.to_thread(broker.start)
                await asyncio.to_thread(create_topic, broker.bootstrap, topic, 1)
                await until(
                    lambda: any("reachable again" in line for line in lines(logging.WARNING)),
                    "the consumer to reach the broker",
                )
            finally:
                stop.set()
                await asyncio.wait_for(running, 15)
    finally:
        await asyncio.to_thread(broker.stop)  # after the consumer left the group
    warnings = [
        line
        for line in lines(logging.WARNING) + lines(logging.ERROR)
        if "does not exist (yet)" not in line  # before the test created it: said once
    ]
    assert len(warnings) == 2, warnings
    assert "no Kafka broker reachable" in warnings[0], warnings
    assert "reachable again" in warnings[1], warnings
    assert f"127.0.0.1:{port}" in warnings[0]


@pytest.mark.parametrize("pattern", ["^[", "^x(?=y)"])
async def test_a_pattern_librdkafka_cannot_compile_is_a_configuration_error(pattern: str) -> None:
    """A probe: `consume --topic '^['` ended as "unexpected KafkaException: Failed to set
    subscription: Local: Invalid argument or configuration" (exit 1), naming no topic."""
    settings = KafkaConsumerSettings.from_url("kafka://127.0.0.1:1", name="g", topics=[pattern])
    with pytest.raises(ConfigurationError, match="cannot subscribe") as refused:
        async with KafkaConsumer(settings):
            pass
    assert repr(pattern) in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("topic", ["..", "orders/eu", "bestellungen-ü", "x" * 250])
def test_a_topic_name_kafka_cannot_have_is_refused_at_start(topic: str) -> None:
    """A probe: `consume --topic ..` ran for good, saying the topic "does not exist (yet)"."""
    with pytest.raises(ConfigurationError, match="not a valid Kafka topic name") as refused:
        KafkaConsumerSettings.from_url("kafka://127.0.0.1:1", name="g", topics=["ok", topic])
    assert "\n" not in str(refused.value)
