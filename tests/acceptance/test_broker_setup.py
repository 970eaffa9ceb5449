"""``outboxer broker setup`` against the real RabbitMQ on 127.0.0.1:5672 (guest/guest) and Kafka
(Tansu).

Each test declares its own exchange and queue (unique names, deleted afterwards). What the
command declared is checked through a separate pika connection: passive declarations, and a
message published as the relay publishes (mandatory, confirmed) reaching the queue before
any consumer ran.
"""

from __future__ import annotations

from collections.abc import Iterator

import pika
import pika.exceptions
import pytest
from confluent_kafka.admin import AdminClient

from outboxer.brokers.rabbitmq.settings import RabbitMQConsumerSettings
from outboxer.brokers.rabbitmq.topology import exchange_declaration, queue_declaration
from tests.acceptance.conftest import Cli, assert_one_line_error
from tests.conftest import require_service, unique_name
from tests.tansu import kafka_bootstrap  # noqa: F401 - a fixture

BASE = "amqp://guest:guest@127.0.0.1:5672/"


class Names:
    def __init__(self) -> None:
        self.exchange = unique_name("ex")
        self.queue = unique_name("q")
        self.url = f"{BASE}?exchange={self.exchange}"


@pytest.fixture
def names() -> Iterator[Names]:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    made = Names()
    yield made
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    channel = connection.channel()
    channel.queue_delete(made.queue)
    channel.exchange_delete(made.exchange)
    connection.close()


def exists(kind: str, name: str, **arguments: object) -> bool:
    """Whether the exchange or queue exists (a passive declaration: changes nothing)."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    try:
        declare = getattr(connection.channel(), f"{kind}_declare")
        declare(name, passive=True, **arguments)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code != 404:  # NOT_FOUND; anything else is a failure of the test itself
            raise
        return False
    finally:
        if connection.is_open:
            connection.close()
    return True


def test_setup_declares_what_the_relay_and_consumer_use_before_the_first_publish(
    cli: Cli, names: Names
) -> None:
    args = ["broker", "setup", "--broker", names.url, "--queue", names.queue]
    result = cli(*args, "--bind", "orders.*", "--bind", "audit.#")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"declared exchange '{names.exchange}': type topic, durable",
        f"declared queue '{names.queue}': classic, durable",
        f"declared binding 'orders.*' of queue '{names.queue}' on exchange '{names.exchange}'",
        f"declared binding 'audit.#' of queue '{names.queue}' on exchange '{names.exchange}'",
    ]
    assert exists("exchange", names.exchange)
    assert exists("queue", names.queue)
    # Idempotent: a second run declares the same things and changes nothing.
    again = cli(*args, "--bind", "orders.*", "--bind", "audit.#")
    assert (again.returncode, again.stdout) == (0, result.stdout), again.stderr

    # No consumer has run yet. A message published as the relay publishes (mandatory, with
    # confirms) is routed to the queue, not returned; redeclaring with the arguments the
    # publisher and consumer use (the same functions) is accepted: nothing differs.
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        settings = RabbitMQConsumerSettings.from_url(
            f"{names.url}&queue={names.queue}", name="inventory", topics=["orders.*"]
        )
        channel.exchange_declare(**exchange_declaration(settings.connection))
        channel.queue_declare(**queue_declaration(settings))
        channel.basic_publish(names.exchange, "orders.eu", b"{}", mandatory=True)
        method, _, body = channel.basic_get(names.queue, auto_ack=True)
        assert (method.routing_key, body) == ("orders.eu", b"{}")
    finally:
        connection.close()


def test_setup_of_the_exchange_alone_and_the_queue_named_in_the_url(cli: Cli, names: Names) -> None:
    result = cli("broker", "setup", "--broker", names.url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"declared exchange '{names.exchange}': type topic, durable"
    ]
    assert not exists("queue", names.queue)
    # The URL 'outboxer consume' is given (queue, queue_type) serves setup as well.
    url = f"{names.url}&queue={names.queue}&queue_type=quorum"
    result = cli("broker", "setup", "--broker", url, "--bind", "#")
    assert result.returncode == 0, result.stderr
    assert f"declared queue '{names.queue}': quorum, durable" in result.stdout
    assert exists("queue", names.queue, durable=True)


def test_a_mismatch_is_one_line_and_changes_nothing(cli: Cli, names: Names) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    channel = connection.channel()
    channel.exchange_declare(names.exchange, exchange_type="fanout", durable=True)
    channel.queue_declare(names.queue, durable=True, arguments={"x-queue-type": "quorum"})
    connection.close()

    result = cli("broker", "setup", "--broker", names.url)
    assert_one_line_error(
        result, 2, f"exchange '{names.exchange}' exists with other arguments", "PRECONDITION_FAILED"
    )
    assert "received 'topic' but current is 'fanout'" in result.stderr
    assert "guest:guest" not in result.stderr  # the password is never printed

    # The queue exists as a quorum queue; a classic one is asked for.
    other = unique_name("ex")
    url = f"{BASE}?exchange={other}"
    try:
        result = cli("broker", "setup", "--broker", url, "--queue", names.queue, "--bind", "#")
        assert_one_line_error(
            result, 2, f"queue '{names.queue}' exists with other arguments", "x-queue-type"
        )
    finally:
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
        connection.channel().exchange_delete(other)
        connection.close()
    assert exists("queue", names.queue, durable=True, arguments={"x-queue-type": "quorum"})


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["--broker", "redis://127.0.0.1:6379/0"], 2, ["nothing to set up for redis://"]),
        (["--broker", BASE, "--bind", "#"], 2, ["--bind needs --queue"]),
        (["--broker", BASE, "--queue", "q"], 2, ["routing keys with --bind"]),
        (["--broker", BASE, "--queue", "amq.q", "--bind", "#"], 2, ["queue name", "amq."]),
        (["--broker", BASE, "--queue", "q" * 256, "--bind", "#"], 2, ["queue name", "255"]),
        (["--broker", BASE, "--queue", "", "--bind", "#"], 2, ["queue name ''"]),
        (["--broker", BASE, "--queue", "q", "--bind", "k" * 256], 2, ["binding key", "255"]),
        (["--broker", f"{BASE}?exchange=bad%2Fname"], 2, ["exchange"]),
        (["--broker", f"{BASE}?queue_type=stream", "--queue", "q", "--bind", "#"], 2, ["stream"]),
        (["--broker", "amqp://guest:secret@127.0.0.1:1/"], 1, ["127.0.0.1:1", "refused"]),
        (["--broker", "amqp://guest:wrong-secret@127.0.0.1:5672/"], 1, ["login refused"]),
        ([], 2, ["--broker"]),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit(
    cli: Cli, args: list[str], code: int, words: list[str]
) -> None:
    result = cli("broker", "setup", *args)
    assert_one_line_error(result, code, *words)
    assert "secret" not in result.stderr


def test_kafka_topics_are_created_once_and_a_partition_mismatch_is_refused(
    cli: Cli,
    kafka_bootstrap: str,  # noqa: F811 - the fixture imported above
) -> None:
    first, second = (unique_name("orders").replace("_", "-") for _ in range(2))
    url = f"kafka://{kafka_bootstrap}"
    args = ["broker", "setup", "--broker", url, "--topic", first, "--topic", second]
    result = cli(*args, "--topic", first, "--partitions", "2")  # named twice: one topic
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == sorted(
        f"declared topic '{name}': 2 partitions" for name in (first, second)
    )
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for name in (first, second):
        assert len(admin.list_topics(name, timeout=10).topics[name].partitions) == 2
    # Idempotent: the topics are there with the asked partitions.
    again = cli(*args, "--partitions", "2")
    assert again.returncode == 0, again.stderr
    assert f"declared topic '{first}': 2 partitions (existed)" in again.stdout
    # Partitions are never changed behind the operator's back (keys would move).
    other = cli("broker", "setup", "--broker", url, "--topic", first, "--partitions", "4")
    assert_one_line_error(other, 2, f"topic '{first}' exists with 2 partitions, not 4")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--broker", "kafka://127.0.0.1:9092"], ["--topic"]),
        (["--broker", "kafka://127.0.0.1:9092", "--topic", "t", "--bind", "#"], ["--topic"]),
        (["--broker", BASE, "--topic", "t"], ["--topic is for Kafka"]),
        (["--broker", "nats://127.0.0.1:4222"], ["nothing to set up for nats://"]),
        (["--broker", "kafka://127.0.0.1:9092", "--topic", "t", "--partitions", "0"], ["0"]),
        # A probe: Tansu created 'a b', which the relay then dead-letters; Kafka refuses it.
        (
            ["--broker", "kafka://127.0.0.1:9092", "--topic", "ok", "--topic", "a b"],
            ["'a b' is not a valid Kafka topic name"],
        ),
    ],
)
def test_options_of_the_other_broker_are_refused(
    cli: Cli, args: list[str], words: list[str]
) -> None:
    assert_one_line_error(cli("broker", "setup", *args), 2, *words)
