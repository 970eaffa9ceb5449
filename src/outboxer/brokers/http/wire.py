"""HTTP webhook wire format: CloudEvents 1.0, HTTP protocol binding, binary content mode.

Encoding (the publisher) and decoding (a receiver written in Python, and the round-trip test)
side by side; see :mod:`outboxer.brokers.http.publisher` for the table of headers and the
signature. ``ce-type`` is the topic when a message has no type, so a decoded message whose type
equals its topic may have had none.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
from collections.abc import Mapping
from urllib.parse import unquote

from outboxer.brokers.cloudevents import (
    CONTENT_TYPE,
    HEADERS,
    SPECVERSION,
    format_time,
    parse_time,
)
from outboxer.message import OCTET_STREAM, Message

__all__ = [
    "RESERVED_HEADERS",
    "SIGNATURE",
    "ce_value",
    "decode",
    "header_problem",
    "headers",
    "signature",
]

#: The header carrying ``sha256=<hex HMAC-SHA256(secret, ce-id + "." + ce-time + "." + body)>``.
SIGNATURE = "webhook-signature"

#: Headers a message may not set: CloudEvents attributes and the signature are outboxer's, the
#: rest frame the HTTP/1.1 message or the connection and belong to the client library.
RESERVED_HEADERS = frozenset(
    {
        "content-type",
        "content-length",
        "content-encoding",
        "transfer-encoding",
        "host",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "expect",
        SIGNATURE,
    }
)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_PRINTABLE = re.compile(r"[\t\x20-\x7e]*")
#: CloudEvents HTTP binding 3.1.3.2: percent-encode space, '"', '%' and non-printable ASCII.
_CE_UNSAFE = re.compile(r'[^\x21-\x7e]|["%]')
#: Request headers that are HTTP framing or the client's, never a message header.
_NOT_USER = frozenset(
    {"host", "content-length", "user-agent", "accept", "accept-encoding", "connection", SIGNATURE}
)


def header_problem(
    name: str, value: str, reserved: frozenset[str] = RESERVED_HEADERS
) -> str | None:
    """Why a header cannot be sent (bad name, reserved name, value not printable ASCII), or
    ``None`` when it can. Every ``ce-*`` name is reserved."""
    if _TOKEN.fullmatch(name) is None:
        return f"header name {name!r} is not a valid HTTP token"
    lowered = name.lower()
    if lowered in reserved or lowered.startswith("ce-"):
        return (
            f"header {name!r} is reserved (set by outboxer: CloudEvents, signature or HTTP framing)"
        )
    if _PRINTABLE.fullmatch(value) is None:
        return f"the value of header {name!r} is not printable ASCII"
    return None


def ce_value(value: str) -> str:
    """A string attribute as a ``ce-*`` header value (percent-encoded only where needed)."""
    if _CE_UNSAFE.search(value) is None:
        return value
    return "".join(
        chr(b) if 0x21 <= b <= 0x7E and b not in (0x22, 0x25) else f"%{b:02X}"
        for b in value.encode()
    )


def signature(secret: bytes, ce_id: str, ce_time: str, payload: bytes) -> str:
    """The ``webhook-signature`` value of a request."""
    signed = f"{ce_id}.{ce_time}.".encode() + payload
    return "sha256=" + hmac.new(secret, signed, hashlib.sha256).hexdigest()


def headers(message: Message, source: str, secret: bytes | None) -> dict[str, str]:
    """The CloudEvents headers of ``message`` (``source`` already a ``ce-*`` value) and its
    signature when a ``secret`` is given; the caller adds the checked user headers."""
    ce_id = ce_value(message.id)
    ce_time = format_time(message.created_at)
    encoded = {
        CONTENT_TYPE: message.content_type,
        HEADERS.specversion: SPECVERSION,
        HEADERS.id: ce_id,
        HEADERS.type: ce_value(message.type or message.topic),
        HEADERS.source: source,
        HEADERS.time: ce_time,
        HEADERS.topic: ce_value(message.topic),
    }
    if message.key is not None:
        encoded[HEADERS.partitionkey] = ce_value(message.key)
    if secret is not None:
        encoded[SIGNATURE] = signature(secret, ce_id, ce_time, message.payload)
    return encoded


def decode(headers: Mapping[str, str], body: bytes) -> Message:
    """A received request as a message (header names in any case); ``ce-id`` and ``ce-topic``
    are required.

    Raises:
        KeyError: the request carries no ``ce-id`` or ``ce-topic``: not an outboxer webhook.
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    created = parse_time(unquote(lowered.get(HEADERS.time, "")))
    return Message(
        id=unquote(lowered[HEADERS.id]),
        topic=unquote(lowered[HEADERS.topic]),
        payload=body,
        key=unquote(lowered[HEADERS.partitionkey]) if HEADERS.partitionkey in lowered else None,
        type=unquote(lowered[HEADERS.type]) if HEADERS.type in lowered else None,
        headers={
            name: value
            for name, value in headers.items()
            if name.lower() not in HEADERS.names and name.lower() not in _NOT_USER
        },
        content_type=lowered.get(CONTENT_TYPE, OCTET_STREAM),
        created_at=created or dt.datetime.now(dt.UTC),
    )
