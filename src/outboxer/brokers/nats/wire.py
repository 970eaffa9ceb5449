"""NATS JetStream wire format: CloudEvents headers (HTTP binding names), encoded and decoded.

See :mod:`outboxer.brokers.nats.publisher` for the table of headers. A message not written by
outboxer (no ``ce-id`` nor ``Nats-Msg-Id``) gets the id ``nats:stream:sequence``, stable across
redeliveries.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping

from outboxer.brokers.cloudevents import (
    CONTENT_TYPE,
    HEADERS,
    SPECVERSION,
    format_time,
    parse_time,
)
from outboxer.message import OCTET_STREAM, Message

__all__ = ["MSG_ID", "RESERVED_HEADERS", "decode", "headers"]

#: JetStream's deduplication header.
MSG_ID = "Nats-Msg-Id"
#: Headers the publisher writes itself; the rest are user headers.
RESERVED_HEADERS = (HEADERS.names - {HEADERS.topic}) | {MSG_ID}


def headers(message: Message, source: str) -> dict[str, str]:
    """The NATS headers of ``message``: its user headers, then the CloudEvents attributes
    (which replace a user header of the same name)."""
    encoded = dict(message.headers) if message.headers else {}
    encoded[MSG_ID] = message.id
    encoded[HEADERS.specversion] = SPECVERSION
    encoded[HEADERS.id] = message.id
    encoded[HEADERS.source] = source
    if message.type is not None:
        encoded[HEADERS.type] = message.type
    encoded[HEADERS.time] = format_time(message.created_at)
    if message.key is not None:
        encoded[HEADERS.partitionkey] = message.key
    encoded[CONTENT_TYPE] = message.content_type
    return encoded


def decode(
    *,
    subject: str,
    data: bytes,
    headers: Mapping[str, str] | None,
    stream: str | None = None,
    sequence: int | None = None,
) -> Message:
    """A JetStream message as a message; never fails."""
    headers = headers or {}
    message_id = headers.get(HEADERS.id) or headers.get(MSG_ID)
    if not message_id:
        message_id = f"nats:{stream}:{sequence}" if sequence is not None else str(uuid.uuid4())
    return Message(
        id=message_id,
        topic=subject,
        payload=data,
        key=headers.get(HEADERS.partitionkey),
        type=headers.get(HEADERS.type),
        headers={k: v for k, v in headers.items() if k not in RESERVED_HEADERS},
        content_type=headers.get(CONTENT_TYPE, OCTET_STREAM),
        created_at=parse_time(headers.get(HEADERS.time)) or dt.datetime.now(dt.UTC),
    )
