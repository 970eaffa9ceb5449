"""HTTP webhook publisher: one POST per message, CloudEvents HTTP binary mode, HMAC-signed.

URL: ``http(s)://[user:password@]host[:port]/path[?query]``. The endpoint is POSTed to as
given; ``{topic}`` anywhere in it is replaced by the message's topic (percent-encoded), so
``https://hooks.example.com/outbox/{topic}`` sends each topic to its own path. Query
parameters named ``outboxer_*`` are outboxer's own and are removed before sending:

=========================== ========= ================================================
``outboxer_concurrency``     64        requests in flight at once (= HTTP/1.1 keep-alive
                                       connections in the pool), across publish calls
``outboxer_timeout``         10        seconds to wait for the response (read/write; with
                                       the connect timeout, the whole exchange's limit)
``outboxer_connect_timeout`` 5         seconds to establish a connection
``outboxer_source``          outboxer  the CloudEvents ``source`` attribute
=========================== ========= ================================================

The HMAC secret is never read from the URL (URLs end up in logs, process lists and shell
history): pass ``secret=`` (the CLI reads ``OUTBOXER_WEBHOOK_SECRET``). Keyword arguments win
over URL options.

Wire format (CloudEvents 1.0, HTTP protocol binding, *binary* content mode)::

    POST <endpoint>
    content-type: <message.content_type>          (the CloudEvents datacontenttype)
    ce-specversion: 1.0
    ce-id: <message.id>                           (stable: receivers deduplicate on it)
    ce-type: <message.type, or the topic when the message has no type>
    ce-source: <source>                           (default "outboxer")
    ce-time: <message.created_at, RFC 3339 UTC, e.g. 2024-05-01T12:00:00.123456Z>
    ce-topic: <message.topic>                     (extension attribute)
    ce-partitionkey: <message.key>                (partitioning extension; only when keyed)
    webhook-signature: sha256=<hex>               (only when a secret is configured)
    <user header>: <value>                        (each message header, under its own name)

    <payload bytes>

``ce-*`` values are percent-encoded where the binding requires it (bytes outside printable
ASCII, space, ``"`` and ``%``). The signature is ``HMAC-SHA256(secret, ce-id + "." + ce-time +
"." + body)`` over the header values exactly as sent and the raw body, in lower-case hex.

User headers travel as plain HTTP headers with their own names, because CloudEvents extension
names must be lower-case alphanumeric, which ``x-trace`` or ``Tenant`` are not. A user header
whose name is reserved -- any ``ce-*`` name, ``content-type``, ``content-length``,
``webhook-signature``, HTTP/1.1 framing and connection headers (``host``, ``connection``,
``transfer-encoding``, ...) or a header configured with ``headers=`` -- or whose name is not an
HTTP token or whose value is not printable ASCII is never sent: the message fails permanently
with the reason, since no retry could change it and silently dropping or renaming the header
would change what the receiver sees without anyone noticing.

Error classification:

======================================================== =========================
what happened                                            result
======================================================== =========================
2xx (whatever the body; at most 64 KiB of it is read)     acknowledged (``None``)
408, 429, 5xx, and any status outside 2xx-5xx            ``RetryablePublishError`` (with
                                                         ``retry_after`` from ``Retry-After``)
3xx (redirects are not followed) and other 4xx           ``PermanentPublishError``
connection refused, DNS failure, connect timeout, proxy  ``BrokerUnavailable``
no complete response in time (read, write, whole)        ``RetryablePublishError``
connection dropped mid-request (twice in a row)          ``RetryablePublishError``
reserved/invalid user header                             ``PermanentPublishError``
======================================================== =========================

Why a read timeout is retryable and not "broker down": the receiver accepted the connection and
the request, so it is up; it may even have processed the message (the retry is a duplicate its
``ce-id`` lets it drop). A message that makes the receiver hang must count attempts and end in
the dead-letter table, not stall the whole relay behind an outage backoff forever. A real outage
shows up as a connect failure on the next request, which is ``BrokerUnavailable``.

A connection dropped mid-request is tried once more at once on a fresh connection: HTTP/1.1
keep-alive connections the receiver closed (idle timeout, restart) look like that, and the
duplicate this may cause is harmless under at-least-once delivery.

Concurrency and ordering: at most ``concurrency`` requests are in flight per publisher, across
concurrent ``publish`` calls, over as many HTTP/1.1 keep-alive connections. The window is a queue
of slots (a semaphore that also says which connection pool to use): the connections are split
into ``httpx.AsyncClient`` pools of 4, because httpcore walks its whole pool on every request and
one pool of 64 ran about 4x slower than sixteen pools of 4. Requests never wait inside httpx.

Within one call, messages with the same key are sent one after the other in input order, keys
run concurrently; once a keyed message fails, the later messages of that key in the call are not
sent (``RetryablePublishError``), so a receiver never sees a key's messages out of order.
Unkeyed messages have no order.

Outages: while the receiver is known to be unreachable (and before the first success), a
``publish`` call first sends one message alone; if that cannot connect, every message of the call
is ``BrokerUnavailable`` without further connection attempts. So each call the relay paces
during its backoff costs one connection attempt, and the first call after recovery succeeds.

Secrets: the URL's user info and query string, the HMAC secret and the ``headers=`` values never
appear in reprs, logs or error messages; errors name the endpoint as ``scheme://host:port/path``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import email.utils
import ssl
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import httpx

from outboxer.brokers.http import wire
from outboxer.brokers.http.settings import HttpSettings
from outboxer.errors import (
    BrokerUnavailable,
    ConfigurationError,
    PermanentPublishError,
    PublishError,
    RetryablePublishError,
)
from outboxer.message import Message

__all__ = ["HttpPublisher"]

_EXCERPT = 200
#: Bytes of a response body read at most (a keep-alive connection is reused only when the whole
#: body was read: small bodies are).
_BODY_READ = 64 * 1024
#: Connections per httpx pool. httpcore walks every connection of its pool (one readability
#: check per idle connection) each time it assigns a request, so a single pool of 64
#: connections costs O(64) per request and ran ~4x slower here than small pools sharing the
#: same number of connections (see docs/brokers/http.md, "Throughput").
_POOL_SIZE = 4


class HttpPublisher:
    """Publishes each message as one signed CloudEvents POST to a webhook endpoint.

    The publisher owns its ``httpx.AsyncClient``: ``async with`` opens it (no connection is made
    until the first publish) and closes it with every pooled connection.

    Args:
        url: ``http(s)://…`` endpoint, optionally with ``{topic}`` and ``outboxer_*`` options.
        secret: HMAC-SHA256 key (``str`` is UTF-8 encoded); ``None`` sends no signature.
        source: CloudEvents ``source``; default ``outboxer_source`` or ``"outboxer"``.
        concurrency: Requests in flight; default ``outboxer_concurrency`` or 64.
        timeout: Response timeout in seconds; default ``outboxer_timeout`` or 10.
        connect_timeout: Connect timeout in seconds; default ``outboxer_connect_timeout`` or 5.
        headers: Static headers for every request, such as ``Authorization``.
        verify: TLS verification (``True``, ``False``, a CA bundle path or an SSLContext).

    Raises:
        ConfigurationError: The URL or a setting is invalid (one readable line, no secrets).
    """

    #: A call sends a key's messages one after the other and none behind a failed one (see
    #: "Concurrency and ordering" above): the relay may give it a key's whole run in one call.
    keeps_key_order = True

    def __init__(
        self,
        url: str,
        *,
        secret: str | bytes | None = None,
        source: str | None = None,
        concurrency: int | None = None,
        timeout: float | None = None,
        connect_timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        verify: bool | str | ssl.SSLContext = True,
    ) -> None:
        self.settings = HttpSettings.from_url(
            url,
            secret=secret.encode() if isinstance(secret, str) else secret,
            source=source,
            concurrency=concurrency,
            timeout=timeout,
            connect_timeout=connect_timeout,
            headers=headers or {},
            verify=verify,
        )
        self._reserved = wire.RESERVED_HEADERS | {n.lower() for n in self.settings.headers}
        try:
            self._tls = _ssl_context(verify)  # built once, shared by every pool
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(
                f"HTTP publisher: cannot load the TLS CA certificates from verify=: {exc}"
            ) from None
        self._source = wire.ce_value(self.settings.source)
        self._templated = "{topic}" in self.settings.endpoint
        self._urls: dict[str, httpx.URL] = {}
        # The in-flight window: one slot per allowed request, each slot naming the client (a
        # small keep-alive pool) to send it with. Shared by concurrent publish calls, and as
        # many slots as connections, so a request never waits inside httpx.
        self._slots: asyncio.LifoQueue[httpx.AsyncClient] | None = None
        self._clients: list[httpx.AsyncClient] = []
        # False until a request reaches the receiver, and again after a connect failure: then a
        # publish call probes with one message before fanning out (one connection attempt).
        self._reachable = False

    @classmethod
    def from_url(cls, url: str, *, secret: str | bytes | None = None) -> HttpPublisher:
        """``http(s)://host[:port]/path[?outboxer_concurrency=N&outboxer_timeout=S...]``."""
        return cls(url, secret=secret)

    def __repr__(self) -> str:
        signed = "signed" if self.settings.secret else "unsigned"
        return f"<HttpPublisher {self.settings.display_endpoint} {signed}>"

    async def __aenter__(self) -> HttpPublisher:
        settings = self.settings
        timeout = httpx.Timeout(
            settings.timeout,
            connect=settings.connect_timeout,
            pool=None,  # the slots already bound requests to the connections available
        )
        slots: asyncio.LifoQueue[httpx.AsyncClient] = asyncio.LifoQueue()
        remaining = settings.concurrency
        while remaining:
            size = min(_POOL_SIZE, remaining)
            remaining -= size
            client = httpx.AsyncClient(
                headers={"user-agent": "outboxer", **settings.headers},
                timeout=timeout,
                limits=httpx.Limits(max_connections=size, max_keepalive_connections=size),
                verify=self._tls,
                follow_redirects=False,  # a redirect would re-POST the signed body elsewhere
            )
            self._clients.append(client)
            for _ in range(size):
                slots.put_nowait(client)
        self._slots = slots
        self._reachable = False
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        clients, self._clients, self._slots = self._clients, [], None
        for client in clients:
            await client.aclose()

    async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
        """POST every message; return one result per message, in input order.

        Raises:
            RuntimeError: The publisher was not entered (``async with``).
        """
        if self._slots is None:
            raise RuntimeError("HttpPublisher is not open: use `async with HttpPublisher(...)`")
        results: list[PublishError | None] = [None] * len(messages)
        call = _Call(messages, results)
        lanes = _lanes(messages)
        if not lanes:
            return results
        if not self._reachable:
            # Probe with the first message alone: while the receiver is down this is the only
            # connection attempt of the call.
            first = lanes[0]
            await self._run_lane(call, first[:1])
            if call.outage is not None:
                return [call.outage] * len(messages)
            lanes[0] = first[1:]  # a failed keyed probe has blocked the rest of its key
        pending = iter(lanes)
        workers = min(self.settings.concurrency, len(lanes))
        await asyncio.gather(*(self._worker(call, pending) for _ in range(workers)))
        return results

    async def _worker(self, call: _Call, lanes: Iterator[list[int]]) -> None:
        for lane in lanes:
            await self._run_lane(call, lane)

    async def _run_lane(self, call: _Call, lane: list[int]) -> None:
        """Send one key's messages in order (or one unkeyed message)."""
        for index in lane:
            message = call.messages[index]
            if call.outage is not None:
                call.results[index] = call.outage
                continue
            if message.key is not None and message.key in call.blocked:
                call.results[index] = RetryablePublishError(
                    f"not sent: an earlier message with key {message.key!r} failed in this batch"
                )
                continue
            assert self._slots is not None
            client = await self._slots.get()
            try:
                if call.outage is not None:  # the receiver went down while we waited
                    result: PublishError | None = call.outage
                else:
                    result = await self._send(message, client)
            finally:
                self._slots.put_nowait(client)
            call.results[index] = result
            if isinstance(result, BrokerUnavailable):
                call.outage = result
                self._reachable = False
            else:
                self._reachable = True
                if result is not None and message.key is not None:
                    call.blocked.add(message.key)

    def _url(self, topic: str) -> httpx.URL:
        url = self._urls.get(topic)
        if url is None:
            endpoint = self.settings.endpoint
            if self._templated:
                # A topic '.' or '..' as it is would be a dot segment, which the URL resolves
                # (the webhook of another path): encoded, it is a name.
                segment = quote(topic, safe="")
                if segment in (".", ".."):
                    segment = segment.replace(".", "%2E")
                endpoint = endpoint.replace("{topic}", segment)
            url = self._urls[topic] = httpx.URL(endpoint)
        return url

    def _headers(self, message: Message) -> dict[str, str] | PermanentPublishError:
        headers = wire.headers(message, self._source, self.settings.secret)
        for name, value in message.headers.items():
            problem = wire.header_problem(name, value, self._reserved)
            if problem is not None:
                return PermanentPublishError(f"not sent: {problem}")
            headers[name] = value
        return headers

    async def _send(self, message: Message, client: httpx.AsyncClient) -> PublishError | None:
        headers = self._headers(message)
        if isinstance(headers, PublishError):
            return headers
        url = self._url(message.topic)
        where = self.settings.display_endpoint
        # The whole exchange, not each read: a receiver trickling its answer a byte at a time
        # held the relay (and the message, never counting an attempt) forever (a probe).
        deadline = self.settings.connect_timeout + self.settings.timeout
        for attempt in (1, 2):
            try:
                async with asyncio.timeout(deadline):
                    request = client.stream("POST", url, content=message.payload, headers=headers)
                    async with request as response:
                        return await _answer(response, where)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.ProxyError) as exc:
                return BrokerUnavailable(f"cannot connect to {where}: {_describe(exc)}")
            except (httpx.TimeoutException, TimeoutError) as exc:
                return RetryablePublishError(
                    f"no response from {where} within {self.settings.timeout:g} s "
                    f"({type(exc).__name__}); the receiver may have processed it"
                )
            except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                if attempt == 1:
                    continue  # a keep-alive connection the receiver closed: once more, fresh
                return RetryablePublishError(f"connection to {where} dropped: {_describe(exc)}")
            except httpx.HTTPError as exc:
                return RetryablePublishError(f"request to {where} failed: {_describe(exc)}")
            except Exception as exc:  # noqa: BLE001 - one odd message must not abort the batch
                return RetryablePublishError(f"request to {where} failed: {_describe(exc)}")
        raise AssertionError("unreachable")  # pragma: no cover


@dataclass(slots=True)
class _Call:
    """The shared state of one ``publish`` call."""

    messages: Sequence[Message]
    results: list[PublishError | None]
    blocked: set[str] = field(default_factory=set)  # keys with a failed message in this call
    outage: BrokerUnavailable | None = None  # set by the first connect failure of the call


def _ssl_context(verify: bool | str | ssl.SSLContext) -> ssl.SSLContext:
    """One TLS context for every pool (httpx would load the CA bundle once per client)."""
    if isinstance(verify, str):
        # httpx deprecates verify=<path>; build the context the way it recommends.
        if Path(verify).is_dir():
            return ssl.create_default_context(capath=verify)
        return ssl.create_default_context(cafile=verify)
    return httpx.create_ssl_context(verify=verify)


def _lanes(messages: Sequence[Message]) -> list[list[int]]:
    """Message indexes grouped by key in input order; each unkeyed message is its own lane."""
    lanes: list[list[int]] = []
    by_key: dict[str, list[int]] = {}
    for index, message in enumerate(messages):
        key = message.key
        if key is None:
            lanes.append([index])
        elif (lane := by_key.get(key)) is not None:
            lane.append(index)
        else:
            lanes.append(by_key.setdefault(key, [index]))
    return lanes


def _describe(exc: BaseException) -> str:
    """An exception in one line, without the request URL httpx may quote in it."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    if "://" in text:  # never echo a URL: it may carry user info or tokens
        text = ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _answer(response: httpx.Response, where: str) -> PublishError | None:
    """What the receiver's answer means. The status decides: a 2xx is an acknowledgement
    whatever its body (one that did not decode, or was cut short, made a delivered message a
    failure, delivered again and dead-lettered); of a body only :data:`_BODY_READ` bytes are
    read (a 2 GB body was read whole into memory) and :data:`_EXCERPT` kept for the reason."""
    body = b""
    with contextlib.suppress(httpx.HTTPError):
        async for chunk in response.aiter_raw():  # raw: a body that does not decode is no error
            body += chunk
            if len(body) >= _BODY_READ:
                break  # the rest is not read: the connection is closed, not reused
    return _classify(response, body, where)


def _classify(response: httpx.Response, body: bytes, where: str) -> PublishError | None:
    status = response.status_code
    if 200 <= status < 300:
        return None
    excerpt = " ".join(body[:_EXCERPT].decode("utf-8", "replace").split())
    reason = f"HTTP {status} {response.reason_phrase} from {where}"
    if excerpt:
        reason += f": {excerpt}"
    if status in (408, 429) or 500 <= status < 600:
        retry_after = response.headers.get("retry-after")
        if retry_after:
            reason += f" (Retry-After: {retry_after[:40]})"
        return RetryablePublishError(reason, retry_after=_seconds(retry_after))
    if 300 <= status < 500:
        if 300 <= status < 400:
            reason += " (redirects are not followed: configure the final URL)"
        return PermanentPublishError(reason)
    return RetryablePublishError(reason)


def _seconds(retry_after: str | None) -> float | None:
    """The delay a ``Retry-After`` value asks for (seconds, or an HTTP date), else ``None``."""
    if not retry_after:
        return None
    text = retry_after.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())
