"""RedisPublisher against the real Redis on 127.0.0.1:6379.

Every test writes to streams named after its own ``topic`` and deletes every key starting with
that name afterwards. Outages are produced for real: a local TCP proxy between the publisher and
Redis is cut, stalled and restored; connections are killed with ``CLIENT KILL``; ACL users with
the wrong password or too few key permissions are created and removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis

from outboxer.brokers import publisher_from_url
from outboxer.brokers.redis import RedisPublisher, RedisSettings
from outboxer.errors import (
    BrokerUnavailable,
    ConfigurationError,
    PermanentPublishError,
    RetryablePublishError,
)
from outboxer.message import OCTET_STREAM, Message
from tests.conftest import require_service
from tests.contracts.publisher import PublisherContract, Received, make_message

HOST, PORT = "127.0.0.1", 6379
URL = f"redis://{HOST}:{PORT}/0"


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture
async def redis_client() -> AsyncIterator[aioredis.Redis]:
    """A plain redis-py client for setting up and reading back, outside the publisher."""
    require_service("Redis", HOST, PORT)
    client = aioredis.Redis(host=HOST, port=PORT, db=0)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(autouse=True)
async def _delete_test_keys(redis_client: aioredis.Redis, topic: str) -> AsyncIterator[None]:
    yield
    keys = [k async for k in redis_client.scan_iter(match=f"{topic}*", count=1000)]
    if keys:
        await redis_client.delete(*keys)


@pytest.fixture
async def publisher(redis_client: aioredis.Redis) -> AsyncIterator[RedisPublisher]:
    async with RedisPublisher.from_url(URL) as pub:
        yield pub


def _received(fields: dict[bytes, bytes]) -> Received:
    key, type_ = fields.get(b"key"), fields.get(b"type")
    return Received(
        id=fields[b"id"].decode(),
        key=key.decode() if key is not None else None,
        type=type_.decode() if type_ is not None else None,
        payload=fields[b"payload"],
        headers=json.loads(fields[b"headers"]),
    )


@pytest.fixture
def read_back(redis_client: aioredis.Redis) -> Any:
    async def read(stream: str, count: int) -> Sequence[Received]:
        entries = await redis_client.xrange(stream, count=count)
        return [_received(fields) for _, fields in entries]

    return read


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
def unreachable_publisher() -> RedisPublisher:
    return RedisPublisher.from_url(f"redis://{HOST}:{_closed_port()}/0?connect_timeout=1")


@pytest.fixture
async def permanent_failure(redis_client: aioredis.Redis, topic: str) -> Callable[[str], Message]:
    # A plain string key where the stream should be: XADD answers WRONGTYPE, forever.
    await redis_client.set(f"{topic}-not-a-stream", "occupied")
    return lambda t: make_message(f"{t}-not-a-stream", 0)


class TestRedisPublisherContract(PublisherContract):
    """The shared publisher contract, against real Redis Streams."""


# -- wire format ----------------------------------------------------------------------------


async def test_entry_has_exactly_the_documented_fields(
    publisher: RedisPublisher, redis_client: aioredis.Redis, topic: str
) -> None:
    message = make_message(topic, 7, key="order-7", headers={"tenant": "acme", "x-trace": "t1"})
    assert list(await publisher.publish([message])) == [None]
    [(entry_id, fields)] = await redis_client.xrange(topic)
    assert fields == {
        b"id": message.id.encode(),
        b"type": b"Numbered",
        b"key": b"order-7",
        b"payload": b'{"n":7}',
        b"headers": b'{"tenant":"acme","x-trace":"t1"}',
        b"content_type": b"application/json",
    }
    # Field order on the wire is the documented one, and Redis chose the entry id.
    assert list(fields) == [b"id", b"type", b"key", b"payload", b"headers", b"content_type"]
    assert entry_id.count(b"-") == 1


async def test_missing_key_and_type_are_omitted_and_empty_key_is_kept(
    publisher: RedisPublisher, redis_client: aioredis.Redis, topic: str
) -> None:
    bare = Message(id="bare-1", topic=topic, payload=b"{}", key=None, type=None)
    empty_key = Message(id="empty-1", topic=topic, payload=b"{}", key="", type="T")
    assert list(await publisher.publish([bare, empty_key])) == [None, None]
    [(_, first), (_, second)] = await redis_client.xrange(topic)
    assert set(first) == {b"id", b"payload", b"headers", b"content_type"}
    assert first[b"headers"] == b"{}"
    assert second[b"key"] == b""  # present and empty: a real key, unlike an absent field
    assert second[b"type"] == b"T"


async def test_binary_payload_and_content_type_round_trip(
    publisher: RedisPublisher, redis_client: aioredis.Redis, topic: str
) -> None:
    payload = bytes(range(256)) * 3
    message = Message(id="bin-1", topic=topic, payload=payload, content_type=OCTET_STREAM)
    assert list(await publisher.publish([message])) == [None]
    [(_, fields)] = await redis_client.xrange(topic)
    assert fields[b"payload"] == payload
    assert fields[b"content_type"] == OCTET_STREAM.encode()


async def test_unicode_names_and_headers_round_trip(
    publisher: RedisPublisher, read_back: Any, topic: str
) -> None:
    stream = f"{topic}-bestellungen-ü"
    message = make_message(stream, 1, key="kunde-ß", headers={"note": "naïve ✓"})
    assert list(await publisher.publish([message])) == [None]
    [received] = await read_back(stream, 10)
    assert received.key == "kunde-ß"
    assert received.headers == {"note": "naïve ✓"}


async def test_maxlen_trims_streams_approximately(redis_client: aioredis.Redis, topic: str) -> None:
    async with RedisPublisher.from_url(f"{URL}?maxlen=100") as pub:
        messages = [make_message(topic, n) for n in range(1000)]
        for start in range(0, 1000, 250):
            assert list(await pub.publish(messages[start : start + 250])) == [None] * 250
    length = await redis_client.xlen(topic)
    # MAXLEN ~ 100 drops whole internal nodes (100 entries each by default): at least 100 stay,
    # far fewer than 1000, and never an exact cut that would cost a node split per XADD.
    assert 100 <= length <= 300
    [(_, newest)] = await redis_client.xrevrange(topic, count=1)
    assert newest[b"id"] == messages[-1].id.encode()


async def test_concurrent_batches_all_land_in_key_order(
    publisher: RedisPublisher, read_back: Any, topic: str
) -> None:
    # Four concurrent calls (distinct keys per call, as the relay does) on pooled connections.
    batches = [[make_message(topic, n, key=f"b{b}-k{n % 5}") for n in range(300)] for b in range(4)]
    results = await asyncio.gather(*(publisher.publish(batch) for batch in batches))
    assert all(list(r) == [None] * 300 for r in results)
    received = await read_back(topic, 2000)
    assert len(received) == 1200
    for batch in batches:
        for key in {m.key for m in batch}:
            assert [r.id for r in received if r.key == key] == [m.id for m in batch if m.key == key]


# -- error classification -------------------------------------------------------------------


async def test_wrongtype_is_permanent_for_that_message_only(
    publisher: RedisPublisher, redis_client: aioredis.Redis, read_back: Any, topic: str
) -> None:
    await redis_client.set(topic, "a plain string named like the stream")
    other = f"{topic}-orders"
    before, bad, after = make_message(other, 1), make_message(topic, 2), make_message(other, 3)
    results = await publisher.publish([before, bad, after])
    assert results[0] is None
    assert results[2] is None
    assert isinstance(results[1], PermanentPublishError)
    assert "WRONGTYPE" in str(results[1])
    assert topic in str(results[1])
    assert [r.id for r in await read_back(other, 10)] == [before.id, after.id]
    assert await redis_client.get(topic) == b"a plain string named like the stream"


async def test_unencodable_message_fails_alone(
    publisher: RedisPublisher, read_back: Any, topic: str
) -> None:
    broken = make_message(topic, 1, key="\ud800")  # a lone surrogate cannot be UTF-8
    good = make_message(topic, 2, key="fine")
    results = await publisher.publish([broken, good])
    assert isinstance(results[0], PermanentPublishError)
    assert "encode" in str(results[0])
    assert results[1] is None
    assert [r.id for r in await read_back(topic, 10)] == [good.id]


@pytest.fixture
async def acl_user(redis_client: aioredis.Redis, topic: str) -> AsyncIterator[tuple[str, str]]:
    """An ACL user allowed every command but only on keys starting with ``<topic>-allowed``."""
    name, password = f"ob-{uuid.uuid4().hex[:10]}", f"pw-{uuid.uuid4().hex}"
    await redis_client.execute_command(
        "ACL", "SETUSER", name, "on", f">{password}", f"~{topic}-allowed*", "+@all"
    )
    try:
        yield name, password
    finally:
        await redis_client.execute_command("ACL", "DELUSER", name)


async def test_acl_noperm_is_permanent(
    acl_user: tuple[str, str], read_back: Any, topic: str
) -> None:
    name, password = acl_user
    async with RedisPublisher.from_url(f"redis://{name}:{password}@{HOST}:{PORT}/0") as pub:
        allowed, forbidden = make_message(f"{topic}-allowed", 1), make_message(topic, 2)
        results = await pub.publish([forbidden, allowed])
    assert isinstance(results[0], PermanentPublishError)
    assert "NOPERM" in str(results[0])
    assert password not in str(results[0])
    assert results[1] is None
    assert [r.id for r in await read_back(f"{topic}-allowed", 10)] == [allowed.id]


async def test_wrong_password_is_unavailable_and_never_shown(
    acl_user: tuple[str, str], topic: str
) -> None:
    name, _ = acl_user
    secret = f"wrong-{uuid.uuid4().hex}"
    async with RedisPublisher.from_url(f"redis://{name}:{secret}@{HOST}:{PORT}/0") as pub:
        assert secret not in repr(pub)
        [result] = await pub.publish([make_message(topic, 1)])
    assert isinstance(result, BrokerUnavailable)
    assert secret not in str(result)
    assert f"redis://{name}:***@{HOST}:{PORT}/0" in str(result)


async def test_database_out_of_range_is_unavailable(topic: str) -> None:
    async with RedisPublisher.from_url(f"redis://{HOST}:{PORT}/9999") as pub:
        [result] = await pub.publish([make_message(topic, 1)])
    assert isinstance(result, BrokerUnavailable)
    assert "DB index is out of range" in str(result)


def test_unknown_error_replies_are_retryable() -> None:
    # Not reproducible on a healthy server; the classifier is checked with a real redis-py
    # error object as the parser builds it for an unknown "ERR ..." reply.
    from redis.exceptions import ReadOnlyError, ResponseError

    pub = RedisPublisher.from_url(URL)
    message = make_message("s", 1)
    assert isinstance(
        pub._classify(message, ResponseError("ERR something odd")), RetryablePublishError
    )
    readonly = ReadOnlyError("You can't write against a read only replica.", status_code="READONLY")
    error = pub._classify(message, readonly)
    assert isinstance(error, BrokerUnavailable)
    assert "READONLY" in str(error)


async def test_publish_needs_an_open_publisher(topic: str) -> None:
    with pytest.raises(RuntimeError, match="async with"):
        await RedisPublisher.from_url(URL).publish([make_message(topic, 1)])


# -- URLs -----------------------------------------------------------------------------------


def test_url_defaults() -> None:
    settings = RedisSettings.from_url("redis://localhost")
    assert (settings.host, settings.port, settings.db) == ("localhost", 6379, 0)
    assert settings.maxlen is None
    assert not settings.tls
    assert settings.password is None


def test_url_with_every_option() -> None:
    settings = RedisSettings.from_url(
        "rediss://app:p%40ss%3Aw0rd@redis.example:6380/3?maxlen=5000&connect_timeout=2.5"
        "&socket_timeout=1&max_connections=4&client_name=relay-1&ssl_cert_reqs=none"
        "&ssl_ca_certs=/etc/ca.pem"
    )
    assert settings.host == "redis.example"
    assert (settings.port, settings.db, settings.maxlen) == (6380, 3, 5000)
    assert (settings.username, settings.password) == ("app", "p@ss:w0rd")
    assert settings.tls
    assert (settings.connect_timeout, settings.socket_timeout) == (2.5, 1.0)
    assert (settings.max_connections, settings.client_name) == (4, "relay-1")
    assert (settings.ssl_cert_reqs, settings.ssl_ca_certs) == ("none", "/etc/ca.pem")
    assert settings.safe_url() == "rediss://app:***@redis.example:6380/3"
    assert "p@ss" not in repr(settings)
    assert "p@ss" not in repr(RedisPublisher(settings))


def test_url_password_only_and_ipv6() -> None:
    settings = RedisSettings.from_url("redis://:secret@[::1]:7000/1")
    assert (settings.host, settings.port, settings.db) == ("::1", 7000, 1)
    assert settings.username is None
    assert settings.password == "secret"
    assert settings.safe_url() == "redis://:***@[::1]:7000/1"


def test_publisher_from_url_picks_the_redis_adapter() -> None:
    assert isinstance(publisher_from_url("redis://127.0.0.1:6379/0"), RedisPublisher)
    assert isinstance(publisher_from_url("rediss://127.0.0.1:6380/0"), RedisPublisher)


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("redis://:topsecret@host:notaport/0", "port"),
        ("redis://:topsecret@host:6379/zero", "database number"),
        ("redis://:topsecret@host:6379/-1", "database number"),
        ("redis://:topsecret@/0", "host is required"),
        ("redis://:topsecret@host/0?maxlen=lots", "maxlen='lots' is not an integer"),
        ("redis://:topsecret@host/0?maxlen=0", "maxlen=0 must be a positive integer"),
        ("redis://:topsecret@host/0?socket_timeout=0", "socket_timeout must be a positive"),
        ("redis://:topsecret@host/0?connect_timeout=soon", "connect_timeout='soon'"),
        ("redis://:topsecret@host/0?max_connections=0", "max_connections must be at least 1"),
        ("redis://:topsecret@host/0?stream=orders", "unknown option 'stream'"),
        ("redis://:topsecret@host/0?maxlen=1&maxlen=2", "more than once"),
        ("redis://:topsecret@host/0?ssl_ca_certs=/ca.pem", "needs a rediss://"),
        ("rediss://:topsecret@host/0?ssl_cert_reqs=maybe", "ssl_cert_reqs='maybe'"),
        ("redis://:topsecret@host:70000/0", "port"),
        ("redis://:topsecret@host/0?client_name=my%20relay", "client_name must not contain"),
        ("http://:topsecret@host/0", "scheme http:// is not accepted"),
    ],
)
def test_bad_urls_get_one_readable_line_without_the_password(url: str, complaint: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        RedisPublisher.from_url(url)
    message = str(caught.value)
    assert complaint in message
    assert "\n" not in message
    assert "topsecret" not in message


# -- outages and recovery -------------------------------------------------------------------


class TcpProxy:
    """A local TCP proxy to Redis that a test can cut, stall and restore.

    ``cut`` stops listening and resets every open connection (the broker "goes away");
    ``stall`` keeps connections open but stops forwarding bytes (a hung broker or a dead
    network path); ``restore`` listens again on the same port and forwards again.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._serve, HOST, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.add(client_w)
        try:
            upstream_r, upstream_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        self._writers.add(upstream_w)
        pumps = [
            asyncio.ensure_future(self._pump(client_r, upstream_w)),
            asyncio.ensure_future(self._pump(upstream_r, client_w)),
        ]
        self._tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for writer in (client_w, upstream_w):
            writer.close()
        await asyncio.gather(*pumps, return_exceptions=True)
        self._tasks.difference_update(pumps)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()

    def stall(self) -> None:
        self._flowing.clear()

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        self._flowing.set()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def restore(self) -> None:
        self._flowing.set()
        if self._server is None:
            await self.start()

    async def close(self) -> None:
        await self.cut()


@pytest.fixture
async def proxy(redis_client: aioredis.Redis) -> AsyncIterator[TcpProxy]:
    proxy = await TcpProxy(HOST, PORT).start()
    try:
        yield proxy
    finally:
        await proxy.close()


async def test_recovers_after_the_broker_went_away_and_came_back(
    proxy: TcpProxy, read_back: Any, topic: str
) -> None:
    async with RedisPublisher.from_url(
        f"redis://{HOST}:{proxy.port}/0?connect_timeout=1&socket_timeout=2"
    ) as pub:
        first = make_message(topic, 1)
        assert list(await pub.publish([first])) == [None]

        await proxy.cut()  # Redis "goes away": open connections reset, new ones refused
        during = [make_message(topic, 2), make_message(topic, 3)]
        results = await pub.publish(during)
        assert all(isinstance(r, BrokerUnavailable) for r in results)
        results = await pub.publish(during)  # still down: still reported, nothing raised
        assert all(isinstance(r, BrokerUnavailable) for r in results)

        await proxy.restore()
        assert list(await pub.publish(during)) == [None, None]
    assert [r.id for r in await read_back(topic, 10)] == [first.id] + [m.id for m in during]


async def test_stalled_broker_times_out_and_recovers(
    proxy: TcpProxy, read_back: Any, topic: str
) -> None:
    async with RedisPublisher.from_url(
        f"redis://{HOST}:{proxy.port}/0?connect_timeout=1&socket_timeout=0.3"
    ) as pub:
        assert list(await pub.publish([make_message(topic, 1)])) == [None]
        proxy.stall()  # the connection stays open but nothing comes back
        [result] = await pub.publish([make_message(topic, 2)])
        assert isinstance(result, BrokerUnavailable)
        assert "Timeout" in str(result)
        await proxy.restore()
        late = make_message(topic, 3)
        assert list(await pub.publish([late])) == [None]
    # The stalled XADD was released by the socket timeout: it reached Redis once the proxy
    # flowed again (an at-least-once duplicate the relay would publish again) or not at all.
    ids = [r.id for r in await read_back(topic, 10)]
    assert ids[-1] == late.id


async def test_recovers_after_its_connections_are_killed(
    redis_client: aioredis.Redis, read_back: Any, topic: str
) -> None:
    name = f"ob-kill-{uuid.uuid4().hex[:10]}"
    async with RedisPublisher.from_url(f"{URL}?client_name={name}") as pub:
        batches = [[make_message(topic, n, key=f"c{c}") for n in range(50)] for c in range(3)]
        await asyncio.gather(*(pub.publish(b) for b in batches))  # several pooled connections
        mine = [c for c in await redis_client.client_list() if c["name"] == name]
        assert mine
        for client in mine:
            await redis_client.client_kill_filter(_id=client["id"])
        again = [make_message(topic, 100 + n) for n in range(10)]
        results = list(await pub.publish(again))
        if results != [None] * 10:  # dead sockets detected only on use: reported once
            assert all(isinstance(r, BrokerUnavailable) for r in results)
            results = list(await pub.publish(again))
        assert results == [None] * 10
    assert {m.id for m in again} <= {r.id for r in await read_back(topic, 1000)}


async def test_one_connection_attempt_per_call_while_down(topic: str) -> None:
    """A server that accepts and hangs up at once: every call tries once, never spins."""
    accepted = 0

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    server = await asyncio.start_server(hang_up, HOST, 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with RedisPublisher.from_url(f"redis://{HOST}:{port}/0?connect_timeout=1") as pub:
            for call in range(1, 4):
                results = await pub.publish([make_message(topic, n) for n in range(5)])
                assert all(isinstance(r, BrokerUnavailable) for r in results)
                assert accepted == call
    finally:
        server.close()
        await server.wait_closed()


async def test_a_message_over_the_servers_bulk_length_is_refused_alone(
    tmp_path: Any, topic: str
) -> None:
    """A server configured with a lower ``proto-max-bulk-len`` closes the connection on a
    longer bulk string: every batch holding the message was an "outage", for ever, and what
    was pipelined before it was appended again each round (a probe). The limit is read from
    the server: such a message is refused alone. (A Redis of its own: the limit is the
    server's.)"""
    with socket.socket() as free:
        free.bind((HOST, 0))
        port = free.getsockname()[1]
    server = await asyncio.create_subprocess_exec(
        "redis-server", "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no",
        "--dir", str(tmp_path), "--proto-max-bulk-len", "1mb",
        stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    client = aioredis.Redis(host=HOST, port=port)
    try:
        for _ in range(100):
            with contextlib.suppress(OSError, aioredis.ConnectionError):
                if await client.ping():
                    break
            await asyncio.sleep(0.05)
        big = dataclasses.replace(make_message(topic, 1), payload=b"x" * (2 * 1024 * 1024))
        small = [make_message(topic, n) for n in (0, 2)]
        async with RedisPublisher(f"redis://{HOST}:{port}/0") as publisher:
            results = list(await publisher.publish([small[0], big, small[1]]))
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], PermanentPublishError)
        assert "proto-max-bulk-len (1048576 bytes)" in str(results[1])
        assert await client.xlen(topic) == 2
    finally:
        await client.aclose()
        server.terminate()
        await server.wait()
