"""RabbitMQ (AMQP 0-9-1) wire format: the message's properties, encoded and decoded.

The fields are listed in :mod:`outboxer.brokers.rabbitmq.publisher` (``message_id`` = the
message id, ``type``, ``timestamp`` in whole seconds, ``content_type``, persistent delivery,
user headers plus ``x-outbox-key`` = the key; routing key = topic).

AMQP has no stable position for a message, so one not written by outboxer (no
``message_id``) gets a random id and cannot be deduplicated.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any

import pika  # type: ignore[import-untyped]

from outboxer.message import OCTET_STREAM, Message

__all__ = ["KEY_HEADER", "decode", "properties"]

#: The header that carries the message key (AMQP has no key field of its own).
KEY_HEADER = "x-outbox-key"

_PERSISTENT = 2


def properties(message: Message) -> Any:
    """The ``pika.BasicProperties`` of ``message`` (the routing key is its topic)."""
    headers = dict(message.headers)
    if message.key is not None:
        headers[KEY_HEADER] = message.key
    return pika.BasicProperties(
        content_type=message.content_type,
        headers=headers,
        delivery_mode=_PERSISTENT,
        message_id=message.id,
        timestamp=int(message.created_at.timestamp()),
        type=message.type,
    )


def decode(
    *,
    routing_key: str,
    body: bytes,
    message_id: str | None,
    type: str | None,  # noqa: A002 - the AMQP property's name
    timestamp: int | None,
    content_type: str | None,
    headers: Mapping[str, Any] | None,
) -> Message:
    """An AMQP message as a message; never fails."""
    user: dict[str, str] = {}
    key: str | None = None
    for name, raw in (headers or {}).items():
        if isinstance(raw, bytes):
            text: str | None = raw.decode(errors="replace")
        else:
            text = raw if isinstance(raw, str) or raw is None else str(raw)
        if name == KEY_HEADER:
            key = text
        elif text is not None:
            user[name] = text
    created = dt.datetime.fromtimestamp(timestamp, dt.UTC) if timestamp else dt.datetime.now(dt.UTC)
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
