"""The publisher contract, run against the in-memory fake and the in-process publisher."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from outboxer.brokers.inprocess.publisher import InProcessPublisher
from outboxer.errors import BrokerUnavailable, PermanentPublishError
from outboxer.inbox.registry import HandlerRegistry
from outboxer.message import Message
from outboxer.testing import RecordingPublisher
from tests.contracts.publisher import PublisherContract, Received, make_message


def _received(m: Message) -> Received:
    return Received(id=m.id, key=m.key, type=m.type, payload=m.payload, headers=dict(m.headers))


class TestRecordingPublisher(PublisherContract):
    @pytest.fixture
    def publisher(self) -> RecordingPublisher:
        return RecordingPublisher(
            fail=lambda m: PermanentPublishError("refused") if m.type == "Refused" else None
        )

    @pytest.fixture
    def read_back(self, publisher: RecordingPublisher) -> Any:
        async def read(topic: str, count: int) -> Sequence[Received]:
            return [_received(m) for m in publisher.messages if m.topic == topic][:count]

        return read

    @pytest.fixture
    def unreachable_publisher(self) -> RecordingPublisher:
        return RecordingPublisher(fail=lambda m: BrokerUnavailable("connection refused"))

    @pytest.fixture
    def permanent_failure(self) -> Any:
        return lambda topic: make_message(topic, 0, type="Refused")


class TestInProcessPublisher(PublisherContract):
    @pytest.fixture
    def seen(self) -> list[Message]:
        return []

    @pytest.fixture
    def publisher(self, seen: list[Message]) -> InProcessPublisher:
        registry = HandlerRegistry()
        registry.register(seen.append, "Numbered")
        return InProcessPublisher(registry)

    @pytest.fixture
    def read_back(self, seen: list[Message]) -> Any:
        async def read(topic: str, count: int) -> Sequence[Received]:
            return [_received(m) for m in seen if m.topic == topic][:count]

        return read

    @pytest.fixture
    def unreachable_publisher(self) -> InProcessPublisher:
        registry = HandlerRegistry()

        def down(message: Message) -> None:
            raise BrokerUnavailable("the mail server is down")

        registry.register(down, "Numbered")
        return InProcessPublisher(registry)

    @pytest.fixture
    def permanent_failure(self) -> Any:
        # No handler is registered for this type: a wiring mistake, refused for good.
        return lambda topic: make_message(topic, 0, type="Unhandled")


async def test_inprocess_runs_async_handlers_and_counts_failures() -> None:
    registry = HandlerRegistry()
    calls: list[str] = []

    @registry.handler("A")
    async def handle_a(message: Message) -> None:
        calls.append(message.id)

    @registry.handler("B")
    def handle_b(message: Message) -> None:
        raise ValueError("smtp said no")

    publisher = InProcessPublisher(registry)
    a, b = make_message("t", 1, type="A"), make_message("t", 2, type="B")
    results = await publisher.publish([a, b])
    assert results[0] is None
    assert calls == [a.id]
    assert results[1] is not None
    assert "ValueError: smtp said no" in str(results[1])
    assert not isinstance(results[1], PermanentPublishError)
