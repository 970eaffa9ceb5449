"""PostgreSQL's binary COPY format for outbox rows, shared by the asyncpg and psycopg writers.

``COPY outbox (...) FROM STDIN (FORMAT binary)`` is the fastest way to add many rows: one
statement, no text parsing on the server (faster than text COPY), and on the client one pass
that packs each field's length before its bytes. Written here rather than by the drivers' own
row encoders, which depend on the connection's type codecs: an application's own ``jsonb``
codec (asyncpg's ``set_type_codec``, psycopg's binary jsonb dumper) would store our JSON text
as a JSON *string*, or fail half-way through the COPY and abort the caller's transaction. The
formats of text, bytea and jsonb fields are trivial.

COPY fills the same defaults as INSERT; it cannot compute ``COALESCE(available_at, now())``, so
the writers send a batch with a delayed message as an INSERT instead.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence

from outboxer.message import Row
from outboxer.writers import STREAM_SAVEPOINT

__all__ = ["COPIED", "STREAM_SAVEPOINT", "UNDO_STREAM", "copy_chunks", "copy_data"]

COPIED = Row._fields[:-1]
"""The columns COPY fills: all of :class:`Row` but ``available_at``, left to its default."""

# The format: a signature, flags (0) and header extension length (0) ...
_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
_FIELDS = struct.pack("!h", len(COPIED))  # ... then per row its field count ...
_LENGTH = struct.Struct("!i").pack  # ... and per field its length and bytes (-1: NULL) ...
_NULL = _LENGTH(-1)
_TRAILER = struct.pack("!h", -1)  # ... and -1 at the end.
_JSONB_VERSION = b"\x01"  # a binary jsonb value is its text after a version byte
_CHUNK_ROWS = 1000
UNDO_STREAM = f"ROLLBACK TO SAVEPOINT {STREAM_SAVEPOINT}; RELEASE SAVEPOINT {STREAM_SAVEPOINT}"


def _binary_rows(rows: Sequence[Row]) -> bytes:
    out: list[bytes] = []
    add = out.append
    for id_, topic, key, type_, payload, content_type, headers, _ in rows:
        add(_FIELDS)
        for text in (id_, topic, key, type_):
            if text is None:
                add(_NULL)
            else:
                data = text.encode()
                add(_LENGTH(len(data)))
                add(data)
        add(_LENGTH(len(payload)))
        add(payload)
        data = content_type.encode()
        add(_LENGTH(len(data)))
        add(data)
        data = headers.encode()
        add(_LENGTH(len(data) + 1))
        add(_JSONB_VERSION)
        add(data)
    return b"".join(out)


def copy_data(rows: Sequence[Row]) -> Iterator[bytes]:
    """The whole COPY stream of ``rows`` (their :data:`COPIED` columns), in chunks of a
    thousand rows: the server stores one while the next is packed."""
    yield _SIGNATURE
    for start in range(0, len(rows), _CHUNK_ROWS):
        yield _binary_rows(rows[start : start + _CHUNK_ROWS])
    yield _TRAILER


def copy_chunks(chunks: Iterable[Sequence[Row]], refused: list[BaseException]) -> Iterator[bytes]:
    """The COPY stream of the rows of ``chunks``, a block of bytes per chunk, each chunk taken
    only when its block is asked for. An exception taking a chunk (a message refused, or a
    ``KeyboardInterrupt`` meanwhile) ends the stream there, as a complete COPY of the rows
    before it, and goes into ``refused``: the writer rolls those rows back, then raises it. (A
    COPY failed from the client instead makes asyncpg cancel the statement with a second
    connection, which may reach the next one, or leave the connection in the COPY for good.)"""
    yield _SIGNATURE
    try:
        for chunk in chunks:
            yield _binary_rows(chunk)
    except GeneratorExit:  # the COPY itself failed: the writer undoes it
        raise
    except BaseException as exc:  # noqa: BLE001 - handed to the writer, raised after the undo
        refused.append(exc)
    yield _TRAILER
