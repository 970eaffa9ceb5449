"""NATS JetStream publisher: one pipelined connection, PubAcks awaited as a bounded window.

URL::

    nats://[user:password@|token@]host[:port][,host[:port]...][?option=value&...]

Options (all optional): ``source`` (CloudEvents source, default ``outboxer``), ``ack_timeout``
(seconds a ``publish()`` call waits for its PubAcks, default 5), ``connect_timeout`` (seconds per
connection attempt, default 2), ``max_pending`` (un-acknowledged messages in flight per
publisher, default 4096), ``name`` (client name shown by the server, default ``outboxer``),
``tls_ca_file`` (CA bundle for a TLS server signed by a private CA; a server that requires TLS
is otherwise verified against the system CAs).
Credentials are handed to nats-py separately from the server list and are never logged.

Wire format (one JetStream message per outbox message)::

    subject            message topic (a stream capturing it must exist; outboxer creates none)
    payload            message payload bytes, unchanged
    Nats-Msg-Id        message id: JetStream drops a re-publish within the stream's duplicate
                       window (2 minutes by default) and acknowledges it as a duplicate
    ce-specversion     "1.0"
    ce-id              message id
    ce-source          the ``source`` option
    ce-type            message type (omitted when the message has none)
    ce-time            created_at, RFC 3339 in UTC (``2024-05-01T12:00:00.123456Z``)
    ce-partitionkey    message key (CloudEvents partitioning extension; omitted when no key)
    content-type       message content type
    <user headers>     as given, written first: one named like a header above is replaced

NATS header values are trimmed and CR/LF become spaces (as nats-py does, so that a value can
never break the protocol line). Messages are written in input order on one connection, so
JetStream stores the messages of one key in the order of the call.

Client CPU per message is what limits a relay on NATS, so the hot path is the publisher's own:
it encodes each ``HPUB`` command itself (the bytes ``Client.publish`` would write) and hands a
batch to nats-py's output buffer in one piece, and the PubAcks of its reply inbox reach it
straight from nats-py's protocol parser, without a ``Msg`` object, a queue or a task switch per
message. Connecting, TLS, authentication, reconnection, flushing and every other message stay
nats-py's. This uses three private nats-py 2.x methods (``Client._send_command``,
``_flush_pending`` and ``_process_msg``), pinned by the integration tests; it halved the relay's
CPU per message (39 -> 21 us with PostgreSQL, ``benchmarks/brokers.py`` conditions).

Errors, per message unless marked "whole call"::

    failure                                              reported as
    ---------------------------------------------------  ---------------------------------------
    PubAck received (also "duplicate": already stored)   None (acknowledged)
    no stream captures the subject (no responders)       PermanentPublishError
    subject empty / whitespace / wildcard / empty token  PermanentPublishError (never sent)
    header name not a valid NATS header token            PermanentPublishError (never sent)
    a header named ``Status`` (nats-py would never       PermanentPublishError (never sent)
      deliver the message to a consumer)
    headers + payload larger than the server max_payload PermanentPublishError (never sent; the
                                                         server would drop the connection)
    JetStream error 10054/10097 (message/headers over    PermanentPublishError
      the stream limit), 10109 (sealed stream), any
      other error with HTTP-like code 400/404
    JetStream error 10077 (store failed: stream full     RetryablePublishError, unless the text
      with discard=new, ...) and other 500-class errors  says the message is too large
                                                         (PermanentPublishError)
    JetStream 503 errors (JetStream/cluster unavailable, BrokerUnavailable
      insufficient resources)
    cannot connect (refused, timeout, auth, no servers)  BrokerUnavailable (whole call, raised)
    connection lost before or during the call            BrokerUnavailable for every message not
                                                         acknowledged yet
    no PubAck within ack_timeout                         BrokerUnavailable (the connection is
                                                         probed and replaced if dead)
    no PubAck, the connection alive, from a stream       PermanentPublishError (it never
      created with no_ack                                acknowledges anything)

Connection lifecycle: ``__aenter__`` tries to connect once and, if the broker is down, only logs
a warning, so a relay started before NATS backs off instead of exiting. After a drop nats-py
retries twice at once (that heals a connection reset while the server is up); if the client is
still not connected when ``publish()`` is called, that call discards it and makes one fresh
connection attempt (shared by concurrent calls; nats-py's minimum is two back-to-back tries per
server), so the relay's backoff paces reconnection. A message whose PubAck was
lost may already be stored; its re-publish carries the same ``Nats-Msg-Id`` and is dropped by
JetStream inside the duplicate window, and consumers can dedupe on ``ce-id`` beyond it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nats.aio.client import Client

from outboxer.brokers.nats import wire
from outboxer.brokers.nats.settings import NatsSettings
from outboxer.errors import (
    BrokerUnavailable,
    ConfigurationError,
    PermanentPublishError,
    PublishError,
    RetryablePublishError,
)
from outboxer.message import Message

__all__ = ["NatsPublisher"]

log = logging.getLogger("outboxer.publisher.nats")

# JetStream error codes (nats-server errors.json) that no retry can fix.
_PERMANENT_ERR_CODES = frozenset(
    {
        10054,  # JSStreamMessageExceedsMaximumErr: over the stream's max_msg_size
        10097,  # JSStreamHeaderExceedsMaximumErr: headers over 64k
        10109,  # JSStreamSealedErr: a sealed stream accepts nothing ever again
    }
)

# nats-py's own rule for header names (nats.aio.client._HEADER_KEY_RE), checked before sending
# so that such a message fails alone and is never half-written.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_SUBJECT_WHITESPACE = re.compile(r"[\s]")


def _subject_problem(subject: str) -> str | None:
    """Why JetStream cannot take ``subject`` as a publish subject, or ``None``."""
    if not subject:
        return "the topic is empty, which is not a NATS subject"
    if _SUBJECT_WHITESPACE.search(subject):
        return f"topic {subject!r} contains whitespace, which a NATS subject cannot"
    try:
        subject.encode()
    except UnicodeEncodeError:
        return f"topic {subject!r} is not encodable as UTF-8"
    for token in subject.split("."):
        if not token:
            return f"topic {subject!r} has an empty token, which a NATS subject cannot"
        if token in ("*", ">"):
            return f"topic {subject!r} contains a wildcard; messages need a literal subject"
    return None


def _classify_api_error(error: Mapping[str, Any], subject: str) -> PublishError:
    code, err_code = error.get("code"), error.get("err_code")
    text = f"JetStream refused a message on {subject!r}: {error.get('description')}"
    text += f" (code {code}, err_code {err_code})"
    if err_code in _PERMANENT_ERR_CODES or code in (400, 404):
        return PermanentPublishError(text)
    if err_code == 10077:  # JSStreamStoreFailedF: "maximum messages exceeded" and the like
        if "too large" in str(error.get("description", "")).lower():
            return PermanentPublishError(text)
        return RetryablePublishError(text)
    if code == 503:
        return BrokerUnavailable(text)
    return RetryablePublishError(text)


class _Client(Client):
    """nats-py's client, with the PubAcks of one reply inbox handed straight to a callback.

    nats-py turns every incoming message into a ``Msg`` object, parses its headers, queues it
    for the subscription's task and awaits the subscription callback: on the relay's path that
    cost about as much client CPU as sending. The PubAcks of the publisher's inbox skip all
    that; every other message takes nats-py's usual path. ``_process_msg`` is what nats-py's
    parser calls for every ``MSG``/``HMSG`` (nats-py 2.x).
    """

    ack_prefix = b"\x00"  # matches no subject until route_acks is called
    ack_handler: Callable[[bytes, bytes, bytes | None], None]

    def route_acks(
        self, prefix: bytes, handler: Callable[[bytes, bytes, bytes | None], None]
    ) -> None:
        """Hand messages whose subject starts with ``prefix`` to ``handler(subject, data,
        headers)``; the subscription that makes the server send them is the caller's."""
        self.ack_prefix = prefix
        self.ack_handler = handler

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes
    ) -> None:
        # ``headers`` is None for a message without headers, whatever nats-py's hint says.
        if subject.startswith(self.ack_prefix):
            self.ack_handler(subject, data, headers)
            return
        await super()._process_msg(sid, subject, reply, data, headers)


class _Batch:
    """One ``publish()`` call: its results and how many PubAcks it still waits for."""

    __slots__ = ("done", "outstanding", "results", "tokens")

    def __init__(self, size: int) -> None:
        self.results: list[PublishError | None] = [None] * size
        self.outstanding = 0
        self.tokens: list[int] = []
        self.done: asyncio.Future[None] | None = None


class _Connection:
    """One nats-py client, the reply inbox where its PubAcks arrive, and the PubAck window.

    Every message is published with the reply subject ``<inbox>.<n>``; ``pending`` maps ``n`` to
    the call and position waiting for that PubAck, and its size is the window: at most
    ``max_pending`` entries across concurrent calls. Whoever removes an entry from ``pending``
    (the PubAck, a lost connection, a timed-out call) settles it, so each message is settled
    exactly once.

    Messages are not sent through ``Client.publish``: nats-py re-validates the subject and
    every header there and encodes headers character by character, which cost more client CPU
    than everything else on the relay's path. The publisher encodes each ``HPUB`` command
    itself (same bytes, see :func:`wire.header_block`) and hands a whole batch to nats-py's
    output buffer as one command (``Client._send_command`` then ``_flush_pending``: what
    ``Client.publish`` ends in), so ordering with nats-py's own commands, its flusher task and
    its reconnect buffer are all nats-py's.
    """

    def __init__(self, client: _Client, max_pending: int) -> None:
        self.client = client
        self.max_pending = max_pending
        self.inbox = client.new_inbox() + "."
        self._inbox_length = len(self.inbox)
        client.route_acks(self.inbox.encode(), self.on_reply)
        self.pending: dict[int, tuple[_Batch, int, str]] = {}
        self.room = asyncio.Event()  # set whenever ``pending`` is below ``max_pending``
        self.room.set()
        self.counter = 0

    def next_reply(self) -> tuple[int, str]:
        self.counter += 1
        return self.counter, f"{self.inbox}{self.counter}"

    async def send(self, commands: list[bytes]) -> None:
        """Hand ``commands`` (complete protocol commands) to nats-py in one piece, and clear it.

        Raises:
            ConnectionError: the client is not connected (nothing is handed over).
        """
        if not commands:
            return
        client = self.client
        if not client.is_connected:
            raise ConnectionError("the NATS connection was lost")
        data = b"".join(commands)
        commands.clear()
        await client._send_command(data)  # noqa: SLF001 - see the class docstring
        if client._flush_queue is not None and client._flush_queue.empty():  # noqa: SLF001
            await client._flush_pending()  # noqa: SLF001

    async def wait_for_room(self, deadline: float) -> bool:
        """Wait until the window has room; ``False`` if ``deadline`` passed first."""
        loop = asyncio.get_running_loop()
        while len(self.pending) >= self.max_pending:
            self.room.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                async with asyncio.timeout(remaining):
                    await self.room.wait()
            except TimeoutError:
                return False
        return True

    def settle(self, token: int, outcome: PublishError | None) -> None:
        entry = self.pending.pop(token, None)
        if entry is None:
            return  # already settled: a PubAck after a timeout or a lost connection
        batch, index, _ = entry
        batch.results[index] = outcome
        if not self.room.is_set():
            self.room.set()  # waiters re-check the size themselves
        batch.outstanding -= 1
        if batch.outstanding == 0 and batch.done is not None and not batch.done.done():
            batch.done.set_result(None)

    def fail_all(self, reason: str) -> None:
        """Report every un-acknowledged message as broker-down (connection lost or closed)."""
        for token in list(self.pending):
            self.settle(token, BrokerUnavailable(reason))

    def on_reply(self, subject: bytes, data: bytes, headers: bytes | None) -> None:
        """A reply on the inbox: the PubAck (or the refusal) of one message."""
        try:
            token = int(subject[self._inbox_length :])
        except ValueError:
            return  # not one of ours
        entry = self.pending.get(token)
        if entry is None:
            return
        if not data and headers and headers.startswith(b"NATS/1.0 503"):
            # No responders: nothing listens on the subject, i.e. no stream captures it.
            subject_text = entry[2]
            self.settle(
                token,
                PermanentPublishError(
                    f"no JetStream stream captures subject {subject_text!r}: create a stream for "
                    "it, then replay the dead letters"
                ),
            )
        elif b'"error"' in data:
            try:
                error = json.loads(data)["error"]
            except (ValueError, KeyError, TypeError):
                error = {"description": data[:200].decode(errors="replace")}
            self.settle(token, _classify_api_error(error, entry[2]))
        else:
            self.settle(token, None)  # a PubAck, possibly {"duplicate": true}


class NatsPublisher:
    """Publishes outbox messages to NATS JetStream and reports a result per message.

    The publisher owns its nats-py connection: it opens it in ``__aenter__`` (or lazily, if the
    broker was down then) and closes it in ``__aexit__``.
    """

    #: A call's messages are written in input order on one connection, so JetStream stores the
    #: messages of a key in the order of the call: the relay may pipeline a key's run.
    keeps_key_order = True

    def __init__(self, settings: NatsSettings | None = None) -> None:
        self.settings = settings or NatsSettings()
        self._tls: ssl.SSLContext | None = None
        if self.settings.tls_ca_file is not None:
            try:
                self._tls = ssl.create_default_context(cafile=self.settings.tls_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigurationError(
                    f"NATS: cannot use tls_ca_file {self.settings.tls_ca_file!r}: {exc}"
                ) from None
        self._connection: _Connection | None = None
        self._connecting: asyncio.Future[_Connection] | None = None
        # Subjects already checked, so the check costs one dict lookup per message.
        self._subject_checks: dict[str, str | None] = {}

    @classmethod
    def from_url(cls, url: str) -> NatsPublisher:
        """``nats://[user:pass@]host:port[,host:port][?source=...&ack_timeout=...]``."""
        return cls(NatsSettings.from_url(url))

    def __repr__(self) -> str:
        return f"NatsPublisher({self.settings.describe()})"

    async def __aenter__(self) -> NatsPublisher:
        try:
            await self._connect()
        except BrokerUnavailable as exc:
            log.warning("%s; publish() will try again", exc)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError, BrokerUnavailable):
                await self._connecting
        self._connecting = None
        await self._drop("the publisher was closed")

    async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
        if not messages:
            return []
        conn = await self._connect()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.ack_timeout
        batch = _Batch(len(messages))
        pending, max_pending = conn.pending, conn.max_pending
        max_payload = conn.client.max_payload
        commands: list[bytes] = []  # encoded, not handed to nats-py yet
        # One pass, in input order, without awaiting any PubAck: the window is the only brake.
        index = 0
        try:
            for index, message in enumerate(messages):
                block, refusal = self._encode(message, max_payload)
                if refusal is not None:
                    batch.results[index] = PermanentPublishError(refusal)
                    continue
                if len(pending) >= max_pending:
                    await conn.send(commands)  # what waits for room must be on its way
                    if not await conn.wait_for_room(deadline):
                        self._fail_rest(batch, index, "no room in the PubAck window")
                        break
                token, reply = conn.next_reply()
                pending[token] = (batch, index, message.topic)
                batch.tokens.append(token)
                batch.outstanding += 1
                payload = message.payload
                size = len(block) + len(payload)
                commands.append(f"HPUB {message.topic} {reply} {len(block)} {size}\r\n".encode())
                commands.extend((block, payload, b"\r\n"))
            index = len(messages)  # every message is now registered, refused or failed
            await conn.send(commands)
        except Exception as exc:  # noqa: BLE001 - any client failure ends the call
            reason = (
                str(exc) if isinstance(exc, ConnectionError) else f"NATS publish failed: {exc!r}"
            )
            for token in batch.tokens:
                conn.settle(token, BrokerUnavailable(reason))
            self._fail_rest(batch, index, reason)
        if batch.outstanding:
            # Created only now, so PubAcks that arrive while the loop still sends cannot end
            # the wait early.
            batch.done = loop.create_future()
            await asyncio.wait([batch.done], timeout=max(0.0, deadline - loop.time()))
        if batch.outstanding:
            reason = f"no PubAck within {self.settings.ack_timeout:g} s"
            unanswered = {
                entry[1]: entry[2]
                for entry in map(pending.get, batch.tokens)
                if entry is not None and entry[0] is batch
            }
            for token in batch.tokens:
                conn.settle(token, BrokerUnavailable(reason))
            await self._probe(conn)
            if self._connection is conn:  # the server answers: is it the stream's doing?
                await self._refuse_unacknowledging_streams(conn, batch, unanswered)
        return batch.results

    # -- helpers ------------------------------------------------------------------------------

    def _encode(self, message: Message, max_payload: int) -> tuple[bytes, str | None]:
        """The NATS header block of ``message``, and why it can never be sent (``None`` if it
        can)."""
        subject = message.topic
        try:
            problem = self._subject_checks[subject]
        except KeyError:
            if len(self._subject_checks) > 10_000:  # unbounded topic sets stay bounded here
                self._subject_checks.clear()
            problem = self._subject_checks[subject] = _subject_problem(subject)
        if problem is not None:
            return b"", problem
        for name in message.headers:
            if not _HEADER_NAME.fullmatch(name):
                return b"", f"header name {name!r} is not a valid NATS header name"
            if name == "Status":  # nats-py's consumers take it for a JetStream status
                return b"", (
                    "header 'Status' is not sent: nats-py consumers take a message with it for "
                    "a JetStream status message and never deliver it; rename the header"
                )
        try:
            block = wire.header_block(message, self.settings.source)
        except UnicodeEncodeError as exc:
            return b"", f"a header is not encodable as UTF-8: {exc.reason}"
        # The server counts headers and payload against max_payload and drops the whole
        # connection on a violation, so an oversized message is refused before it is sent.
        size = len(block) + len(message.payload)
        if size > max_payload:
            return block, (
                f"message of {size} bytes (headers included) exceeds the NATS server's "
                f"max_payload of {max_payload} bytes"
            )
        return block, None

    @staticmethod
    def _fail_rest(batch: _Batch, start: int, reason: str) -> None:
        for index in range(start, len(batch.results)):
            if batch.results[index] is None:
                batch.results[index] = BrokerUnavailable(reason)

    async def _connect(self) -> _Connection:
        """The live connection, or one new connection attempt (shared by concurrent calls)."""
        conn = self._connection
        if conn is not None and conn.client.is_connected:
            return conn
        if self._connecting is None or self._connecting.done():
            # Set before any await, so concurrent callers join this attempt instead of racing.
            self._connecting = asyncio.ensure_future(self._reopen())
            # A caller cancelled while waiting must not leave the failure unretrieved.
            self._connecting.add_done_callback(
                lambda attempt: attempt.cancelled() or attempt.exception()
            )
        # shield: a cancelled caller must not cancel an attempt other callers are waiting for.
        return await asyncio.shield(self._connecting)

    async def _reopen(self) -> _Connection:
        await self._drop("the NATS connection was lost")
        return await self._open()

    async def _open(self) -> _Connection:
        settings = self.settings
        client = _Client()
        conn = _Connection(client, settings.max_pending)

        seen: list[Exception] = []

        async def on_error(exc: Exception) -> None:
            seen.append(exc)
            log.debug("NATS client error at %s: %r", settings.describe(), exc)

        async def on_disconnect() -> None:
            conn.fail_all("the NATS connection was lost")

        options: dict[str, Any] = {
            "servers": list(settings.servers),
            "name": settings.name,
            "connect_timeout": settings.connect_timeout,
            # One attempt per server from us; nats-py's minimum is two back-to-back tries, and
            # after a drop it makes the same two at once. Longer outages are paced by the
            # relay's backoff: each publish() makes one fresh attempt.
            "allow_reconnect": True,
            "max_reconnect_attempts": 1,
            "reconnect_time_wait": 0,
            # A forced flush (pending buffer full) on a dead socket must not hang a call.
            "flush_timeout": settings.ack_timeout,
            "error_cb": on_error,
            "disconnected_cb": on_disconnect,
            "closed_cb": on_disconnect,
            "dont_randomize": False,
        }
        if self._tls is not None:
            options["tls"] = self._tls
        if settings.token is not None:
            options["token"] = settings.token
        if settings.user is not None:
            options["user"] = settings.user
            options["password"] = settings.password
        # nats-py makes up to two tries per server, each bounded by connect_timeout; the overall
        # bound is ours because after a failed TLS handshake nats-py waits forever for the
        # broken transport to close (nats-io/nats.py#718).
        budget = settings.connect_timeout * (2 * len(settings.servers) + 1)
        try:
            async with asyncio.timeout(budget):
                await client.connect(**options)
            await client.subscribe(conn.inbox + "*")  # delivered to conn.on_reply
        except asyncio.CancelledError:  # the publisher is being closed
            await self._close_client(client)
            raise
        except Exception as exc:  # noqa: BLE001 - every connect failure means broker-down
            # nats-py ends with NoServersError; the reason is the error before it.
            cause = seen[-1] if seen else exc
            await self._close_client(client)
            detail = str(cause) or type(cause).__name__
            raise BrokerUnavailable(
                f"cannot connect to NATS at {settings.describe()}: {detail}"
            ) from None
        self._connection = conn
        return conn

    async def _refuse_unacknowledging_streams(
        self, conn: _Connection, batch: _Batch, unanswered: dict[int, str]
    ) -> None:
        """Messages left without a PubAck on a live connection whose stream was created with
        ``no_ack``: JetStream stores them and never answers, so no retry can ever confirm
        them. Without this each batch holding one was an outage for the whole relay, forever
        (a probe)."""
        timeout = max(1.0, self.settings.connect_timeout)
        js = conn.client.jetstream(timeout=timeout)
        verdicts: dict[str, str] = {}
        # One bound for all the look-ups: a slow server must not hold the call much longer.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                for subject in set(unanswered.values()):
                    try:
                        name = await js.find_stream_name_by_subject(subject)
                        info = await js.stream_info(name)
                    except (TimeoutError, asyncio.CancelledError):
                        raise
                    except Exception:  # noqa: BLE001 - unknown: it stays an outage
                        continue
                    if info.config.no_ack:
                        verdicts[subject] = name
        for index, subject in unanswered.items():
            silent = verdicts.get(subject)
            if silent is not None:
                batch.results[index] = PermanentPublishError(
                    f"JetStream stream {silent!r}, which captures subject {subject!r}, has no_ack "
                    "set: it never acknowledges what it stores, so no publish to it can be "
                    "confirmed; turn no_ack off (nats stream edit), then replay the dead letters"
                )

    async def _probe(self, conn: _Connection) -> None:
        """After a PubAck timeout: keep the connection only if the server still answers a PING."""
        try:
            await conn.client.flush(timeout=max(1, int(self.settings.connect_timeout)))
        except Exception:  # noqa: BLE001 - whatever the reason, the connection is not usable
            if self._connection is conn:
                await self._drop("the NATS connection stopped answering")

    async def _drop(self, reason: str) -> None:
        conn, self._connection = self._connection, None
        if conn is None:
            return
        conn.fail_all(reason)
        await self._close_client(conn.client)

    async def _close_client(self, client: Client) -> None:
        # Bounded: closing flushes buffered data, which can stall on a dead socket, and waits
        # for a transport that a failed TLS handshake never lets close (nats-io/nats.py#718).
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.settings.connect_timeout):
                await client.close()
