"""The envelope every outbox message travels in.

A :class:`Message` is what the relay claims from a store and hands to a publisher. Its ``id`` is
stable from ``enqueue`` to the broker and the inbox, so every consumer can drop duplicates.
The payload is stored and published as bytes together with its content type; ``encode_payload``
turns the Python values ``enqueue`` accepts into those bytes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from outboxer.errors import ConfigurationError

__all__ = ["JSON", "OCTET_STREAM", "TEXT", "Message", "Row", "encode_headers", "encode_payload"]

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
OCTET_STREAM = "application/octet-stream"


@dataclass(frozen=True, slots=True)
class Message:
    """One message of the outbox.

    Attributes:
        id: Stable unique id (a UUIDv7 unless the writer chose one); consumers dedupe on it.
        topic: Destination: Kafka topic, AMQP routing key, NATS subject, Redis stream.
        payload: The body as bytes, see ``content_type``.
        key: Ordering and partitioning key (e.g. the order id); same key, same order.
        type: Event type such as ``OrderCreated``; handlers are chosen by it.
        headers: User headers, string to string, carried to the broker.
        content_type: MIME type of ``payload``.
        created_at: When the business transaction wrote the message (UTC).
        available_at: Not published before this instant (delayed delivery, retry backoff).
        attempts: Failed publish attempts so far.
    """

    id: str
    topic: str
    payload: bytes
    key: str | None = None
    type: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str = JSON
    created_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    available_at: dt.datetime | None = None
    attempts: int = 0

    def json(self) -> Any:
        """Decode a JSON payload."""
        return json.loads(self.payload)

    @property
    def text(self) -> str:
        """The payload decoded as UTF-8."""
        return self.payload.decode()


class Row(NamedTuple):
    """A message as ``enqueue`` writes it: the outbox columns the writer fills, in this order.

    The database fills the others (``seq``, ``created_at``, ``attempts`` ...), and
    ``available_at`` when it is ``None`` (the database's clock, not the application's).
    """

    id: str
    topic: str
    key: str | None
    type: str | None
    payload: bytes
    content_type: str
    headers: str  # a JSON object
    available_at: dt.datetime | None


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# Built once: json.dumps with options constructs an encoder on every call (a third of the cost
# of encoding a small payload). NaN and Infinity are refused: they are not JSON, and consumers
# in other languages (and PostgreSQL's jsonb) reject them. No circular-reference bookkeeping
# on every container: a circular payload ends in RecursionError, refused as well.
_PAYLOAD_ENCODER = json.JSONEncoder(
    default=_json_default, separators=(",", ":"), allow_nan=False, check_circular=False
)
_HEADERS_ENCODER = json.JSONEncoder(separators=(",", ":"))


def encode_payload(payload: object) -> tuple[bytes, str]:
    """Turn an ``enqueue`` payload into ``(bytes, content_type)``.

    dict/list/None/numbers become JSON, ``str`` is UTF-8 text, ``bytes`` are kept as they are,
    dataclasses and pydantic models (anything with ``model_dump_json``) become JSON.
    Pydantic is detected by duck typing so that the core does not import it.

    Raises:
        ConfigurationError: the payload has a type outboxer cannot serialize, is not valid JSON
            (NaN, Infinity, a circular or too deeply nested structure) or is a ``str`` that is
            not valid Unicode (a lone surrogate).
    """
    try:
        if type(payload) is dict or type(payload) is list:  # the common case, tested first
            return _PAYLOAD_ENCODER.encode(payload).encode(), JSON
        if isinstance(payload, bytes | bytearray | memoryview):
            return bytes(payload), OCTET_STREAM
        if isinstance(payload, str):
            return payload.encode(), TEXT
        dump_json = getattr(payload, "model_dump_json", None)
        if callable(dump_json) and not isinstance(payload, type):
            return str(dump_json()).encode(), JSON
        if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
            payload = dataclasses.asdict(payload)
        return _PAYLOAD_ENCODER.encode(payload).encode(), JSON
    except (TypeError, ValueError, RecursionError, OverflowError) as exc:
        # ValueError covers NaN/Infinity, lone surrogates in a str payload and ints beyond
        # Python's digit limit; RecursionError a circular or too deeply nested structure.
        raise ConfigurationError(f"cannot serialize payload: {exc}") from exc


def encode_headers(headers: Mapping[str, str] | None) -> str:
    """Validate user headers (string keys and values) and return them as a JSON object."""
    if not headers:
        return "{}"
    if not isinstance(headers, Mapping):
        raise ConfigurationError("headers must be a mapping of strings to strings")
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ConfigurationError(f"header {name!r}: names and values must be strings")
    return _HEADERS_ENCODER.encode(dict(headers))
