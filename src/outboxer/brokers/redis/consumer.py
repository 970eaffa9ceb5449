"""Redis Streams consumer: a consumer group per inbox consumer, XACK after the inbox commit,
stale pending entries reclaimed with XAUTOCLAIM.

The group is named after the consumer and created on first use at the start of each stream
(``XGROUP CREATE <stream> <group> 0 MKSTREAM``: entries written before the first start are
delivered too). Every process joins it under a unique member name (``host-pid-random``) and
reads new entries with ``XREADGROUP ... >`` (the next batch while the inbox stores the previous
one); after the inbox committed the batch, one ``XACK`` per stream acknowledges it. Entries a
member read but never acknowledged (it was killed, or stopped during a database outage) stay
pending; every member periodically takes over those idle for longer than ``claim_idle`` with
``XAUTOCLAIM`` and processes them (the inbox drops the ones already handled). A starting member
reads no new entry before the entries pending at its start are taken over (after ``claim_idle``)
or acknowledged by their live reader: a restart after a crash keeps each key's order, at the
price of waiting up to ``claim_idle`` for what the dead member left. After a lost connection a
member first reads again what it was given and never acknowledged (a read whose reply was lost
leaves its entries pending with it), then new entries. Members that left
nothing pending and have been idle for an hour are removed from the group, so restarts do not
pile up dead member names.

Entries are decoded from the publisher's wire format (fields ``id``, ``type``, ``key``,
``payload``, ``headers``, ``content_type``) by :func:`.wire.decode`.

URL: the publisher's ``redis://`` URL (host, db, credentials, TLS, timeouts) plus these
consumer options, all optional:

==============  =======  ====================================================================
option          default  meaning
==============  =======  ====================================================================
``claim_idle``  ``30``   seconds an entry must be pending (unacknowledged) before another
                         member reclaims it; must exceed the time a batch takes
``block``       ``1``    seconds one ``XREADGROUP`` waits for new entries (the longest
                         delay before a stop is noticed); below the URL's ``socket_timeout``
==============  =======  ====================================================================

XAUTOCLAIM needs Redis 6.2 or later.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from outboxer.brokers.redis.settings import RedisConsumerSettings
from outboxer.brokers.redis.wire import decode
from outboxer.errors import ConfigurationError
from outboxer.inbox.consumer import Deliver, Deliveries, opened
from outboxer.message import Message

__all__ = ["RedisConsumer"]

log = logging.getLogger("outboxer.consumer.redis")

#: Members idle this long with nothing pending are removed from the group.
_FORGET_IDLE_MS = 3_600_000
#: How often a starting member looks whether the entries left pending are taken over.
_PENDING_POLL = 0.2
#: Pending entries read per look (more of this member's own: looked at again).
_PENDING_SCAN = 1000


class RedisConsumer:
    """Reads a consumer group's entries, acknowledges after delivery, reclaims stale ones."""

    def __init__(self, settings: RedisConsumerSettings) -> None:
        self.settings = settings
        self.member = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._client: Redis | None = None
        self._groups_ready = False

    def __repr__(self) -> str:
        url, group = self.settings.connection.safe_url(), self.settings.group
        return f"RedisConsumer({url}, group={group!r}, member={self.member!r})"

    async def __aenter__(self) -> RedisConsumer:
        settings = self.settings.connection
        # No retries inside redis-py: a XREADGROUP retried after a lost reply would read past
        # the entries that reply held (pending with this member); the loop below re-reads them.
        self._client = Redis(
            **settings.connection_arguments(), ssl=settings.tls, retry=Retry(NoBackoff(), 0)
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        with contextlib.suppress(RedisError, OSError):
            # Leave the group if nothing of ours is pending (else others reclaim it later).
            for stream in self.settings.topics:
                pending = await client.xpending_range(
                    stream, self.settings.group, "-", "+", 1, consumername=self.member
                )
                if not pending:
                    await client.xgroup_delconsumer(stream, self.settings.group, self.member)
        await client.aclose()

    async def _create_groups(self, client: Redis) -> None:
        for stream in self.settings.topics:
            try:
                await client.xgroup_create(stream, self.settings.group, id="0", mkstream=True)
                log.info("created consumer group %r on stream %r", self.settings.group, stream)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._groups_ready = True
        log.info(
            "consuming streams %s as member %r of group %r on %s",
            ", ".join(self.settings.topics),
            self.member,
            self.settings.group,
            self.settings.connection.safe_url(),
        )

    async def run(self, deliver: Deliver, stop: asyncio.Event) -> None:
        client = opened(self._client, self)
        async with Deliveries(deliver) as deliveries:
            await self._consume(client, deliveries, stop)

    async def _consume(self, client: Redis, deliveries: Deliveries, stop: asyncio.Event) -> None:
        """Read (and reclaim) until ``stop``, or until delivery was stopped."""
        failures = 0
        next_claim = 0.0
        claim_every = min(max(self.settings.claim_idle / 2, 0.2), 30.0)
        #: Per stream, the newest entry pending when this member started (see _left_pending).
        left: dict[str, str] | None = None
        while not stop.is_set():
            try:
                if not self._groups_ready:
                    await self._create_groups(client)
                if left is None:
                    left = await self._pending_at_start(client)
                if time.monotonic() >= next_claim or left:
                    # What was left pending is taken over in entry order: XAUTOCLAIM takes
                    # entries by idle time, and an older entry whose idle time was reset (its
                    # reader had reclaimed it) would come after a newer one of its key.
                    taken_in_order = not left or await self._left_all_idle(client, left)
                    if taken_in_order and not await self._reclaim(client, deliveries, stop):
                        return
                    next_claim = time.monotonic() + claim_every
                if left:
                    left = await self._left_pending(client, left)
                    if left:
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(_PENDING_POLL):
                                await stop.wait()
                        continue
                if failures and not await self._read_own_pending(client, deliveries):
                    return
                if not await self._read(client, deliveries):
                    return
                failures = 0
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                # A read whose reply was lost left its entries pending with this member: they
                # are read again (from this member's history) before anything new.
                failures += 1
                delay = self.settings.reconnect.delay(failures)
                log.warning(
                    "Redis at %s unavailable (%s); retrying in %.0f s",
                    self.settings.connection.safe_url(),
                    exc,
                    delay,
                )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await stop.wait()
                # Pooled connections of before the failure may be dead too: start afresh.
                with contextlib.suppress(RedisError, OSError):
                    await client.connection_pool.disconnect(inuse_connections=False)
            except ResponseError as exc:
                if str(exc).startswith("WRONGTYPE"):
                    # A key of a topic holds another type (at start, or replaced meanwhile):
                    # nothing can be read from it until an operator acts; say which one.
                    raise await self._not_a_stream(client, exc) from None
                if isinstance(exc, NoPermissionError):
                    user = self.settings.connection.username or "default"
                    raise ConfigurationError(
                        f"Redis user {user!r} may not use the streams "
                        f"{', '.join(map(repr, self.settings.topics))} as a consumer needs "
                        "(XGROUP, XREADGROUP, XACK, XPENDING, XAUTOCLAIM, XINFO on their keys): "
                        f"grant them in its ACL (redis said: NOPERM {exc})"
                    ) from None
                # NOGROUP: the group (or the stream) is gone; a read blocked on the stream when
                # it was deleted is answered "UNBLOCKED the stream key no longer exists" instead.
                if not str(exc).startswith(("NOGROUP", "UNBLOCKED")):
                    raise
                log.warning("consumer group missing (stream deleted?): creating it again (%s)", exc)
                self._groups_ready = False

    async def _not_a_stream(self, client: Redis, exc: ResponseError) -> ConfigurationError:
        """The error naming the topics whose Redis keys hold something else than a stream."""
        found: list[str] = []
        with contextlib.suppress(RedisError, OSError):
            for stream in self.settings.topics:
                kind = _text(await client.type(stream))
                if kind not in ("stream", "none"):
                    found.append(f"{stream!r} holds a {kind}")
        what = "; ".join(found) or f"one of {', '.join(map(repr, self.settings.topics))} does"
        return ConfigurationError(
            f"Redis key {what}, not a stream: consume another topic, or delete or rename that "
            f"key (redis said: {exc})"
        )

    async def _pending_at_start(self, client: Redis) -> dict[str, str]:
        """Per stream, the newest entry other members had read but not acknowledged when this
        one started (a member killed, or still storing a batch)."""
        newest: dict[str, str] = {}
        for stream in self.settings.topics:
            summary: Any = await client.xpending(stream, self.settings.group)
            if summary and int(summary.get("pending") or 0):
                newest[stream] = _text(summary["max"])
        if newest:
            log.info(
                "entries left pending by other members (%s): taken over or acknowledged before "
                "any new entry is read, so that each key keeps its order",
                ", ".join(f"{s} up to {i}" for s, i in newest.items()),
            )
        return newest

    async def _left_pending(self, client: Redis, newest: dict[str, str]) -> dict[str, str]:
        """Those of ``newest`` whose streams still have an entry up to it pending with another
        member. Read before new entries: a member restarted after a crash read the new entries
        of a key at once and handled them before the dead member's pending ones, which it
        reclaimed only ``claim_idle`` later (a probe: per-key order broken after one kill -9).
        They are reclaimed after ``claim_idle`` (or acknowledged by their live reader)."""
        left = {}
        for stream, last in newest.items():
            pending: Any = await client.xpending_range(
                stream, self.settings.group, min="-", max=last, count=_PENDING_SCAN
            )
            owners = {_text(entry["consumer"]) for entry in pending}
            if owners - {self.member} or len(pending) == _PENDING_SCAN:
                left[stream] = last
        return left

    async def _left_all_idle(self, client: Redis, newest: dict[str, str]) -> bool:
        """Whether every entry other members left pending up to ``newest`` has been idle for
        ``claim_idle``, so that one pass of XAUTOCLAIM takes them all, in entry order."""
        idle_ms = int(self.settings.claim_idle * 1000)
        for stream, last in newest.items():
            pending: Any = await client.xpending_range(
                stream, self.settings.group, min="-", max=last, count=_PENDING_SCAN
            )
            for entry in pending:
                if (
                    _text(entry["consumer"]) != self.member
                    and int(entry["time_since_delivered"]) < idle_ms
                ):
                    return False
        return True

    async def _read(self, client: Redis, deliveries: Deliveries) -> bool:
        """One XREADGROUP of new entries; False when delivery was stopped (nothing acked)."""
        response: Any = await client.xreadgroup(
            self.settings.group,
            self.member,
            dict.fromkeys(self.settings.topics, ">"),
            count=self.settings.batch_size,
            block=max(1, int(self.settings.block * 1000)),
        )
        entries: list[tuple[str, str, Any]] = []
        # RESP2 reply: [[stream, [(entry id, {field: value}), ...]], ...]
        for stream, items in response or []:
            name = stream.decode() if isinstance(stream, bytes) else str(stream)
            entries.extend((name, _text(entry_id), fields) for entry_id, fields in items)
        return await self._deliver(client, deliveries, entries)

    async def _read_own_pending(self, client: Redis, deliveries: Deliveries) -> bool:
        """After a lost connection, deliver what this member was given and never acknowledged
        (``XREADGROUP ... 0``), oldest first, before any new entry: a ``XREADGROUP`` whose
        reply was lost (a cut or a timeout while it blocked) left entries pending with this
        live member, and reading on with ``>`` handled the next entries of their keys first,
        the lost ones only when reclaimed ``claim_idle`` later (a probe: ``[m0, m2, m1]``).
        The inbox drops those that were handled. False when delivery was stopped."""
        after: dict[Any, Any] = dict.fromkeys(self.settings.topics, "0")
        while after:
            response: Any = await client.xreadgroup(
                self.settings.group, self.member, after, count=self.settings.batch_size
            )
            entries: list[tuple[str, str, Any]] = []
            gone: list[tuple[str, str, Any]] = []
            for stream, items in response or []:
                name = _text(stream)
                if not items:
                    after.pop(name, None)
                    continue
                after[name] = _text(items[-1][0])
                for entry_id, fields in items:
                    (entries if fields else gone).append((name, _text(entry_id), fields))
            if not response:
                break
            if gone:  # deleted from the stream while pending: nothing left to deliver
                log.warning(
                    "%d entries this member had read were deleted from the stream before it "
                    "acknowledged them: they may never have been handled (%s)",
                    len(gone),
                    ", ".join(f"{stream} {entry_id}" for stream, entry_id, _ in gone[:5]),
                )
                await self._ack(client, gone)
            if not await self._deliver(client, deliveries, entries):
                return False
        return True

    async def _reclaim(self, client: Redis, deliveries: Deliveries, stop: asyncio.Event) -> bool:
        """Take over entries pending longer than ``claim_idle`` (their reader died); process
        them like new ones. False when delivery was stopped."""
        idle_ms = int(self.settings.claim_idle * 1000)
        for stream in self.settings.topics:
            cursor = "0-0"
            while not stop.is_set():
                reply = await client.xautoclaim(
                    stream,
                    self.settings.group,
                    self.member,
                    min_idle_time=idle_ms,
                    start_id=cursor,
                    count=self.settings.batch_size,
                )
                cursor = _text(reply[0])
                # Entries deleted from the stream meanwhile come back without fields (Redis 6)
                # or only in the reply's third part (Redis 7): nothing is left to deliver, but
                # their reader never acknowledged them, so they may never have been handled.
                claimed = [(stream, _text(i), f) for i, f in reply[1] if f is not None]
                deleted = [_text(i) for i, f in reply[1] if f is None]
                if len(reply) > 2:
                    deleted.extend(_text(i) for i in reply[2] or ())
                if deleted:
                    log.warning(
                        "%d entries of stream %r were deleted from the stream (trimmed by "
                        "MAXLEN/XTRIM, or XDEL) while pending, before their reader acknowledged "
                        "them: they may never have been handled and cannot be delivered again "
                        "(%s); keep streams long enough for the slowest consumer",
                        len(deleted),
                        stream,
                        ", ".join(deleted[:5]) + (", ..." if len(deleted) > 5 else ""),
                    )
                if claimed:
                    log.warning(
                        "reclaimed %d unacknowledged entries of stream %r idle for over %g s",
                        len(claimed),
                        stream,
                        self.settings.claim_idle,
                    )
                if not await self._deliver(client, deliveries, claimed):
                    return False
                if cursor == "0-0":
                    break
            await self._forget_idle_members(client, stream)
        return True

    async def _deliver(
        self, client: Redis, deliveries: Deliveries, entries: list[tuple[str, str, Any]]
    ) -> bool:
        if not entries:
            return True
        messages: list[Message] = [
            decode(stream=stream, entry_id=entry_id, fields=fields)
            for stream, entry_id, fields in entries
        ]
        # False: not stored, still pending, reclaimed by a member later
        return await deliveries.submit(messages, functools.partial(self._ack, client, entries))

    async def _ack(self, client: Redis, entries: list[tuple[str, str, Any]]) -> None:
        by_stream: dict[str, list[str]] = {}
        for stream, entry_id, _ in entries:
            by_stream.setdefault(stream, []).append(entry_id)
        try:
            async with client.pipeline(transaction=False) as pipe:
                for stream, ids in by_stream.items():
                    pipe.xack(stream, self.settings.group, *ids)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            log.warning(
                "could not acknowledge %d entries (%s): they are reclaimed later and the inbox "
                "drops them",
                len(entries),
                exc,
            )

    async def _forget_idle_members(self, client: Redis, stream: str) -> None:
        try:
            members = await client.xinfo_consumers(stream, self.settings.group)
        except ResponseError:
            return
        for member in members:
            name = _text(member.get("name"))
            if (
                name != self.member
                and int(member.get("pending", 0)) == 0
                and int(member.get("idle", 0)) > _FORGET_IDLE_MS
            ):
                await client.xgroup_delconsumer(stream, self.settings.group, name)


def _text(value: bytes | str | Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
