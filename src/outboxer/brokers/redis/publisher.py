"""Redis Streams publisher: every message becomes one stream entry (``XADD``).

The stream is the message topic. A batch is one pipeline (``transaction=False``) on one pooled
connection: every ``XADD`` is written in a single send and the replies are read back together,
so a batch of 500 costs one round trip. An entry counts as acknowledged only once its ``XADD``
reply (the new entry id) has been read. Commands on one connection run in the order they were
written, so messages of the same key keep their write order within a call; concurrent calls use
different pooled connections (the relay never puts one key in two concurrent calls).

Wire format::

    XADD <topic> [MAXLEN ~ <maxlen>] * id <id> [type <type>] [key <key>] payload <bytes>
         headers <json object> content_type <mime type>

================  ========================================================================
field             value
================  ========================================================================
``id``            the outbox message id (UUIDv7 string): consumers deduplicate on it
``type``          event type; **omitted** when the message has no type
``key``           ordering key; **omitted** when the message has no key (an empty string
                  is a real, empty key)
``payload``       the payload bytes, unchanged (may be binary; see ``content_type``)
``headers``       user headers as a JSON object, ``{}`` when there are none
``content_type``  MIME type of ``payload`` (not in the other brokers' tables)
================  ========================================================================

The stream entry id (``<ms>-<seq>``) is chosen by Redis (``*``). With ``?maxlen=N`` each
``XADD`` trims the stream to about ``N`` entries (``MAXLEN ~ N``: Redis only drops whole
internal nodes, so the stream may keep somewhat more than ``N``).

URL::

    redis://[[user]:password@]host[:port][/db][?maxlen=N&connect_timeout=S&socket_timeout=S
          &max_connections=N&client_name=NAME]
    rediss://...   TLS; also ?ssl_ca_certs=PATH&ssl_cert_reqs=required|optional|none

Error classification:

=========================================================  ===========================
failure                                                    result
=========================================================  ===========================
connection refused, reset or closed; DNS or TLS failure    ``BrokerUnavailable``
connect or socket timeout (``connect_timeout``,            ``BrokerUnavailable``
``socket_timeout``)
handshake refused: wrong password (``WRONGPASS``),         ``BrokerUnavailable``
``NOAUTH``, ``SELECT`` of a db out of range, ``LOADING``,
max clients reached
no pooled connection free within connect + socket timeout  ``BrokerUnavailable``
reply ``READONLY`` (a failover left us on a replica),      ``BrokerUnavailable``
``OOM``, ``BUSY``, ``MISCONF``, ``MASTERDOWN``,
``CLUSTERDOWN``, ``TRYAGAIN``, ``NOREPLICAS``
reply ``WRONGTYPE`` (the key is not a stream)              ``PermanentPublishError``
reply ``NOPERM`` (an ACL forbids the stream)               ``PermanentPublishError``
reply ``MOVED``, ``ASK``, ``CROSSSLOT`` (Redis Cluster is  ``PermanentPublishError``
not supported: use a standalone or Sentinel primary)
topic/key/type/id not encodable as UTF-8, headers not      ``PermanentPublishError``
JSON-serializable, payload over Redis' 512 MiB bulk limit
any other error reply                                      ``RetryablePublishError``
=========================================================  ===========================

Broker-wide failures report ``BrokerUnavailable`` for the messages of the call, and idle pooled
connections are dropped, so the next ``publish`` opens a fresh connection. redis-py's own
retries are turned off (``Retry(NoBackoff(), 0)``): one connection attempt per call, the relay
paces the calls. After a failure in the middle of a pipeline some entries may already be in the
stream; they are published again later (the at-least-once duplicates consumers drop by ``id``).
A pooled connection that the server closed an instant before a call (``CLIENT KILL``, a
restart) may only be noticed by that call, which then reports ``BrokerUnavailable`` once; idle
connections closed earlier are detected when taken from the pool and replaced transparently.

Passwords never appear in ``repr``, log lines or error messages (see
:meth:`RedisSettings.safe_url`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from redis.asyncio import BlockingConnectionPool, Connection, Redis, SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    AskError,
    ClusterCrossSlotError,
    ClusterDownError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from outboxer import urls
from outboxer.brokers.redis import wire
from outboxer.brokers.redis.settings import RedisSettings
from outboxer.errors import (
    BrokerUnavailable,
    PermanentPublishError,
    PublishError,
    RetryablePublishError,
)
from outboxer.message import Message

__all__ = ["RedisPublisher"]

#: Error reply codes that describe the server, not the message: back off as a whole.
_BROKER_WIDE_CODES = frozenset(
    {"READONLY", "OOM", "BUSY", "MISCONF", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS"}
)
_BROKER_WIDE_ERRORS = (ReadOnlyError, OutOfMemoryError, ClusterDownError, TryAgainError)
#: Error reply codes that can never succeed for this message's stream.
_PERMANENT_CODES = frozenset({"WRONGTYPE", "NOPERM", "MOVED", "ASK", "CROSSSLOT"})
_PERMANENT_ERRORS = (NoPermissionError, AskError, ClusterCrossSlotError)


class RedisPublisher:
    """Appends messages to Redis Streams, one pipelined ``XADD`` per message.

    The publisher owns its connection pool: ``async with`` creates it (without connecting, so a
    relay can start while Redis is down) and closes it. Connections are opened on demand by
    ``publish`` and replaced after a failure. Settings not in the URL (or a password kept out of
    it) are given with :func:`dataclasses.replace`::

        settings = replace(RedisSettings.from_url(url), password=os.environ["REDIS_PASSWORD"])
        async with RedisPublisher(settings) as publisher: ...
    """

    #: A call is one pipeline on one connection, whose commands run in the order written: the
    #: relay may pipeline a key's run in one call.
    keeps_key_order = True

    def __init__(self, settings: RedisSettings | str) -> None:
        """Take parsed settings, or a ``redis://``/``rediss://`` URL to parse."""
        if isinstance(settings, str):
            settings = RedisSettings.from_url(settings)
        self.settings = settings
        self._client: Redis | None = None
        #: The server's ``proto-max-bulk-len``, read once (``CONFIG GET``) on the first call: a
        #: bulk string over it makes Redis close the connection, which would look like an
        #: outage for every batch that holds the message, forever.
        self._max_bulk: int | None = None
        # MAXLEN ~ N: approximate trimming lets Redis drop whole radix-tree nodes, which is
        # O(1) amortised; exact trimming would cost a node split on nearly every XADD.
        self._trim: tuple[bytes, ...] = (
            (b"MAXLEN", b"~", str(settings.maxlen).encode()) if settings.maxlen else ()
        )

    @classmethod
    def from_url(cls, url: str) -> RedisPublisher:
        """``redis://host:port/db?maxlen=N`` or ``rediss://...``; see :class:`RedisSettings`."""
        return cls(RedisSettings.from_url(url))

    def __repr__(self) -> str:
        return f"RedisPublisher({self.settings.safe_url()!r})"

    async def __aenter__(self) -> RedisPublisher:
        if self._client is not None:
            return self  # already open: entering twice must not leak the first pool
        settings = self.settings
        pool = BlockingConnectionPool(
            **settings.connection_arguments(),
            connection_class=SSLConnection if settings.tls else Connection,
            # No retries inside redis-py: one connection attempt per publish call, the relay
            # backs off between calls (redis-py's default would retry 10 times per command).
            retry=Retry(NoBackoff(), 0),
            max_connections=settings.max_connections,
            # Waiting for a free pooled connection is bounded by how long a busy one can take.
            timeout=settings.connect_timeout + settings.socket_timeout,
        )
        self._client = Redis.from_pool(pool)  # the client owns the pool and closes it
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
        client = self._client
        if client is None:
            raise RuntimeError("RedisPublisher is not open: use 'async with publisher:'")
        results: list[PublishError | None] = [None] * len(messages)
        if self._max_bulk is None:
            try:
                self._max_bulk = await self._read_max_bulk(client)
            except (RedisError, OSError) as exc:
                outage = BrokerUnavailable(
                    f"redis at {self.settings.safe_url()} is unavailable: {self._describe(exc)}"
                )
                await self._drop_idle_connections()
                return [outage] * len(messages)
        pipe = client.pipeline(transaction=False)
        sent: list[int] = []
        for index, message in enumerate(messages):
            try:
                command = wire.xadd(message, self._trim, self._max_bulk)
            except (UnicodeEncodeError, TypeError, ValueError) as exc:
                results[index] = PermanentPublishError(
                    f"cannot encode message for Redis: {type(exc).__name__}: {exc}"
                )
                continue
            pipe.execute_command(*command)
            sent.append(index)
        if not sent:
            return results
        try:
            replies = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            # Anything raised (rather than returned per command) concerns the connection or
            # the server as a whole: connect/handshake/auth failures, resets, timeouts.
            outage = BrokerUnavailable(
                f"redis at {self.settings.safe_url()} is unavailable: {self._describe(exc)}"
            )
            for index in sent:
                results[index] = outage
            await self._drop_idle_connections()
            return results
        broker_down = False
        for index, reply in zip(sent, replies, strict=True):
            if isinstance(reply, Exception):
                error = self._classify(messages[index], reply)
                broker_down = broker_down or isinstance(error, BrokerUnavailable)
                results[index] = error
        if broker_down:
            # READONLY after a failover: reconnect (DNS/Sentinel may point elsewhere now).
            await self._drop_idle_connections()
        return results

    @staticmethod
    async def _read_max_bulk(client: Redis) -> int:
        """``proto-max-bulk-len`` of the server; the default when ``CONFIG`` is not allowed
        (an ACL, a managed Redis that renames it). Connection failures propagate."""
        try:
            reply = await client.config_get("proto-max-bulk-len")
        except (RedisConnectionError, RedisTimeoutError, OSError):
            raise
        except RedisError:
            return wire.MAX_PAYLOAD_BYTES
        try:
            return min(int(str(reply["proto-max-bulk-len"])), wire.MAX_PAYLOAD_BYTES)
        except (KeyError, TypeError, ValueError):
            return wire.MAX_PAYLOAD_BYTES

    def _classify(self, message: Message, reply: Exception) -> PublishError:
        """Turn one ``XADD`` error reply into what the relay should do with the message."""
        code = _error_code(reply)
        text = f"redis refused XADD to stream {message.topic!r}: {self._describe(reply)}"
        if isinstance(reply, _BROKER_WIDE_ERRORS) or code in _BROKER_WIDE_CODES:
            return BrokerUnavailable(f"redis at {self.settings.safe_url()}: {text}")
        if isinstance(reply, _PERMANENT_ERRORS) or code in _PERMANENT_CODES:
            if code in ("MOVED", "ASK", "CROSSSLOT"):
                text += " (Redis Cluster is not supported: use a standalone or Sentinel primary)"
            return PermanentPublishError(text)
        return RetryablePublishError(text)

    def _describe(self, exc: BaseException) -> str:
        """``Type: message`` of a driver error, with the password scrubbed in any case."""
        code = _error_code(exc)
        text = str(exc)
        if code and not text.startswith(code):
            text = f"{code} {text}"  # redis-py strips known codes (READONLY, NOPERM...)
        password = self.settings.password
        if password:  # a driver may echo the bare password, which no URL pattern finds
            text = text.replace(password, urls.MASK)
        return f"{type(exc).__name__}: {urls.redact(text)}"

    async def _drop_idle_connections(self) -> None:
        """Close idle pooled connections so that the next call connects afresh."""
        if self._client is not None:
            # Closing a dead socket may fail; it is gone either way.
            with contextlib.suppress(RedisError, OSError):
                await self._client.connection_pool.disconnect(inuse_connections=False)


def _error_code(exc: BaseException) -> str:
    """The Redis error code (``WRONGTYPE``, ``READONLY``...) of an error reply."""
    code = getattr(exc, "status_code", None)
    if isinstance(code, str) and code:
        return code
    first = str(exc).split(" ", 1)[0]
    return first if first.isupper() else ""
