"""Redis Streams wire format: one stream entry per message, encoded and decoded.

    XADD <topic> [MAXLEN ~ <maxlen>] * id <id> [type <type>] [key <key>] payload <bytes>
         headers <json object> content_type <mime type>

See :mod:`outboxer.brokers.redis.publisher` for the table of fields. The entry id's
milliseconds stand in for the creation time, which the format does not carry; an entry not
written by outboxer (no ``id`` field) gets the id ``redis:stream:entry-id``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping

from outboxer.brokers.cloudevents import moment_from_epoch
from outboxer.message import OCTET_STREAM, Message

__all__ = ["MAX_PAYLOAD_BYTES", "decode", "xadd"]

#: Redis refuses bulk strings larger than ``proto-max-bulk-len`` (512 MiB by default) by
#: closing the connection; checked beforehand so such a message cannot stall its batch forever.
MAX_PAYLOAD_BYTES = 512 * 1024 * 1024

_XADD = b"XADD"
_AUTO_ID = b"*"
_F_ID, _F_TYPE, _F_KEY = b"id", b"type", b"key"
_F_PAYLOAD, _F_HEADERS, _F_CONTENT_TYPE = b"payload", b"headers", b"content_type"
_NO_HEADERS = b"{}"
#: One shared encoder: ``json.dumps`` with non-default arguments builds a new one per call.
_encode_json = json.JSONEncoder(separators=(",", ":")).encode


def xadd(
    message: Message, trim: tuple[bytes, ...] = (), max_bulk: int = MAX_PAYLOAD_BYTES
) -> tuple[bytes, ...]:
    """The ``XADD`` arguments, pre-encoded so that an unencodable message fails alone.

    Raises:
        ValueError, UnicodeEncodeError, TypeError: the message cannot be written to Redis.
    """
    if len(message.payload) > max_bulk:
        raise ValueError(
            f"payload of {len(message.payload)} bytes exceeds the server's proto-max-bulk-len"
            f" ({max_bulk} bytes)"
        )
    head = (_XADD, message.topic.encode(), *trim, _AUTO_ID, _F_ID, message.id.encode())
    if message.type is not None:
        head += (_F_TYPE, message.type.encode())
    if message.key is not None:
        head += (_F_KEY, message.key.encode())
    headers = message.headers
    encoded_headers = (
        _encode_json(headers if type(headers) is dict else dict(headers)).encode()
        if headers
        else _NO_HEADERS
    )
    if len(encoded_headers) > max_bulk:
        raise ValueError(
            f"headers of {len(encoded_headers)} bytes exceed the server's proto-max-bulk-len"
            f" ({max_bulk} bytes)"
        )
    return (
        *head,
        _F_PAYLOAD,
        message.payload,
        _F_HEADERS,
        encoded_headers,
        _F_CONTENT_TYPE,
        message.content_type.encode(),
    )


def _text(value: bytes | str | None) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value


def decode(*, stream: str, entry_id: str, fields: Mapping[bytes | str, bytes | str]) -> Message:
    """A stream entry as a message; never fails."""
    values = {(_text(k) or ""): v for k, v in fields.items()}
    raw_payload = values.get("payload", b"")
    payload = raw_payload if isinstance(raw_payload, bytes) else raw_payload.encode()
    headers: dict[str, str] = {}
    raw_headers = _text(values.get("headers"))
    if raw_headers:
        try:
            decoded = json.loads(raw_headers)
        except (ValueError, RecursionError):  # any client may XADD any text (nested 10^5 deep)
            decoded = None
        if isinstance(decoded, dict):
            headers = {str(k): str(v) for k, v in decoded.items()}
    millis = entry_id.partition("-")[0]
    # A client may XADD with an id of its own choosing: its milliseconds may be no moment.
    created = moment_from_epoch(int(millis) / 1000) if millis.isdigit() else None
    return Message(
        id=_text(values.get("id")) or f"redis:{stream}:{entry_id}",
        topic=stream,
        payload=payload,
        key=_text(values.get("key")),
        type=_text(values.get("type")),
        headers=headers,
        content_type=_text(values.get("content_type")) or OCTET_STREAM,
        created_at=created or dt.datetime.now(dt.UTC),
    )
