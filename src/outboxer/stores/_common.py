"""Helpers shared by the SQL stores: row mapping, cursors, filters."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any, Protocol

from outboxer.errors import ConfigurationError
from outboxer.message import Message
from outboxer.ports import DeadLetter, SweepReport


class Row(Protocol):
    """A database row readable by column name (asyncpg Record, sqlite3.Row, dict)."""

    def __getitem__(self, key: str, /) -> Any: ...


def decode_headers(raw: str | bytes | Mapping[str, str] | None) -> Mapping[str, str]:
    if not raw or raw == "{}":
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    value = json.loads(raw)
    return value if isinstance(value, dict) else {}


def message_from_row(row: Row) -> Message:
    return Message(
        id=row["id"],
        topic=row["topic"],
        payload=bytes(row["payload"]),
        key=row["key"],
        type=row["type"],
        headers=decode_headers(row["headers"]),
        content_type=row["content_type"],
        created_at=to_datetime(row["created_at"]),
        available_at=to_datetime(row["available_at"]),
        attempts=row["attempts"],
    )


def dead_letter_from_row(row: Row) -> DeadLetter:
    return DeadLetter(
        id=row["id"],
        topic=row["topic"],
        key=row["key"],
        type=row["type"],
        payload=bytes(row["payload"]),
        content_type=row["content_type"],
        headers=decode_headers(row["headers"]),
        created_at=to_datetime(row["created_at"]),
        dead_lettered_at=to_datetime(row["dead_lettered_at"]),
        failure_reason=row["failure_reason"],
        attempts=row["attempts"],
        direction=row["direction"],
    )


def sweep_report(row: Row) -> SweepReport:
    return SweepReport(
        started_at=to_datetime(row["started_at"]),
        completed_at=to_datetime(row["completed_at"]),
        swept_by=row["swept_by"],
        publish_retries=row["publish_retries"],
        publish_failures=row["publish_failures"],
        consume_retries=row["consume_retries"],
        consume_failures=row["consume_failures"],
        purged=row["purged"],
    )


def to_datetime(value: dt.datetime | float | int) -> dt.datetime:
    """SQLite stores epoch seconds; PostgreSQL returns aware datetimes."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return dt.datetime.fromtimestamp(float(value), dt.UTC)


def parse_cursor(cursor: str | None) -> int | None:
    """Cursors are opaque to clients; here they are the last seen dead-letter sequence."""
    if cursor is None or cursor == "":
        return None
    try:
        value = int(cursor)
    except ValueError:
        raise ConfigurationError(f"invalid cursor {cursor!r}") from None
    if value < 0:
        raise ConfigurationError(f"invalid cursor {cursor!r}")
    return value


def check_limit(limit: int) -> int:
    if not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise ConfigurationError(f"invalid limit {limit!r}: must be between 1 and 1000")
    return limit
