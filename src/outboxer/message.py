"""The envelope every outbox message travels in.

A :class:`Message` is what the relay claims from a store and hands to a publisher. Its ``id`` is
stable from ``enqueue`` to the broker and the inbox, so every consumer can drop duplicates.
The payload is stored and published as bytes together with its content type; ``encode_payload``
turns the Python values ``enqueue`` accepts into those bytes.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime as dt
import decimal
import enum
import hashlib
import json
import os
import re
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from outboxer.errors import ConfigurationError

__all__ = [
    "JSON",
    "MAX_TEXT_BYTES",
    "OCTET_STREAM",
    "TEXT",
    "ApplicationCode",
    "Message",
    "Returned",
    "Row",
    "RowTemplate",
    "encode_headers",
    "encode_payload",
    "encode_payload_template",
    "no_application_code",
    "received",
    "storable_text",
]

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
        """Decode a JSON payload (UTF-8, or what :func:`json.loads` reads from bytes)."""
        try:
            # ≈ 0.6 µs a message less than json.loads(bytes), which first guesses the encoding
            return _decode_json(self.payload.decode())
        except ValueError:  # not UTF-8, a BOM, not JSON: json.loads decides, with its error
            return json.loads(self.payload)

    @property
    def text(self) -> str:
        """The payload decoded as UTF-8."""
        return self.payload.decode()


_decode_json = json.JSONDecoder().decode

#: The longest id, topic, key, type (and header name) in bytes of UTF-8: an AMQP short string's
#: limit (routing key, message id, type, header name), far below PostgreSQL's b-tree entry limit
#: (~2.7 kB) on the indexed columns, and the MariaDB columns' width. ``enqueue`` refuses longer.
MAX_TEXT_BYTES = 255
#: Characters that always fit in MAX_TEXT_BYTES (at most 4 bytes each in UTF-8).
_ALWAYS_FITS = MAX_TEXT_BYTES // 4

#: What a store cannot keep in text: NUL (PostgreSQL refuses it in ``text`` and ``jsonb``) and
#: lone UTF-16 surrogates (not encodable as UTF-8, so no driver sends them).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _is_storable(text: str) -> bool:
    # ASCII (a flag lookup in CPython), the common case: only NUL to look for.
    return "\x00" not in text if text.isascii() else _UNSTORABLE.search(text) is None


def storable_text(text: str) -> str:
    """``text`` with each NUL character and lone surrogate replaced by U+FFFD, as decoding
    replaces a byte that is not UTF-8: text every store keeps (``text`` itself when it is)."""
    return text if _is_storable(text) else _UNSTORABLE.sub("\ufffd", text)


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on (control and escape sequences,
    bidirectional overrides, lone surrogates) written as a Python escape (``\\x1b``), so text
    that came from a message or an error cannot move the cursor, recolour or rewrite the
    operator's screen, nor forge a log line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _fits(text: str) -> bool:
    """Whether storable ``text`` is at most :data:`MAX_TEXT_BYTES` of UTF-8."""
    return len(text) <= _ALWAYS_FITS or len(text.encode()) <= MAX_TEXT_BYTES


def _names(message: Message) -> tuple[str, ...]:
    """The text fields that are names: bounded like the outbox's (an empty one for ``None``)."""
    return (message.id, message.topic, message.key or "", message.type or "", message.content_type)


def _storable_name(text: str) -> str:
    """:func:`storable_text`, or ``sha256:`` and its hex digest when that is longer than
    :data:`MAX_TEXT_BYTES` of UTF-8: the same for the same text, so a redelivery still matches."""
    text = storable_text(text)
    return text if _fits(text) else f"sha256:{hashlib.sha256(text.encode()).hexdigest()}"


def received(message: Message) -> Message:
    """``message`` as the inbox stores it and hands it to handlers: its text fields storable.

    ``enqueue`` refuses NUL, lone surrogates and an id, topic, key or type over
    :data:`MAX_TEXT_BYTES`, but any client can publish to a broker. A delivery carrying one
    could not be stored (PostgreSQL refuses NUL and index entries over ~2.7 kB, MariaDB's
    columns are 255 bytes wide, no driver encodes a lone surrogate, SQLite cuts text at NUL)
    and would stop the consumer each time the broker delivered it again. So each NUL and lone
    surrogate is replaced by U+FFFD (:func:`storable_text`), as decoders replace bytes that are
    not UTF-8, and an id, topic, key, type or content type still too long by its digest
    (``sha256:<hex>``). Returns ``message`` itself when nothing needs replacing: the common case
    costs ≈ 0.15 µs (the fields joined, one scan; they all fit when together they do).
    """
    headers = message.headers
    named = "".join(_names(message))
    if (
        _is_storable(named)
        and (not headers or _is_storable("".join((*headers, *headers.values()))))
        and ((len(named) <= MAX_TEXT_BYTES and named.isascii()) or all(map(_fits, _names(message))))
    ):
        return message
    return dataclasses.replace(
        message,
        id=_storable_name(message.id),
        topic=_storable_name(message.topic),
        key=None if message.key is None else _storable_name(message.key),
        type=None if message.type is None else _storable_name(message.type),
        headers={storable_text(name): storable_text(value) for name, value in headers.items()},
        content_type=_storable_name(message.content_type),
    )


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


class Returned:
    """A column the business statement returns, standing for a message's ``key`` or for a
    member of its (dict) payload in a one-statement write: the database fills it in, e.g. with
    the id it generated for the new business row. Anywhere a JSON payload (dict, list,
    dataclass) holds a value (not a dataclass itself, on purpose: JSON would encode it as an
    object).

    Args:
        column: The column's name in the statement's ``RETURNING`` (as the database names it:
            unquoted names are lower case).

    Raises:
        ConfigurationError: not a name PostgreSQL keeps as it is (empty, over 63 bytes, NUL).
    """

    __slots__ = ("column",)

    def __init__(self, column: str) -> None:
        try:
            size = len(column.encode()) if isinstance(column, str) else 0
        except UnicodeEncodeError:
            size = 0  # a lone surrogate
        # NAMEDATALEN - 1: a longer name would be truncated, and might name another column.
        if not 0 < size <= 63 or "\x00" in column:
            raise ConfigurationError(
                "Returned(column): the column must be a name of 1 to 63 bytes of UTF-8, without NUL"
            )
        self.column = column

    def __repr__(self) -> str:
        return f"Returned({self.column!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Returned) and other.column == self.column

    def __hash__(self) -> int:
        return hash((Returned, self.column))


class RowTemplate(NamedTuple):
    """A message validated and encoded for a one-statement write: an outbox :class:`Row` whose
    key and JSON values in the payload may be the business statement's returned columns.

    Attributes:
        row: The encoded message; its ``key`` is ``None`` when ``key`` is a column, its
            ``payload`` empty when ``payload_columns`` is not.
        key: The returned column that is the message's key, if any.
        payload_columns: The returned columns in the JSON payload, in the order they appear.
        payload_parts: The JSON text around them (one more than the columns): the payload is
            ``parts[0] + json(columns[0]) + parts[1] + ...``, the columns' JSON written by the
            database.
    """

    row: Row
    key: Returned | None
    payload_columns: tuple[Returned, ...]
    payload_parts: tuple[str, ...]


class ApplicationCode(Exception):
    """A payload whose encoding runs the application's code (a dataclass's fields, a pydantic
    model's serializer), met inside :func:`no_application_code`."""


_no_application_code: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "outboxer_no_application_code", default=False
)


@contextlib.contextmanager
def no_application_code() -> Iterator[None]:
    """Payloads encoded meanwhile (in this thread or task) raise :class:`ApplicationCode`
    instead of running the application's code. A long ``enqueue_many`` batch is encoded a
    chunk at a time while the caller's connection is busy storing the chunk before: code of the
    application's could use that connection (an ORM object that loads its expired attributes
    through its session), which would deadlock or break it."""
    token = _no_application_code.set(True)
    try:
        yield
    finally:
        _no_application_code.reset(token)


def _application_code_allowed() -> None:
    """Raise :class:`ApplicationCode` inside :func:`no_application_code`."""
    if _no_application_code.get():
        raise ApplicationCode("a payload whose encoding runs the application's code")


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
        _application_code_allowed()
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
            _application_code_allowed()
            return str(dump_json()).encode(), JSON
        if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
            _application_code_allowed()
            payload = dataclasses.asdict(payload)
        return _PAYLOAD_ENCODER.encode(payload).encode(), JSON
    except (TypeError, ValueError, RecursionError, OverflowError) as exc:
        # ValueError covers NaN/Infinity, lone surrogates in a str payload and ints beyond
        # Python's digit limit; RecursionError a circular or too deeply nested structure.
        raise ConfigurationError(f"cannot serialize payload: {exc}") from exc


# A stand-in for each Returned column while its payload is encoded, split off afterwards: random
# (drawn once), so that no other value encodes to it, and checked (see below).
_TOKEN = f"outboxer-returned-{os.urandom(16).hex()}"
_QUOTED_TOKEN = f'"{_TOKEN}"'  # as the encoder writes it
_template_columns = threading.local()  # the columns met by the encoding running in this thread


def _template_default(value: Any) -> Any:
    if isinstance(value, Returned):
        _template_columns.found.append(value)
        return _TOKEN
    return _json_default(value)


_TEMPLATE_ENCODER = json.JSONEncoder(
    default=_template_default, separators=(",", ":"), allow_nan=False, check_circular=False
)


def encode_payload_template(payload: object) -> tuple[tuple[str, ...], tuple[Returned, ...]]:
    """Encode a JSON payload (dict, list, dataclass ...) whose values may be :class:`Returned`
    columns, as :func:`encode_payload` does: the JSON text around the columns, and the columns
    in the order they appear (a plain payload: its whole JSON, and no column).

    Raises:
        ConfigurationError: as :func:`encode_payload`, or a payload holding the stand-in text
            of a column (never by chance: it is 128 random bits).
    """
    columns: list[Returned] = []
    _template_columns.found = columns
    try:
        if type(payload) is dict:  # the common case, tested first
            pass
        elif dataclasses.is_dataclass(payload) and not isinstance(payload, type):
            payload = dataclasses.asdict(payload)
        text = _TEMPLATE_ENCODER.encode(payload)
    except (TypeError, ValueError, RecursionError, OverflowError) as exc:
        raise ConfigurationError(f"cannot serialize payload: {exc}") from exc
    parts = text.split(_QUOTED_TOKEN)
    if len(parts) != len(columns) + 1:
        raise ConfigurationError("payload: a string equal to outboxer's stand-in for a column")
    return tuple(parts), tuple(columns)


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
