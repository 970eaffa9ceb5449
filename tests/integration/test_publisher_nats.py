"""NatsPublisher against the real NATS JetStream server on 127.0.0.1:4222.

Every test creates its own stream (unique name) capturing exactly its own ``topic`` subject and
deletes it afterwards; messages are read back through an ordered JetStream consumer from the
start of the stream. Outages are produced for real through a local TCP proxy in this module that
is cut (listener closed, connections reset), restored, or made to swallow bytes (a stalled
connection that stays open).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy
from nats.js.errors import NotFoundError

from outboxer.brokers import publisher_from_url
from outboxer.brokers.nats import NatsPublisher, NatsSettings
from outboxer.brokers.nats.publisher import _classify_api_error
from outboxer.errors import (
    BrokerUnavailable,
    ConfigurationError,
    PermanentPublishError,
    PublishError,
    RetryablePublishError,
)
from outboxer.message import TEXT, Message
from tests.conftest import require_service, unique_name
from tests.contracts.publisher import PublisherContract, Received, make_message

HOST, PORT = "127.0.0.1", 4222
URL = f"nats://{HOST}:{PORT}"
OUR_HEADERS = {
    "Nats-Msg-Id",
    "ce-specversion",
    "ce-id",
    "ce-source",
    "ce-type",
    "ce-time",
    "ce-partitionkey",
    "content-type",
}


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


# -- a TCP proxy whose outages are real ------------------------------------------------------


class TcpProxy:
    """Forwards a local port to NATS.

    ``cut()`` closes the listener and resets every connection (the port then refuses),
    ``restore()`` listens again on the same port, ``swallow = True`` keeps connections open
    while dropping every byte (a stalled connection, as behind a dead router), and
    ``reject = True`` resets every new connection right after accepting it.
    """

    def __init__(self, upstream_port: int = PORT) -> None:
        self.upstream_port = upstream_port
        self.port = _closed_port()
        self.swallow = False
        self.reject = False  # accept, then reset at once: a server that is up but unusable
        self.accepted = 0
        self.forwarded = 0  # bytes from the client to NATS
        self.forwarded_over: tuple[int, asyncio.Event] | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[Any]] = set()

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    async def restore(self) -> None:
        self._server = await asyncio.start_server(self._serve, HOST, self.port)

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()  # a reset, not a polite close
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.accepted += 1
        if self.reject:
            writer.transport.abort()
            self._handlers.discard(task)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(HOST, self.upstream_port)
        except OSError:
            writer.transport.abort()
            self._handlers.discard(task)
            return
        self._writers |= {writer, up_writer}
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer, upstream=True)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()
            self._handlers.discard(task)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool = False
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(16384):
                if self.swallow:
                    continue
                writer.write(data)
                await writer.drain()
                if upstream:
                    self.forwarded += len(data)
                    if self.forwarded_over and self.forwarded > self.forwarded_over[0]:
                        self.forwarded_over[1].set()


@pytest.fixture
async def proxy(nats_up: None) -> AsyncIterator[TcpProxy]:
    proxy = TcpProxy()
    await proxy.restore()
    try:
        yield proxy
    finally:
        await proxy.cut()


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def nats_up() -> None:
    require_service("NATS", HOST, PORT)


@pytest.fixture
async def js(nats_up: None) -> AsyncIterator[JetStreamContext]:
    """A plain nats-py JetStream context for setting up and reading back, outside the publisher."""
    nc = await nats.connect(URL)
    try:
        yield nc.jetstream()
    finally:
        await nc.close()


@pytest.fixture
async def stream(js: JetStreamContext, topic: str) -> AsyncIterator[str]:
    """A stream of this test only, capturing exactly the ``topic`` subject."""
    name = unique_name("OB")
    await js.add_stream(name=name, subjects=[topic])
    try:
        yield name
    finally:
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)


@pytest.fixture
async def publisher(stream: str) -> AsyncIterator[NatsPublisher]:
    async with NatsPublisher.from_url(URL) as pub:
        yield pub


def _received(msg: Msg) -> Received:
    headers = dict(msg.headers or {})
    return Received(
        id=headers["Nats-Msg-Id"],
        key=headers.get("ce-partitionkey"),
        type=headers.get("ce-type"),
        payload=msg.data,
        headers=headers,
    )


async def _read(js: JetStreamContext, subject: str, count: int) -> list[Msg]:
    """The first ``count`` messages on ``subject``, through an ordered consumer from the start."""
    sub = await js.subscribe(subject, ordered_consumer=True)
    try:
        return [await sub.next_msg(timeout=5) for _ in range(count)]
    finally:
        await sub.unsubscribe()


@pytest.fixture
def read_back(js: JetStreamContext) -> Any:
    async def read(subject: str, count: int) -> Sequence[Received]:
        return [_received(m) for m in await _read(js, subject, count)]

    return read


async def _stored(js: JetStreamContext, stream: str) -> int:
    info = await js.stream_info(stream)
    return int(info.state.messages)


def _outcome(results: Sequence[PublishError | None] | BaseException) -> list[type | None]:
    if isinstance(results, BaseException):
        return [type(results)]
    return [None if r is None else type(r) for r in results]


async def _try_publish(
    publisher: NatsPublisher, messages: Sequence[Message]
) -> Sequence[PublishError | None] | BaseException:
    try:
        return await publisher.publish(messages)
    except BrokerUnavailable as exc:
        return exc


# -- the shared contract ----------------------------------------------------------------------


class TestNatsPublisherContract(PublisherContract):
    @pytest.fixture
    def unreachable_publisher(self, nats_up: None) -> NatsPublisher:
        return NatsPublisher.from_url(f"nats://{HOST}:{_closed_port()}")

    @pytest.fixture
    def permanent_failure(self) -> Any:
        # The test's stream captures exactly ``topic``: nothing captures this subject.
        return lambda topic: make_message(f"{topic}.nostream", 0)


# -- wire format ------------------------------------------------------------------------------


async def test_wire_format_carries_id_type_key_time_and_headers(
    publisher: NatsPublisher, js: JetStreamContext, topic: str
) -> None:
    created = dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)
    message = Message(
        id="0190a8e4-0000-7000-8000-000000000001",
        topic=topic,
        payload="héllo".encode(),
        key="order-7",
        type="OrderCreated",
        headers={"tenant": "acme", "x-trace": "abc"},
        content_type=TEXT,
        created_at=created,
    )
    assert list(await publisher.publish([message])) == [None]
    [msg] = await _read(js, topic, 1)
    assert msg.subject == topic
    assert msg.data == "héllo".encode()
    assert msg.headers == {
        "Nats-Msg-Id": message.id,
        "ce-specversion": "1.0",
        "ce-id": message.id,
        "ce-source": "outboxer",
        "ce-type": "OrderCreated",
        "ce-time": "2024-05-01T12:00:00.123456Z",
        "ce-partitionkey": "order-7",
        "content-type": TEXT,
        "tenant": "acme",
        "x-trace": "abc",
    }


async def test_no_type_and_no_key_leave_their_headers_out(
    stream: str, js: JetStreamContext, topic: str
) -> None:
    message = Message(id="plain-1", topic=topic, payload=b"\x00\x01")
    async with NatsPublisher.from_url(f"{URL}?source=billing") as publisher:
        assert list(await publisher.publish([message])) == [None]
    [msg] = await _read(js, topic, 1)
    assert msg.data == b"\x00\x01"
    assert msg.headers is not None
    assert "ce-type" not in msg.headers
    assert "ce-partitionkey" not in msg.headers
    assert msg.headers["ce-source"] == "billing"
    assert msg.headers["Nats-Msg-Id"] == msg.headers["ce-id"] == "plain-1"


async def test_user_headers_cannot_override_the_id(
    publisher: NatsPublisher, js: JetStreamContext, topic: str
) -> None:
    message = make_message(topic, 1, headers={"Nats-Msg-Id": "forged", "ce-id": "forged"})
    assert list(await publisher.publish([message])) == [None]
    [msg] = await _read(js, topic, 1)
    assert msg.headers is not None
    assert msg.headers["Nats-Msg-Id"] == msg.headers["ce-id"] == message.id


async def test_the_same_id_twice_is_stored_once(
    publisher: NatsPublisher, js: JetStreamContext, stream: str, topic: str
) -> None:
    message = make_message(topic, 1)
    assert list(await publisher.publish([message])) == [None]
    # A retry after a lost PubAck, in a later call and twice within one call: all acknowledged.
    assert list(await publisher.publish([message, message])) == [None, None]
    assert await _stored(js, stream) == 1


# -- classification ---------------------------------------------------------------------------


async def test_a_subject_without_stream_is_permanent_and_named(
    publisher: NatsPublisher, topic: str
) -> None:
    [result] = await publisher.publish([make_message(f"{topic}.elsewhere", 1)])
    assert isinstance(result, PermanentPublishError)
    assert f"no JetStream stream captures subject '{topic}.elsewhere'" in str(result)


async def test_unsendable_messages_are_refused_before_sending(
    publisher: NatsPublisher, js: JetStreamContext, stream: str, topic: str
) -> None:
    conn = publisher._connection
    assert conn is not None
    huge = b"x" * (conn.client.max_payload + 1)
    good = make_message(topic, 1)
    results = await publisher.publish(
        [
            make_message("orders.*", 1),
            make_message("orders..eu", 1),
            make_message("has space", 1),
            make_message(topic, 2, headers={"bad name": "x"}),
            Message(id="huge", topic=topic, payload=huge),
            good,
        ]
    )
    assert _outcome(results) == [PermanentPublishError] * 5 + [None]
    assert "wildcard" in str(results[0])
    assert "empty token" in str(results[1])
    assert "whitespace" in str(results[2])
    assert "'bad name'" in str(results[3])
    assert "max_payload" in str(results[4])
    # The server never saw the oversized message, so it kept the connection.
    assert list(await publisher.publish([make_message(topic, 3)])) == [None]
    assert await _stored(js, stream) == 2


async def test_stream_limits_are_classified(
    js: JetStreamContext, topic: str, nats_up: None
) -> None:
    small, full = f"{topic}.small", f"{topic}.full"
    names = [unique_name("OB"), unique_name("OB")]
    await js.add_stream(name=names[0], subjects=[small], max_msg_size=64)
    await js.add_stream(name=names[1], subjects=[full], max_msgs=1, discard=DiscardPolicy.NEW)
    try:
        async with NatsPublisher.from_url(URL) as publisher:
            results = await publisher.publish(
                [
                    Message(id="big", topic=small, payload=b"y" * 100),
                    make_message(full, 1),
                    make_message(full, 2),
                ]
            )
        assert _outcome(results) == [PermanentPublishError, None, RetryablePublishError]
        assert "10054" in str(results[0])  # JSStreamMessageExceedsMaximumErr
        assert "maximum messages exceeded" in str(results[2])
    finally:
        for name in names:
            await js.delete_stream(name)


async def test_a_stream_that_never_acknowledges_is_named_and_permanent(
    js: JetStreamContext, stream: str, topic: str
) -> None:
    """A stream created with ``no_ack`` stores what it captures and never sends a PubAck. Each
    message on it timed out as ``BrokerUnavailable``, so every batch holding one paused the
    whole relay (5 -> 60 s) for ever, with a warning naming only a timeout. Now the publisher,
    finding the server answering, asks JetStream, and such a message fails alone, for good,
    naming the stream and the setting; the message beside it is published (a probe)."""
    silent = f"{topic}.silent"
    name = unique_name("OB")
    await js.add_stream(name=name, subjects=[silent], no_ack=True)
    try:
        async with NatsPublisher.from_url(f"{URL}?ack_timeout=0.5") as publisher:
            results = await publisher.publish(
                [make_message(topic, 1), make_message(silent, 2), make_message(topic, 3)]
            )
            assert _outcome(results) == [None, PermanentPublishError, None]
            assert f"stream {name!r}" in str(results[1])
            assert "no_ack" in str(results[1])
            # The connection answered, so it was kept: the next call needs no reconnect.
            assert list(await publisher.publish([make_message(topic, 4)])) == [None]
        assert await _stored(js, stream) == 3
    finally:
        await js.delete_stream(name)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        ({"code": 400, "err_code": 10054, "description": "too big"}, PermanentPublishError),
        ({"code": 400, "err_code": 10109, "description": "sealed"}, PermanentPublishError),
        (
            {"code": 503, "err_code": 10077, "description": "maximum bytes exceeded"},
            RetryablePublishError,
        ),
        (
            {"code": 503, "err_code": 10077, "description": "message too large"},
            PermanentPublishError,
        ),
        ({"code": 503, "err_code": 10008, "description": "cluster unavailable"}, BrokerUnavailable),
        (
            {"code": 503, "err_code": 10023, "description": "insufficient resources"},
            BrokerUnavailable,
        ),
        ({"code": 500, "err_code": 10051, "description": "general"}, RetryablePublishError),
    ],
)
def test_jetstream_error_codes_map_to_publish_errors(
    error: dict[str, Any], expected: type[PublishError]
) -> None:
    result = _classify_api_error(error, "orders")
    assert type(result) is expected
    assert "'orders'" in str(result)
    assert str(error["err_code"]) in str(result)


# -- URLs and secrets -------------------------------------------------------------------------


def test_url_options_and_servers_are_parsed() -> None:
    publisher = publisher_from_url(
        "nats://alice:p%40ss@n1:4223,n2,[::1]:4224"
        "?source=billing&ack_timeout=2.5&connect_timeout=1&max_pending=64&name=relay-1"
    )
    assert isinstance(publisher, NatsPublisher)
    assert publisher.settings == NatsSettings(
        servers=("nats://n1:4223", "nats://n2:4222", "nats://[::1]:4224"),
        user="alice",
        password="p@ss",
        source="billing",
        ack_timeout=2.5,
        connect_timeout=1.0,
        max_pending=64,
        name="relay-1",
    )
    token = NatsPublisher.from_url("nats://s3cr3t-token@127.0.0.1")
    assert token.settings.token == "s3cr3t-token"
    assert token.settings.user is None
    assert "s3cr3t" not in repr(token)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("nats://alice:s3cr3t@host:notaport", "port 'notaport'"),
        ("nats://alice:s3cr3t@host:70000", "port '70000'"),
        ("nats://alice:s3cr3t@:4222", "a host is required"),
        ("nats://host:4222,,other", "a host is required"),
        ("nats://alice:s3cr3t@host:4222/subject", "path (/subject) is not allowed"),
        ("nats://host:4222?stream=x", "unknown option 'stream'"),
        ("nats://host:4222?ack_timeout=soon", "ack_timeout='soon' is not a number"),
        ("nats://host:4222?ack_timeout=0", "must be positive"),
        ("nats://host:4222?max_pending=0", "max_pending must be at least 1"),
        ("nats://host:4222?source=", "source must not be empty"),
        ("http://host:4222", "use nats://"),
    ],
)
def test_bad_urls_raise_one_readable_line_without_secrets(url: str, expected: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        NatsPublisher.from_url(url)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    assert "s3cr3t" not in message


async def test_connection_errors_and_logs_carry_no_secret(
    nats_up: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="outboxer")
    url = f"nats://alice:s3cr3t@{HOST}:{_closed_port()}"
    async with NatsPublisher.from_url(url) as publisher:  # entering with NATS down only logs
        with pytest.raises(BrokerUnavailable) as info:
            await publisher.publish([make_message("anything", 1)])
    assert f"{HOST}:" in str(info.value)
    assert "s3cr3t" not in str(info.value)
    assert "s3cr3t" not in caplog.text
    assert "cannot connect to NATS" in caplog.text


# -- concurrency, outages and recovery --------------------------------------------------------


async def test_concurrent_calls_share_a_small_window_and_keep_key_order(
    stream: str, js: JetStreamContext, topic: str
) -> None:
    calls = [[make_message(topic, n, key=f"c{c}-k{n % 5}") for n in range(60)] for c in range(4)]
    async with NatsPublisher.from_url(f"{URL}?max_pending=7") as publisher:
        results = await asyncio.gather(*(publisher.publish(batch) for batch in calls))
    assert [list(r) for r in results] == [[None] * 60] * 4
    received = [_received(m) for m in await _read(js, topic, 240)]
    for batch in calls:
        for key in {m.key for m in batch}:
            assert [r.id for r in received if r.key == key] == [m.id for m in batch if m.key == key]
    assert await _stored(js, stream) == 240


async def test_a_cut_connection_is_unavailable_then_recovers(
    proxy: TcpProxy, stream: str, js: JetStreamContext, topic: str
) -> None:
    first, second = make_message(topic, 1), make_message(topic, 2)
    # A long ack timeout: the outage must be noticed from the connection, not by waiting.
    settings = NatsSettings(servers=(proxy.url,), ack_timeout=120, connect_timeout=2)
    async with NatsPublisher(settings) as publisher:
        assert list(await publisher.publish([first])) == [None]

        await proxy.cut()
        outcome = await _try_publish(publisher, [second])
        assert _outcome(outcome) == [BrokerUnavailable]
        assert "no PubAck" not in str(outcome if isinstance(outcome, BaseException) else outcome[0])
        # Still down: the next call tries once more and reports the same.
        assert _outcome(await _try_publish(publisher, [second])) == [BrokerUnavailable]

        await proxy.restore()
        assert list(await publisher.publish([second])) == [None]
    assert [r.id for r in [_received(m) for m in await _read(js, topic, 2)]] == [
        first.id,
        second.id,
    ]
    assert await _stored(js, stream) == 2


async def test_a_cut_in_the_middle_of_a_call_never_acknowledges_a_lost_message(
    proxy: TcpProxy, stream: str, js: JetStreamContext, topic: str
) -> None:
    messages = [make_message(topic, n, key=f"k{n % 10}") for n in range(3000)]
    settings = NatsSettings(servers=(proxy.url,), ack_timeout=120)
    async with NatsPublisher(settings) as publisher:
        assert list(await publisher.publish(messages[:1])) == [None]
        halfway = asyncio.Event()
        proxy.forwarded_over = (proxy.forwarded + 200_000, halfway)
        call = asyncio.create_task(publisher.publish(messages[1:]))
        await halfway.wait()
        await proxy.cut()
        results = [None, *await call]
    outcomes = set(_outcome(results))
    assert BrokerUnavailable in outcomes
    assert outcomes <= {None, BrokerUnavailable}
    assert not any("no PubAck" in str(r) for r in results)  # noticed, not waited out
    acked = {m.id for m, r in zip(messages, results, strict=True) if r is None}
    stored = {_received(m).id for m in await _read(js, topic, await _stored(js, stream))}
    assert acked <= stored  # every acknowledged message is in the stream


async def test_a_publisher_entered_while_nats_is_down_connects_later(
    stream: str, js: JetStreamContext, topic: str, nats_up: None
) -> None:
    proxy = TcpProxy()  # not listening yet: the port refuses
    try:
        async with NatsPublisher.from_url(proxy.url) as publisher:
            message = make_message(topic, 1)
            assert _outcome(await _try_publish(publisher, [message])) == [BrokerUnavailable]
            await proxy.restore()
            assert list(await publisher.publish([message])) == [None]
    finally:
        await proxy.cut()
    assert await _stored(js, stream) == 1


async def test_each_call_makes_one_connection_attempt_shared_by_concurrent_calls(
    proxy: TcpProxy, topic: str
) -> None:
    proxy.reject = True
    async with NatsPublisher(NatsSettings(servers=(proxy.url,))) as publisher:
        tries_per_attempt = proxy.accepted  # nats-py's minimum: two back-to-back tries
        assert 1 <= tries_per_attempt <= 2
        outcomes = await asyncio.gather(
            *(_try_publish(publisher, [make_message(topic, n)]) for n in range(3))
        )
        assert [_outcome(o) for o in outcomes] == [[BrokerUnavailable]] * 3
        assert proxy.accepted == 2 * tries_per_attempt  # the three calls shared one attempt
        assert _outcome(await _try_publish(publisher, [make_message(topic, 9)])) == [
            BrokerUnavailable
        ]
        assert proxy.accepted == 3 * tries_per_attempt


async def test_a_stalled_connection_times_out_and_is_replaced(
    proxy: TcpProxy, stream: str, js: JetStreamContext, topic: str
) -> None:
    message = make_message(topic, 1)
    settings = NatsSettings(servers=(proxy.url,), ack_timeout=0.5, connect_timeout=1)
    async with NatsPublisher(settings) as publisher:
        assert list(await publisher.publish([make_message(topic, 0)])) == [None]
        proxy.swallow = True  # the socket stays open; nothing gets through any more
        [result] = await publisher.publish([message])
        assert isinstance(result, BrokerUnavailable)
        assert "no PubAck within 0.5 s" in str(result)
        assert publisher._connection is None  # the PING probe failed: connection dropped

        proxy.swallow = False
        assert list(await publisher.publish([message])) == [None]
    assert proxy.accepted == 2
    assert await _stored(js, stream) == 2


# -- TLS --------------------------------------------------------------------------------------


@pytest.fixture
def tls_server(tmp_path: Path, nats_up: None) -> Iterator[tuple[int, Path]]:
    """A second, TLS-only nats-server with JetStream, its certificate self-signed: (port, CA)."""
    for tool in ("openssl", "nats-server"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed; the TLS test needs it", pytrace=False)
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", f"/CN={HOST}"),
            *("-addext", f"subjectAltName=IP:{HOST}"),
        ],
        check=True,
        capture_output=True,
    )
    port = _closed_port()
    server = subprocess.Popen(
        [
            *("nats-server", "-a", HOST, "-p", str(port), "-js", "-sd", str(tmp_path / "js")),
            *("--tls", "--tlscert", str(cert), "--tlskey", str(key)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((HOST, port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail("the TLS nats-server did not start", pytrace=False)
                time.sleep(0.05)  # a process starting: no event to await
        yield port, cert
    finally:
        server.terminate()
        server.wait(timeout=10)


async def test_tls_server_with_a_private_ca(tls_server: tuple[int, Path], topic: str) -> None:
    port, ca = tls_server
    nc = await nats.connect(f"nats://{HOST}:{port}", tls=ssl.create_default_context(cafile=str(ca)))
    try:
        js = nc.jetstream()
        await js.add_stream(name=unique_name("OB"), subjects=[topic])
        async with NatsPublisher.from_url(f"nats://{HOST}:{port}?tls_ca_file={ca}") as publisher:
            message = make_message(topic, 1)
            assert list(await publisher.publish([message])) == [None]
        [msg] = await _read(js, topic, 1)
        assert _received(msg).id == message.id

        # Without the CA the self-signed certificate is refused: broker unreachable, not acked.
        async with NatsPublisher.from_url(f"nats://{HOST}:{port}?connect_timeout=0.5") as pub:
            with pytest.raises(BrokerUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
                await pub.publish([make_message(topic, 2)])
    finally:
        await nc.close()


def test_an_unreadable_ca_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot use tls_ca_file"):
        NatsPublisher.from_url(f"{URL}?tls_ca_file={tmp_path / 'missing.pem'}")
