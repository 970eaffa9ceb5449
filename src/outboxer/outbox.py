"""The write side: add a message to the outbox inside the caller's open transaction.

``enqueue`` executes one INSERT on the connection or session the application already uses for its
business rows, so the message commits or rolls back with them. It never commits, never opens a
transaction of its own and never imports a driver: the connection's type says which parameter
style to use (SQLAlchemy support lives in :mod:`outboxer.integrations.sqlalchemy`).
"""

from __future__ import annotations

import datetime as dt
import re
import sqlite3
from collections.abc import Mapping
from functools import cache
from typing import Any, NamedTuple

from outboxer._ids import new_message_id
from outboxer.config import TableNames
from outboxer.errors import ConfigurationError
from outboxer.message import encode_headers, encode_payload
from outboxer.observability.propagation import TRACEPARENT, trace_headers
from outboxer.stores import _sql

__all__ = ["Outbox", "enqueue", "enqueue_async"]

_DOLLAR = re.compile(r"\$(\d+)")


class Row(NamedTuple):
    """The INSERT parameters, in the order of the ``insert`` query."""

    id: str
    topic: str
    key: str | None
    type: str | None
    payload: bytes
    content_type: str
    headers: str
    available_at: dt.datetime | None

    def for_dialect(self, dialect: str) -> tuple[Any, ...]:
        if dialect == "sqlite" and self.available_at is not None:
            return (*self[:7], self.available_at.timestamp())
        return tuple(self)


def _connection_kind(conn: object) -> str:
    if isinstance(conn, sqlite3.Connection | sqlite3.Cursor):
        return "sqlite3"
    module = type(conn).__module__.split(".")[0]
    if module in ("sqlalchemy", "psycopg", "asyncpg", "aiosqlite"):
        return module
    raise ConfigurationError(
        f"enqueue() does not know connections of type {type(conn).__module__}."
        f"{type(conn).__qualname__}: pass a SQLAlchemy Session/Connection (sync or async), "
        "a psycopg 3 connection, an asyncpg connection or a sqlite3 connection"
    )


class Outbox:
    """An outbox with non-default table or schema names.

    Args:
        table: Outbox table name (validated identifier).
        schema: Schema holding the outbox tables, ``None`` for the connection's default.
    """

    def __init__(self, table: str = "outbox", schema: str | None = None) -> None:
        self.names = TableNames(table=table, schema=schema)

    def __repr__(self) -> str:
        return f"Outbox(table={self.names.table!r}, schema={self.names.schema!r})"

    def insert_sql(self, dialect: str, paramstyle: str) -> str:
        """The INSERT for ``dialect`` in ``paramstyle`` (numeric/format/qmark/named)."""
        return _insert_sql(self.names, dialect, paramstyle)

    def row(
        self,
        topic: str,
        payload: object,
        *,
        key: str | int | None = None,
        type: str | None = None,  # noqa: A002 - the contract's word for the event type
        headers: Mapping[str, str] | None = None,
        id: str | None = None,  # noqa: A002 - the contract's word for the message id
        available_at: dt.datetime | dt.timedelta | None = None,
    ) -> Row:
        """Validate and encode one message; raises ``ConfigurationError`` on bad input.

        When an OpenTelemetry span is active, its W3C ``traceparent``/``tracestate`` are added
        to the headers (unless ``headers`` has a ``traceparent`` of its own), so the relay's
        publish span continues the caller's trace.
        """
        if not isinstance(topic, str) or not topic:
            raise ConfigurationError("topic must be a non-empty string")
        if key is not None and not isinstance(key, str | int):
            raise ConfigurationError("key must be a string (or an int) or None")
        if type is not None and not isinstance(type, str):
            raise ConfigurationError("type must be a string or None")
        if id is not None and (not isinstance(id, str) or not id):
            raise ConfigurationError("id must be a non-empty string or None")
        body, content_type = encode_payload(payload)
        trace = trace_headers()
        if trace is not None and (
            headers is None or (isinstance(headers, Mapping) and TRACEPARENT not in headers)
        ):  # (headers of a wrong type are left for encode_headers to refuse)
            headers = {**headers, **trace} if headers else trace
        return Row(
            id=id or new_message_id(),
            topic=topic,
            key=str(key) if key is not None else None,
            type=type,
            payload=body,
            content_type=content_type,
            headers=encode_headers(headers),
            available_at=_absolute(available_at),
        )

    def enqueue(self, conn: Any, topic: str, payload: object, **options: Any) -> str:
        """Insert a message in ``conn``'s open transaction and return its id.

        Args:
            conn: SQLAlchemy ``Session``/``Connection``, psycopg 3 ``Connection``/``Cursor`` or a
                ``sqlite3.Connection``, inside the caller's transaction.
            topic: Destination (Kafka topic, routing key, subject, stream).
            payload: dict/list (JSON), str, bytes, a dataclass or a pydantic model.
            **options: ``key``, ``type``, ``headers``, ``id``, ``available_at`` (datetime or
                timedelta from now) - see :meth:`row`.
        """
        row = self.row(topic, payload, **options)
        kind = _connection_kind(conn)
        if kind == "sqlite3":
            conn.execute(self.insert_sql("sqlite", "qmark"), row.for_dialect("sqlite"))
        elif kind == "psycopg" and not _is_async(conn):
            conn.execute(self.insert_sql("postgres", "format"), row)
        elif kind == "sqlalchemy":
            from outboxer.integrations import sqlalchemy as sa_integration

            sa_integration.insert(self, conn, row)
        else:
            raise ConfigurationError(
                f"{type(conn).__qualname__} is asynchronous: use 'await enqueue_async(...)'"
            )
        return row.id

    async def enqueue_async(self, conn: Any, topic: str, payload: object, **options: Any) -> str:
        """Like :meth:`enqueue` for asyncpg, psycopg ``AsyncConnection``, aiosqlite and
        SQLAlchemy ``AsyncSession``/``AsyncConnection``."""
        row = self.row(topic, payload, **options)
        kind = _connection_kind(conn)
        if kind == "asyncpg":
            await conn.execute(self.insert_sql("postgres", "numeric"), *row)
        elif kind == "psycopg" and _is_async(conn):
            await conn.execute(self.insert_sql("postgres", "format"), row)
        elif kind == "aiosqlite":
            await conn.execute(self.insert_sql("sqlite", "qmark"), row.for_dialect("sqlite"))
        elif kind == "sqlalchemy":
            from outboxer.integrations import sqlalchemy as sa_integration

            await sa_integration.insert_async(self, conn, row)
        else:
            raise ConfigurationError(
                f"{type(conn).__qualname__} is synchronous: use 'enqueue(...)' (no await)"
            )
        return row.id


def _is_async(conn: object) -> bool:
    return type(conn).__name__.startswith("Async")


def _absolute(when: dt.datetime | dt.timedelta | None) -> dt.datetime | None:
    if when is None:
        return None
    if isinstance(when, dt.timedelta):
        return dt.datetime.now(dt.UTC) + when
    if isinstance(when, dt.datetime):
        # A naive datetime is taken as UTC, like datetime.utcnow() produces.
        return when if when.tzinfo else when.replace(tzinfo=dt.UTC)
    raise ConfigurationError("available_at must be a datetime, a timedelta or None")


@cache
def _insert_sql(names: TableNames, dialect: str, paramstyle: str) -> str:
    sql = _sql.queries(dialect, names, quote="`" if dialect == "mysql" else '"')["insert"]
    if paramstyle == "numeric":
        return sql
    if paramstyle == "format":
        return _DOLLAR.sub("%s", sql)
    if paramstyle == "qmark":
        return _DOLLAR.sub("?", sql)
    if paramstyle == "named":
        return _DOLLAR.sub(lambda m: f":p{m.group(1)}", sql)
    raise ValueError(paramstyle)


_default = Outbox()


def enqueue(conn: Any, topic: str, payload: object, **options: Any) -> str:
    """Add a message to the default outbox in ``conn``'s transaction; see ``Outbox.enqueue``."""
    return _default.enqueue(conn, topic, payload, **options)


async def enqueue_async(conn: Any, topic: str, payload: object, **options: Any) -> str:
    """Async twin of :func:`enqueue`; see ``Outbox.enqueue_async``."""
    return await _default.enqueue_async(conn, topic, payload, **options)
