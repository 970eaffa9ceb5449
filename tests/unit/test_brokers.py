"""The broker packages as the scheme registry loads them: one URL grammar, one loader shape."""

from __future__ import annotations

import asyncio
import importlib

import pytest

from outboxer.brokers import consumer_from_url, publisher_from_url
from outboxer.errors import ConfigurationError
from outboxer.urls import SCHEMES, parse

BROKER_SCHEMES = sorted(s for s, entry in SCHEMES.items() if entry.kind == "broker")
CONSUMABLE = {"kafka", "rabbitmq", "nats", "redis"}


@pytest.mark.parametrize("scheme", BROKER_SCHEMES)
def test_every_broker_scheme_loads_a_package_of_the_same_shape(scheme: str) -> None:
    entry = SCHEMES[scheme]
    package = importlib.import_module(entry.module)
    assert callable(package.publisher_from_url)
    assert hasattr(package, "consumer_from_url") == (entry.name in CONSUMABLE)
    settings = importlib.import_module(f"{entry.module}.settings")
    assert parse(settings.SPEC.example, settings.SPEC).scheme in settings.SPEC.schemes
    names = [option.name for option in settings.SPEC.options]
    assert len(names) == len(set(names)), "one declared option per name"


@pytest.mark.parametrize(
    "url",
    [
        "kafka://127.0.0.1:9092?session_timeout_ms=6000&linger_ms=2",
        "amqp://guest:guest@127.0.0.1:5672/%2F?prefetch=10&exchange=ex",
        "nats://127.0.0.1:4222?ack_wait=5&max_pending=10",
        "redis://127.0.0.1:6379/0?claim_idle=2&maxlen=100",
    ],
)
def test_one_url_serves_publisher_and_consumer(url: str) -> None:
    publisher = publisher_from_url(url)
    consumer = consumer_from_url(url, name="svc", topics=["orders"], batch_size=10)
    assert (
        type(publisher).__module__.rsplit(".", 1)[0] == type(consumer).__module__.rsplit(".", 1)[0]
    )


def test_refusals_are_one_line_without_the_password() -> None:
    cases = [
        (lambda: publisher_from_url("ftp://u:hunter2@h"), "unsupported broker URL ftp://"),
        (
            lambda: publisher_from_url("kafka://u:hunter2@h:9092", webhook_secret="s"),
            "webhook secret only applies to http(s)://",
        ),
        (
            lambda: consumer_from_url("https://u:hunter2@h/x", name="svc", topics=["t"]),
            "for consuming",
        ),
        (lambda: consumer_from_url("nats://h:4222", name="svc", topics=[]), "at least one topic"),
        (lambda: publisher_from_url("redis://u:hunter2@h:6379/0?maxlen=x"), "maxlen='x'"),
    ]
    for build, expected in cases:
        with pytest.raises(ConfigurationError) as caught:
            build()
        message = str(caught.value)
        assert expected in message
        assert "\n" not in message and "hunter2" not in message


@pytest.mark.parametrize("url", ["kafka://127.0.0.1:1", "redis://127.0.0.1:1"])
async def test_a_consumer_run_before_it_is_opened_says_so(url: str) -> None:
    consumer = consumer_from_url(url, name="orders", topics=["orders"])

    async def deliver(batch: object) -> None:
        raise AssertionError("nothing is delivered")

    with pytest.raises(RuntimeError, match=r"Consumer is not open \(use 'async with'\)"):
        await consumer.run(deliver, asyncio.Event())  # type: ignore[arg-type]
