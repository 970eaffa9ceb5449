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

__all__ = ["MSG_ID", "RESERVED_HEADERS", "decode", "header_block", "headers"]

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


def header_block(message: Message, source: str) -> bytes:
    """The NATS header block of ``message`` as it goes on the wire (``HPUB``'s header part).

    ``NATS/1.0``, one ``name: value`` line per entry of :func:`headers`, then an empty line.
    Values are trimmed and CR/LF become spaces, as nats-py does, so that no value can end its
    line early or inject a protocol command. Names are not checked here: the CloudEvents names
    are valid tokens, and the publisher refuses a message with an invalid user header name.

    Raises:
        UnicodeEncodeError: a value is not encodable as UTF-8 (a lone surrogate).
    """
    lines = ["NATS/1.0\r\n"]
    for name, value in headers(message, source).items():
        value = value.strip()
        if "\r" in value or "\n" in value:
            value = value.replace("\r", " ").replace("\n", " ")
        lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode()


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
