"""Kafka wire format: CloudEvents 1.0, Kafka protocol binding, binary content mode.

Encoding (the publisher) and decoding (the consumer) side by side, on plain values, so the
round trip is tested without a broker. See :mod:`outboxer.brokers.kafka.publisher` for the
table of headers.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence

from outboxer.brokers.cloudevents import (
    CONTENT_TYPE,
    KAFKA,
    SPECVERSION,
    format_time,
    moment_from_epoch,
    parse_time,
)
from outboxer.message import OCTET_STREAM, Message

__all__ = ["RESERVED_HEADERS", "Header", "decode", "header_encoder"]

Header = tuple[str, str | bytes | None]

#: Headers the publisher writes itself; user headers with these names are not sent, and the
#: consumer does not hand them to handlers as user headers. Other ``ce_*`` headers (e.g.
#: ``ce_subject``) pass through as CloudEvents extensions.
RESERVED_HEADERS = frozenset(
    {KAFKA.id, KAFKA.type, KAFKA.source, KAFKA.specversion, KAFKA.time, CONTENT_TYPE}
)


def header_encoder(source: str) -> Callable[[Message], list[Header]]:
    """The function building each record's headers (``source`` is the ``ce_source``).

    The header tuples that are the same for every record are built once, here.
    """
    source_header = (KAFKA.source, source)
    spec_header = (KAFKA.specversion, SPECVERSION)
    ce_id, ce_time, ce_type = KAFKA.id, KAFKA.time, KAFKA.type
    reserved = RESERVED_HEADERS

    def encode(message: Message) -> list[Header]:
        headers: list[Header] = [
            (ce_id, message.id),
            source_header,
            spec_header,
            (ce_time, format_time(message.created_at)),
            (CONTENT_TYPE, message.content_type),
        ]
        if message.type is not None:
            headers.append((ce_type, message.type))
        if message.headers:
            headers.extend(
                (name, value) for name, value in message.headers.items() if name not in reserved
            )
        return headers

    return encode


def _text(value: bytes | str | None) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value


def decode(
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | str | None,
    value: bytes | None,
    headers: Sequence[Header] | None,
    timestamp_ms: int | None = None,
) -> Message:
    """A Kafka record as a message; never fails.

    A record not written by outboxer (no ``ce_id``) gets the id ``kafka:topic:partition:offset``,
    stable across redeliveries; without ``ce_time`` the record timestamp stands in.
    """
    own: dict[str, str] = {}
    user: dict[str, str] = {}
    for name, raw in headers or ():
        text = _text(raw)
        if text is None:
            continue
        (own if name in RESERVED_HEADERS else user)[name] = text
    created = parse_time(own.get(KAFKA.time))
    if created is None and timestamp_ms:  # any producer may set any CreateTime
        created = moment_from_epoch(timestamp_ms / 1000)
    return Message(
        id=own.get(KAFKA.id) or f"kafka:{topic}:{partition}:{offset}",
        topic=topic,
        payload=value or b"",
        key=_text(key),
        type=own.get(KAFKA.type),
        headers=user,
        content_type=own.get(CONTENT_TYPE, OCTET_STREAM),
        created_at=created or dt.datetime.now(dt.UTC),
    )
