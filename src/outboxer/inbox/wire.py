"""Decoding what the publishers put on the wire back into :class:`~outboxer.message.Message`.

Each function is the inverse of one publisher's wire format (see the module docstrings of
``outboxer.publishers.kafka``, ``.rabbitmq``, ``.nats`` and ``.redis``) and takes plain values,
so this module needs no broker client and the consumer adapters stay thin. Decoding never
fails: a message that was not written by outboxer (no id header/field) gets an id derived from
its position in the broker where the broker has a stable one (Kafka topic/partition/offset,
NATS stream sequence, Redis entry id), so redeliveries of it are still recognized; RabbitMQ has
no such position, so a message without ``message_id`` gets a random id and cannot be
deduplicated.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from outboxer.message import OCTET_STREAM, Message

__all__ = [
    "AMQP_KEY_HEADER",
    "from_amqp",
    "from_kafka",
    "from_nats",
    "from_redis",
]

#: The AMQP header carrying the message key (``outboxer.publishers.rabbitmq.KEY_HEADER``).
AMQP_KEY_HEADER = "x-outbox-key"

#: Kafka headers the publisher writes itself (CloudEvents binary mode); the rest are user headers.
_KAFKA_OWN = frozenset(
    {"ce_id", "ce_type", "ce_source", "ce_specversion", "ce_time", "content-type"}
)
#: NATS headers the publisher writes itself; the rest are user headers.
_NATS_OWN = frozenset(
    {
        "Nats-Msg-Id",
        "ce-specversion",
        "ce-id",
        "ce-source",
        "ce-type",
        "ce-time",
        "ce-partitionkey",
        "content-type",
    }
)


def _text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value


def _time(text: str | None) -> dt.datetime | None:
    """RFC 3339 (``2025-01-31T12:00:00.123456Z``) as the publishers write ``ce-time``."""
    if not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def from_kafka(
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | str | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | str | None]] | None,
    timestamp_ms: int | None = None,
) -> Message:
    """A Kafka record (CloudEvents binary headers ``ce_id``, ``ce_type``, ``ce_time``,
    ``content-type``, then the user headers; key = message key)."""
    own: dict[str, str] = {}
    user: dict[str, str] = {}
    for name, raw in headers or ():
        text = _text(raw)
        if text is None:
            continue
        (own if name in _KAFKA_OWN else user)[name] = text
    created = _time(own.get("ce_time"))
    if created is None and timestamp_ms:
        created = dt.datetime.fromtimestamp(timestamp_ms / 1000, dt.UTC)
    return Message(
        id=own.get("ce_id") or f"kafka:{topic}:{partition}:{offset}",
        topic=topic,
        payload=value or b"",
        key=_text(key),
        type=own.get("ce_type"),
        headers=user,
        content_type=own.get("content-type", OCTET_STREAM),
        created_at=created or _now(),
    )


def from_amqp(
    *,
    routing_key: str,
    body: bytes,
    message_id: str | None,
    type: str | None,  # noqa: A002 - the AMQP property's name
    timestamp: int | None,
    content_type: str | None,
    headers: Mapping[str, Any] | None,
) -> Message:
    """An AMQP message (``message_id``, ``type``, ``timestamp``, ``content_type`` properties;
    key in the ``x-outbox-key`` header; routing key = topic)."""
    user: dict[str, str] = {}
    key: str | None = None
    for name, raw in (headers or {}).items():
        text = _text(raw) if isinstance(raw, bytes | str) else str(raw)
        if name == AMQP_KEY_HEADER:
            key = text
        elif text is not None:
            user[name] = text
    created = dt.datetime.fromtimestamp(timestamp, dt.UTC) if timestamp else _now()
    return Message(
        id=message_id or f"amqp:{uuid.uuid4()}",
        topic=routing_key,
        payload=body,
        key=key,
        type=type or None,
        headers=user,
        content_type=content_type or OCTET_STREAM,
        created_at=created,
    )


def from_nats(
    *,
    subject: str,
    data: bytes,
    headers: Mapping[str, str] | None,
    stream: str | None = None,
    sequence: int | None = None,
) -> Message:
    """A JetStream message (``Nats-Msg-Id``/``ce-id``, ``ce-type``, ``ce-time``,
    ``ce-partitionkey``, ``content-type`` headers; subject = topic)."""
    headers = headers or {}
    message_id = headers.get("ce-id") or headers.get("Nats-Msg-Id")
    if not message_id:
        message_id = f"nats:{stream}:{sequence}" if sequence is not None else str(uuid.uuid4())
    return Message(
        id=message_id,
        topic=subject,
        payload=data,
        key=headers.get("ce-partitionkey"),
        type=headers.get("ce-type"),
        headers={k: v for k, v in headers.items() if k not in _NATS_OWN},
        content_type=headers.get("content-type", OCTET_STREAM),
        created_at=_time(headers.get("ce-time")) or _now(),
    )


def from_redis(*, stream: str, entry_id: str, fields: Mapping[bytes | str, bytes | str]) -> Message:
    """A stream entry (fields ``id``, ``type``, ``key``, ``payload``, ``headers`` (JSON),
    ``content_type``; stream = topic). The entry id's milliseconds stand in for the creation
    time, which the Redis format does not carry."""
    values = {(_text(k) or ""): v for k, v in fields.items()}
    raw_payload = values.get("payload", b"")
    payload = raw_payload if isinstance(raw_payload, bytes) else raw_payload.encode()
    headers: dict[str, str] = {}
    raw_headers = _text(values.get("headers"))
    if raw_headers:
        try:
            decoded = json.loads(raw_headers)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            headers = {str(k): str(v) for k, v in decoded.items()}
    millis = entry_id.partition("-")[0]
    created = dt.datetime.fromtimestamp(int(millis) / 1000, dt.UTC) if millis.isdigit() else None
    return Message(
        id=_text(values.get("id")) or f"redis:{stream}:{entry_id}",
        topic=stream,
        payload=payload,
        key=_text(values.get("key")),
        type=_text(values.get("type")),
        headers=headers,
        content_type=_text(values.get("content_type")) or OCTET_STREAM,
        created_at=created or _now(),
    )
