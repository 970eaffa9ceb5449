"""``PublisherContract``: what every publisher must do, run against each real broker.

Subclass it in a test module and provide the fixtures:

- ``publisher``: an entered publisher for the broker under test;
- ``read_back``: ``async (topic, count) -> list[Received]``, reading what the broker got for the
  topic (consumer, stream read, subscription...), in broker order;
- ``unreachable_publisher``: an entered-or-enterable publisher pointed at a closed port;
- ``permanent_failure``: ``(topic) -> Message`` building a message the broker refuses for good
  (unknown destination, rejected request), or ``None`` where the broker cannot refuse one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from outboxer._ids import new_message_id
from outboxer.errors import BrokerUnavailable, PermanentPublishError, PublishError
from outboxer.message import JSON, Message


@dataclass(frozen=True)
class Received:
    """A message as a consumer sees it on the broker."""

    id: str
    key: str | None
    type: str | None
    payload: bytes
    headers: dict[str, str] = field(default_factory=dict)


ReadBack = Callable[[str, int], Awaitable[Sequence[Received]]]


def make_message(topic: str, n: int, *, key: str | None = None, **extra: Any) -> Message:
    return Message(
        id=new_message_id(),
        topic=topic,
        payload=f'{{"n":{n}}}'.encode(),
        key=key,
        type=extra.pop("type", "Numbered"),
        content_type=JSON,
        **extra,
    )


class PublisherContract:
    async def test_acknowledges_and_exposes_the_id(
        self, publisher: Any, read_back: ReadBack, topic: str
    ) -> None:
        messages = [make_message(topic, n, key=f"k{n % 3}") for n in range(20)]
        results = await publisher.publish(messages)
        assert list(results) == [None] * 20
        received = await read_back(topic, 20)
        assert sorted(r.id for r in received) == sorted(m.id for m in messages)
        by_id = {m.id: m for m in messages}
        for r in received:
            assert r.payload == by_id[r.id].payload
            assert r.type == "Numbered"
            assert r.key == by_id[r.id].key

    async def test_keeps_order_within_a_key(
        self, publisher: Any, read_back: ReadBack, topic: str
    ) -> None:
        messages = [make_message(topic, n, key=f"k{n % 4}") for n in range(60)]
        assert list(await publisher.publish(messages)) == [None] * 60
        received = await read_back(topic, 60)
        for key in {m.key for m in messages}:
            expected = [m.id for m in messages if m.key == key]
            assert [r.id for r in received if r.key == key] == expected

    async def test_headers_round_trip(
        self, publisher: Any, read_back: ReadBack, topic: str
    ) -> None:
        message = make_message(topic, 1, key="h", headers={"tenant": "acme", "x-trace": "abc"})
        assert list(await publisher.publish([message])) == [None]
        [received] = await read_back(topic, 1)
        assert received.headers.get("tenant") == "acme"
        assert received.headers.get("x-trace") == "abc"

    async def test_broker_down_is_reported_as_unavailable(
        self, unreachable_publisher: Any, topic: str
    ) -> None:
        message = make_message(topic, 1)
        outcome: Sequence[PublishError | None] | BaseException
        try:
            async with contextlib.AsyncExitStack() as stack:
                pub = await stack.enter_async_context(unreachable_publisher)
                outcome = await pub.publish([message])
        except BrokerUnavailable as exc:
            outcome = exc
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, BrokerUnavailable)
        else:
            assert isinstance(outcome[0], BrokerUnavailable)

    async def test_permanent_failure_is_classified(
        self, publisher: Any, permanent_failure: Callable[[str], Message] | None, topic: str
    ) -> None:
        if permanent_failure is None:
            assert publisher is not None  # this broker accepts every well-formed message
            return
        good, bad = make_message(topic, 1), permanent_failure(topic)
        results = await publisher.publish([bad, good])
        assert isinstance(results[0], PermanentPublishError)
        assert results[1] is None  # one refused message does not fail the others
