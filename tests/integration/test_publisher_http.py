"""The HTTP webhook publisher against a real HTTP/1.1 server on 127.0.0.1.

The receiver (``tests/http_receiver.py``) is a real asyncio server on a real socket: it records
what arrived on the wire and answers the statuses a test asks for; no part of httpx is mocked.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from outboxer._ids import new_message_id
from outboxer.brokers import publisher_from_url
from outboxer.brokers.http.publisher import HttpPublisher
from outboxer.errors import (
    BrokerUnavailable,
    ConfigurationError,
    PermanentPublishError,
    PublishError,
    RetryablePublishError,
)
from outboxer.message import TEXT, Message
from tests.contracts.publisher import PublisherContract, Received, make_message
from tests.http_receiver import HttpReceiver, ReceivedRequest, Reply

DOC = Path(__file__).resolve().parents[2] / "docs" / "brokers" / "http.md"

#: Headers the HTTP layer adds by itself; everything else not ``ce-*`` is a user header.
_TRANSPORT = {
    "host",
    "accept",
    "accept-encoding",
    "connection",
    "user-agent",
    "content-length",
    "content-type",
    "webhook-signature",
}


def free_port() -> int:
    """A local port nothing listens on (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def as_received(request: ReceivedRequest) -> Received:
    """What a CloudEvents consumer makes of a request (``ce-*`` values percent-decoded)."""
    user = {
        name: value
        for name, value in request.header_map.items()
        if not name.startswith("ce-") and name not in _TRANSPORT
    }
    return Received(
        id=request.ce("id") or "",
        key=request.ce("partitionkey"),
        type=request.ce("type"),
        payload=request.body,
        headers=user,
    )


def refuse_type_refused(request: ReceivedRequest) -> Reply:
    if request.ce("type") == "Refused":
        return Reply(422, b'{"error": "this event type is not accepted"}')
    return Reply()


@pytest.fixture
async def receiver() -> AsyncIterator[HttpReceiver]:
    async with HttpReceiver(refuse_type_refused) as rx:
        yield rx


@pytest.fixture
async def publisher(receiver: HttpReceiver) -> AsyncIterator[HttpPublisher]:
    async with HttpPublisher(receiver.url + "/events", secret="s3cret") as pub:
        yield pub


def messages_for(
    topic: str, count: int, *, key: Callable[[int], str | None] = lambda n: None
) -> list[Message]:
    return [make_message(topic, n, key=key(n)) for n in range(count)]


def verify_snippet() -> Callable[[bytes, Any, bytes], bool]:
    """The signature check exactly as docs/brokers/http.md gives it to receivers."""
    text = DOC.read_text()
    match = re.search(r"<!-- verify-snippet.*?-->\s*```python\n(.*?)```", text, re.S)
    assert match, "docs/brokers/http.md lost its marked verification snippet"
    namespace: dict[str, Any] = {}
    exec(match.group(1), namespace)
    verify: Callable[[bytes, Any, bytes], bool] = namespace["verify"]
    return verify


class TestHttpPublisherContract(PublisherContract):
    @pytest.fixture
    def read_back(self, receiver: HttpReceiver) -> Any:
        async def read(topic: str, count: int) -> Sequence[Received]:
            def matching() -> list[ReceivedRequest]:
                return [r for r in receiver.requests if r.ce("topic") == topic]

            async with asyncio.timeout(5):
                while len(matching()) < count:
                    await receiver.wait_for(len(receiver.requests) + 1)
            return [as_received(r) for r in matching()]

        return read

    @pytest.fixture
    def unreachable_publisher(self) -> HttpPublisher:
        return HttpPublisher(f"http://127.0.0.1:{free_port()}/events")

    @pytest.fixture
    def permanent_failure(self) -> Callable[[str], Message]:
        return lambda topic: make_message(topic, 0, type="Refused")


# -- wire format ---------------------------------------------------------------------------------


async def test_wire_format_of_a_keyed_signed_message(receiver: HttpReceiver, topic: str) -> None:
    url = (
        receiver.url + "/hooks/{topic}?tenant=acme&outboxer_concurrency=8"
        "&outboxer_timeout=3&outboxer_source=orders-service"
    )
    created = dt.datetime(2024, 7, 1, 14, 0, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    message = Message(
        id=new_message_id(),
        topic=topic,
        payload=b'{"order_id":42,"total":990}',
        key="order 42/\u00fc",
        type="OrderCreated",
        headers={"Tenant": "acme", "traceparent": "00-0af7651916cd43dd-b7ad6b7169203331-01"},
        content_type="application/json",
        created_at=created,
    )
    async with HttpPublisher(url, secret=b"k") as pub:
        assert pub.settings.concurrency == 8
        assert pub.settings.timeout == 3.0
        assert list(await pub.publish([message])) == [None]

    [request] = receiver.requests
    assert request.method == "POST"
    # {topic} is filled in, the receiver's own parameter kept, outboxer's options stripped.
    assert request.target == f"/hooks/{quote(topic, safe='')}?tenant=acme"
    assert request.body == message.payload
    headers = request.header_map
    assert headers["content-type"] == "application/json"
    assert headers["content-length"] == str(len(message.payload))
    assert headers["ce-specversion"] == "1.0"
    assert headers["ce-id"] == message.id
    assert headers["ce-type"] == "OrderCreated"
    assert headers["ce-source"] == "orders-service"
    assert headers["ce-time"] == "2024-07-01T12:00:00.123456Z"  # converted to UTC
    assert headers["ce-topic"] == topic
    # CloudEvents binding: space and non-ASCII percent-encoded; '/' is printable and kept.
    assert headers["ce-partitionkey"] == "order%2042/%C3%BC"
    assert request.ce("partitionkey") == "order 42/\u00fc"
    assert headers["user-agent"] == "outboxer"
    assert re.fullmatch(r"sha256=[0-9a-f]{64}", headers["webhook-signature"])
    # User headers travel under their own names (HTTP names are case-insensitive).
    assert request.header("tenant") == "acme"
    assert headers["traceparent"] == message.headers["traceparent"]
    ce_headers = {n for n in headers if n.startswith("ce-")}
    assert ce_headers == {
        "ce-specversion",
        "ce-id",
        "ce-type",
        "ce-source",
        "ce-time",
        "ce-topic",
        "ce-partitionkey",
    }


async def test_wire_format_of_an_unkeyed_untyped_unsigned_message(
    receiver: HttpReceiver, topic: str
) -> None:
    message = Message(
        id=new_message_id(),
        topic=topic,
        payload=b"hello",
        content_type=TEXT,
        created_at=dt.datetime(2024, 1, 2, 3, 4, 5),  # naive: taken as UTC
    )
    async with HttpPublisher(receiver.url) as pub:
        assert list(await pub.publish([message])) == [None]
    [request] = receiver.requests
    headers = request.header_map
    assert request.target == "/"
    assert headers["content-type"] == TEXT
    assert headers["ce-type"] == topic  # CloudEvents requires a type: the topic stands in
    assert headers["ce-source"] == "outboxer"
    assert headers["ce-time"] == "2024-01-02T03:04:05.000000Z"
    assert "ce-partitionkey" not in headers
    assert "webhook-signature" not in headers
    assert request.body == b"hello"


async def test_signature_verifies_with_the_documented_snippet(
    receiver: HttpReceiver, topic: str
) -> None:
    verify = verify_snippet()
    messages = [
        make_message(topic, 1, key="k"),
        Message(id="id with space", topic=topic, payload=b"\x00\xffbinary"),
    ]
    async with HttpPublisher(receiver.url, secret="s3cret \u00e9") as pub:
        assert list(await pub.publish(messages)) == [None, None]
    assert len(receiver.requests) == 2
    secret = "s3cret \u00e9".encode()
    for request in receiver.requests:
        headers = request.header_map
        assert verify(secret, headers, request.body)
        assert not verify(b"wrong secret", headers, request.body)
        assert not verify(secret, headers, request.body + b" ")
        assert not verify(secret, {**headers, "ce-id": "another"}, request.body)
        assert not verify(secret, {k: v for k, v in headers.items() if "sig" not in k}, b"")


# -- responses -----------------------------------------------------------------------------------

STATUS_TABLE: list[tuple[int, type[PublishError] | None]] = [
    (200, None),
    (201, None),
    (202, None),
    (204, None),
    (301, PermanentPublishError),
    (400, PermanentPublishError),
    (401, PermanentPublishError),
    (404, PermanentPublishError),
    (422, PermanentPublishError),
    (408, RetryablePublishError),
    (429, RetryablePublishError),
    (500, RetryablePublishError),
    (502, RetryablePublishError),
    (503, RetryablePublishError),
]


@pytest.mark.parametrize(("status", "expected"), STATUS_TABLE)
async def test_status_classification(
    status: int, expected: type[PublishError] | None, topic: str
) -> None:
    body = b"" if status == 204 else b'{"detail":  "field\n  total is wrong"}' + b"x" * 500
    reply = Reply(status, body, headers=(("retry-after", "7"),) if status == 429 else ())
    async with (
        HttpReceiver(lambda request: reply) as rx,
        HttpPublisher(rx.url + "/in?token=hidden-token") as pub,
    ):
        [result] = await pub.publish([make_message(topic, 1)])
    assert len(rx.requests) == 1
    if expected is None:
        assert result is None
        return
    assert type(result) is expected
    reason = str(result)
    assert reason.startswith(f"HTTP {status} ")
    assert f"from http://127.0.0.1:{rx.port}/in?..." in reason
    assert '{"detail": "field total is wrong"}xxx' in reason  # excerpt, whitespace collapsed
    assert len(reason) < 400  # the excerpt is short
    assert "hidden-token" not in reason
    if status == 429:
        assert "Retry-After: 7" in reason


async def test_a_dot_topic_is_a_name_in_the_path_not_a_dot_segment(
    receiver: HttpReceiver,
) -> None:
    """Found by a probe: the topics '.' and '..' went into {topic} as they were, and the URL
    resolved them: the message of topic '..' was posted to /in, another endpoint."""
    messages = [make_message(topic, n) for n, topic in enumerate([".", "..", "a.b"])]
    async with HttpPublisher(receiver.url + "/hooks/{topic}/in") as pub:
        assert list(await pub.publish(messages)) == [None, None, None]
    assert sorted(r.target for r in receiver.requests) == [
        "/hooks/%2E%2E/in",
        "/hooks/%2E/in",
        "/hooks/a.b/in",
    ]


async def test_read_timeout_is_retryable(topic: str) -> None:
    async with (
        HttpReceiver(lambda request: Reply(delay=5)) as rx,
        HttpPublisher(rx.url, timeout=0.2) as pub,
    ):
        [result] = await pub.publish([make_message(topic, 1)])
    assert isinstance(result, RetryablePublishError)
    assert "no response" in str(result)


def _answer(head: bytes, body: Callable[[], Any] | None = None) -> Reply:
    """A raw answer: ``head`` (status line and headers), then what ``body`` writes."""

    async def write(writer: asyncio.StreamWriter) -> None:
        writer.write(head)
        await writer.drain()
        if body is not None:
            await body(writer)

    return Reply(raw=write)


async def _trickle(writer: asyncio.StreamWriter) -> None:
    for _ in range(600):  # a chunk a tenth of a second, for a minute
        writer.write(b"1\r\nx\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)


async def _endless(writer: asyncio.StreamWriter) -> None:
    chunk = b"x" * (1 << 20)
    for _ in range(2000):  # 2 GB, as long as the client reads
        writer.write(chunk)
        await writer.drain()


@pytest.mark.parametrize(
    "reply",
    [
        _answer(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", _trickle),
        _answer(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n", _trickle),  # headers
    ],
    ids=["body", "headers"],
)
async def test_a_trickled_answer_times_out_as_a_whole(reply: Reply, topic: str) -> None:
    """Found by a probe: a receiver answering a byte at a time kept each read under the
    timeout, and the relay waited forever (no attempt counted, a window slot held). The
    timeout is the whole exchange's."""
    async with (
        HttpReceiver(lambda request: reply) as rx,
        HttpPublisher(rx.url, timeout=0.3, connect_timeout=0.2) as pub,
    ):
        [result] = await asyncio.wait_for(pub.publish([make_message(topic, 1)]), 10)
    assert isinstance(result, RetryablePublishError)
    assert "no response" in str(result)


@pytest.mark.parametrize(
    "reply",
    [
        _answer(b"HTTP/1.1 200 OK\r\ncontent-length: 2000000000\r\n\r\n", _endless),
        _answer(b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 9\r\n\r\nnot gzip!"),
        _answer(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort"),  # then closed
    ],
    ids=["2-GB-body", "bad-gzip", "cut-short"],
)
async def test_a_2xx_is_an_acknowledgement_whatever_its_body(reply: Reply, topic: str) -> None:
    """Found by a probe: a 2 GB body was read whole into memory (4 GB of RSS, 16 s), and a 2xx
    whose body did not decode or was cut short was a failure: the delivered message was sent
    again and dead-lettered. The status decides, and at most 64 KiB of a body is read."""
    async with (
        HttpReceiver(lambda request: reply) as rx,
        HttpPublisher(rx.url, timeout=5) as pub,
    ):
        results = await asyncio.wait_for(pub.publish([make_message(topic, 1)]), 10)
    assert list(results) == [None]
    assert len(rx.requests) == 1


async def test_retry_after_is_passed_on_to_the_relay(topic: str) -> None:
    """The relay waits at least what a 429/503's ``Retry-After`` asks (seconds or a date)."""
    date = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=120)).strftime(
        "%a, %d %b %Y %H:%M:%S GMT"
    )
    for value, low, high in (("7", 7, 7), (date, 100, 121), ("soon", None, None)):
        reply = Reply(503, b"busy", headers=(("retry-after", value),))
        async with (
            HttpReceiver(lambda request, reply=reply: reply) as rx,
            HttpPublisher(rx.url) as pub,
        ):
            [result] = await pub.publish([make_message(topic, 1)])
        assert isinstance(result, RetryablePublishError)
        if low is None:
            assert result.retry_after is None
        else:
            assert result.retry_after is not None and low <= result.retry_after <= high


async def test_dropped_connection_is_retried_once_on_a_fresh_connection(topic: str) -> None:
    dropped: set[str] = set()

    def drop_first_delivery(request: ReceivedRequest) -> Reply:
        ce_id = request.ce("id") or ""
        if ce_id not in dropped:
            dropped.add(ce_id)
            return Reply(drop=True)
        return Reply()

    message = make_message(topic, 1)
    async with HttpReceiver(drop_first_delivery) as rx, HttpPublisher(rx.url) as pub:
        assert list(await pub.publish([message])) == [None]
    assert [r.ce("id") for r in rx.requests] == [message.id, message.id]  # a harmless duplicate
    assert rx.requests[0].connection != rx.requests[1].connection


async def test_connection_dropped_twice_is_retryable(topic: str) -> None:
    async with (
        HttpReceiver(lambda request: Reply(drop=True)) as rx,
        HttpPublisher(rx.url) as pub,
    ):
        [result] = await pub.publish([make_message(topic, 1)])
    assert isinstance(result, RetryablePublishError)
    assert "dropped" in str(result)
    assert len(rx.requests) == 2


# -- concurrency and ordering --------------------------------------------------------------------


async def test_concurrency_is_bounded_within_and_across_calls(topic: str) -> None:
    async with (
        HttpReceiver(lambda request: Reply(delay=0.02)) as rx,
        HttpPublisher(rx.url + "?outboxer_concurrency=4") as pub,
    ):
        assert list(await pub.publish(messages_for(topic, 40))) == [None] * 40
        assert rx.max_in_flight == 4  # the window is used, and never exceeded
        batches = await asyncio.gather(*(pub.publish(messages_for(topic, 20)) for _ in range(3)))
        assert [list(b) for b in batches] == [[None] * 20] * 3
    assert rx.max_in_flight == 4
    assert rx.connections_opened <= 4  # keep-alive pool of the same size, reused
    assert len(rx.requests) == 100


async def test_same_key_is_sent_sequentially_in_order_keys_concurrently(topic: str) -> None:
    messages = messages_for(topic, 40, key=lambda n: f"k{n % 4}")
    async with (
        HttpReceiver(lambda request: Reply(delay=0.005)) as rx,
        HttpPublisher(rx.url, concurrency=16) as pub,
    ):
        assert list(await pub.publish(messages)) == [None] * 40
    assert rx.max_in_flight_per_key == 1
    assert rx.max_in_flight == 4  # the four keys ran side by side
    for key in ("k0", "k1", "k2", "k3"):
        sent = [m.id for m in messages if m.key == key]
        assert [r.ce("id") for r in rx.requests if r.ce("partitionkey") == key] == sent


async def test_a_failed_message_holds_back_only_its_own_key(topic: str) -> None:
    a, bad, c = (make_message(topic, n, key="k1") for n in range(3))
    d, e = (make_message(topic, n, key="k2") for n in range(2))
    unkeyed = make_message(topic, 9)

    def fail_bad(request: ReceivedRequest) -> Reply:
        return Reply(503) if request.ce("id") == bad.id else Reply()

    async with HttpReceiver(fail_bad) as rx, HttpPublisher(rx.url) as pub:
        results = await pub.publish([a, d, bad, e, c, unkeyed])
    assert results[0] is None
    assert results[1] is None
    assert isinstance(results[2], RetryablePublishError)
    assert results[3] is None
    assert isinstance(results[4], RetryablePublishError)
    assert "not sent: an earlier message with key 'k1'" in str(results[4])
    assert results[5] is None
    assert c.id not in {r.ce("id") for r in rx.requests}


# -- outages and recovery ------------------------------------------------------------------------


async def test_connection_refused_is_broker_unavailable_without_leaking_secrets(
    topic: str,
) -> None:
    url = f"http://user:pa55word@127.0.0.1:{free_port()}/hook?token=tok3n"
    async with HttpPublisher(url, secret="s3cret", headers={"Authorization": "Bearer b34rer"}) as p:
        attempts = 0
        send = p._send

        async def counting_send(*args: Any) -> PublishError | None:
            nonlocal attempts
            attempts += 1
            return await send(*args)

        p._send = counting_send  # type: ignore[method-assign,assignment]
        results = await p.publish(messages_for(topic, 50, key=lambda n: f"k{n}"))
        text = repr(p) + repr(p.settings) + " ".join(str(r) for r in results)
    assert all(isinstance(r, BrokerUnavailable) for r in results)
    assert attempts == 1  # one probe, then the whole call is reported down
    assert "cannot connect to http://127.0.0.1:" in str(results[0])
    for secret in ("pa55word", "tok3n", "s3cret", "b34rer", "user"):
        assert secret not in text


async def test_recovers_after_the_receiver_comes_back(topic: str) -> None:
    rx = HttpReceiver()
    await rx.start()
    try:
        async with HttpPublisher(rx.url, concurrency=8) as pub:
            assert list(await pub.publish(messages_for(topic, 10))) == [None] * 10
            assert rx.connections_opened >= 1

            await rx.stop()  # the receiver crashes: pooled connections die, the port refuses
            down = await pub.publish(messages_for(topic, 10))
            assert all(isinstance(r, BrokerUnavailable) for r in down)
            again = await pub.publish(messages_for(topic, 3))  # still down: still reported
            assert all(isinstance(r, BrokerUnavailable) for r in again)

            await rx.start()  # back on the same port
            back = messages_for(topic, 10, key=lambda n: f"k{n % 2}")
            assert list(await pub.publish(back)) == [None] * 10
    finally:
        await rx.stop()
    assert {m.id for m in back} <= {r.ce("id") for r in rx.requests}


# -- headers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ({"ce-id": "forged"}, "reserved"),
        ({"CE-Type": "Forged"}, "reserved"),
        ({"Content-Type": "text/html"}, "reserved"),
        ({"webhook-signature": "sha256=00"}, "reserved"),
        ({"Connection": "close"}, "reserved"),
        ({"authorization": "Bearer mine"}, "reserved"),  # configured with headers=
        ({"bad header": "x"}, "not a valid HTTP token"),
        ({"x-split": "a\r\nx-injected: 1"}, "not printable ASCII"),
        ({"x-city": "Z\u00fcrich"}, "not printable ASCII"),
    ],
)
async def test_refused_user_headers_fail_permanently(
    headers: dict[str, str], problem: str, receiver: HttpReceiver, topic: str
) -> None:
    bad = make_message(topic, 1, headers=headers)
    good = make_message(topic, 2, headers={"x-trace": "abc"})
    async with HttpPublisher(receiver.url, headers={"Authorization": "Bearer ops"}) as pub:
        results = await pub.publish([bad, good])
    assert isinstance(results[0], PermanentPublishError)
    assert problem in str(results[0])
    assert results[1] is None
    [request] = receiver.requests
    assert request.ce("id") == good.id
    assert request.header("authorization") == "Bearer ops"
    assert request.header("x-trace") == "abc"


# -- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "kwargs", "needle"),
    [
        ("ftp://127.0.0.1/x", {}, "http:// or https://"),
        ("http:///path", {}, "a host is required"),
        ("http://127.0.0.1:99999/", {}, "port '99999'"),
        ("http://h/?outboxer_timeout=soon", {}, "outboxer_timeout='soon' is not a number"),
        ("http://h/?outboxer_concurrency=0", {}, "concurrency must be positive"),
        ("http://h/?outboxer_concurrency=2.5", {}, "concurrency='2.5' is not an integer"),
        ("http://h/?outboxer_colour=red", {}, "unknown option 'outboxer_colour'"),
        ("http://h/?outboxer_secret=t0ps3cret", {}, "not taken from the URL"),
        ("http://h/", {"concurrency": 0}, "concurrency must be positive"),
        ("http://h/", {"secret": ""}, "secret must not be empty"),
        ("http://h/", {"source": ""}, "source must not be empty"),
        ("http://h/", {"headers": {"ce-id": "x"}}, "set by outboxer"),
        ("http://h/", {"headers": {"x-a": "line\nbreak"}}, "printable ASCII"),
        ("https://h/", {"verify": "/nonexistent/ca.pem"}, "cannot load the TLS CA"),
    ],
)
def test_bad_configuration_is_one_readable_line(
    url: str, kwargs: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        HttpPublisher(url, **kwargs)
    message = str(info.value)
    assert needle in message
    assert "\n" not in message
    assert "t0ps3cret" not in message


def test_from_url_through_the_scheme_table() -> None:
    pub = publisher_from_url("https://u:pw@hooks.example.com:8443/in?outboxer_concurrency=3&a=1")
    assert isinstance(pub, HttpPublisher)
    assert pub.settings.concurrency == 3
    assert pub.settings.endpoint == "https://u:pw@hooks.example.com:8443/in?a=1"
    assert pub.settings.display_endpoint == "https://hooks.example.com:8443/in?..."
    assert "pw" not in repr(pub)
    assert "pw" not in repr(pub.settings)
    signed = HttpPublisher.from_url("http://h/", secret="abc")
    assert signed.settings.secret == b"abc"
    assert "abc" not in repr(signed.settings)
    # Keyword arguments win over URL options.
    assert HttpPublisher("http://h/?outboxer_timeout=3", timeout=7).settings.timeout == 7.0


async def test_publish_requires_an_open_publisher(topic: str) -> None:
    with pytest.raises(RuntimeError, match="async with"):
        await HttpPublisher("http://127.0.0.1:1/").publish([make_message(topic, 1)])
