"""RabbitMQ (AMQP 0-9-1) wire format: the message's properties, encoded and decoded.

The fields are listed in :mod:`outboxer.brokers.rabbitmq.publisher` (``message_id`` = the
message id, ``type``, ``timestamp`` in whole seconds, ``content_type``, persistent delivery,
user headers plus ``x-outbox-key`` = the key; routing key = topic).

AMQP has no stable position for a message, so one not written by outboxer (no
``message_id``) gets a random id and cannot be deduplicated.
"""

from __future__ import annotations

import datetime as dt
import struct
import uuid
from collections.abc import Mapping
from typing import Any

import pika.data  # type: ignore[import-untyped]
import pika.exceptions  # type: ignore[import-untyped]
from pika.spec import BasicProperties  # type: ignore[import-untyped]

from outboxer.brokers.cloudevents import moment_from_epoch
from outboxer.message import OCTET_STREAM, Message

__all__ = ["KEY_HEADER", "decode", "encode_properties"]

#: The header that carries the message key (AMQP has no key field of its own).
KEY_HEADER = "x-outbox-key"

_PERSISTENT = 2
# Properties every message has; ``type`` is added when the message has one.
_FLAGS = (
    BasicProperties.FLAG_CONTENT_TYPE
    | BasicProperties.FLAG_HEADERS
    | BasicProperties.FLAG_DELIVERY_MODE
    | BasicProperties.FLAG_MESSAGE_ID
    | BasicProperties.FLAG_TIMESTAMP
)
_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_FLAGS_AND_CONTENT_TYPE = struct.Struct(">HB")  # property flags, content type's length
_MODE_AND_ID = struct.Struct(">BB")  # delivery mode, message id's length
_TIMESTAMP = struct.Struct(">Q")


def _short(text: str) -> bytes:
    encoded = text.encode()
    if len(encoded) > 255:
        raise pika.exceptions.ShortStringTooLong(encoded)
    return encoded


def encode_properties(message: Message) -> bytes:
    """The AMQP basic properties of ``message``, encoded for its content header frame.

    The same bytes as ``pika.BasicProperties(content_type=..., headers=..., delivery_mode=2,
    message_id=..., timestamp=..., type=...).encode()`` (a unit test compares them), built
    without pika's per-property objects, which cost the publisher more CPU than the rest of a
    message. ``headers`` are the user headers plus :data:`KEY_HEADER` when the message has a
    key; string values are AMQP long strings (``S``), anything else is left to pika's encoder.

    Raises:
        pika.exceptions.ShortStringTooLong: a short string is over 255 bytes.
        UnicodeEncodeError: a string is not valid UTF-8 (a lone surrogate).
    """
    headers = dict(message.headers)
    if message.key is not None:
        headers[KEY_HEADER] = message.key
    table: list[bytes] = []
    for name, value in headers.items():
        encoded_name = _short(name)
        table.append(_U8.pack(len(encoded_name)))
        table.append(encoded_name)
        if isinstance(value, str):
            encoded = value.encode()
            table.append(b"S" + _U32.pack(len(encoded)))
            table.append(encoded)
        else:
            pika.data.encode_value(table, value)
    fields = b"".join(table)
    content_type = _short(message.content_type)
    message_id = _short(message.id)
    flags = _FLAGS if message.type is None else _FLAGS | BasicProperties.FLAG_TYPE
    parts = [
        _FLAGS_AND_CONTENT_TYPE.pack(flags, len(content_type)),
        content_type,
        _U32.pack(len(fields)),
        fields,
        _MODE_AND_ID.pack(_PERSISTENT, len(message_id)),
        message_id,
        _TIMESTAMP.pack(int(message.created_at.timestamp())),
    ]
    if message.type is not None:
        type_ = _short(message.type)
        parts.append(_U8.pack(len(type_)))
        parts.append(type_)
    return b"".join(parts)


def _text(value: object) -> str | None:
    """A property or header value as text: pika leaves a string that is not UTF-8 as bytes."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) or value is None else str(value)


def decode(
    *,
    routing_key: str | bytes,
    body: bytes,
    message_id: str | bytes | None,
    type: str | bytes | None,  # noqa: A002 - the AMQP property's name
    timestamp: int | None,
    content_type: str | bytes | None,
    headers: Mapping[str | bytes, Any] | None,
) -> Message:
    """An AMQP message as a message; never fails."""
    user: dict[str, str] = {}
    key: str | None = None
    for name, raw in (headers or {}).items():
        text = _text(raw)
        if name == KEY_HEADER:
            key = text
        elif text is not None:
            user[_text(name) or ""] = text
    created = (timestamp and moment_from_epoch(timestamp)) or dt.datetime.now(dt.UTC)
    return Message(
        id=_text(message_id) or f"amqp:{uuid.uuid4()}",
        topic=_text(routing_key) or "",
        payload=body,
        key=key,
        type=_text(type) or None,
        headers=user,
        content_type=_text(content_type) or OCTET_STREAM,
        created_at=created,
    )
