"""SQLAlchemy support for ``enqueue``: sync ``Session``/``Connection`` and async twins.

The INSERT runs through the session's own connection, so it joins the session's transaction
(and its unit of work flushes first, as for any ``Session.execute``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from sqlalchemy import TextClause, text

from outboxer.errors import ConfigurationError

if TYPE_CHECKING:
    from outboxer.outbox import Outbox, Row

_DIALECTS = {"postgresql": "postgres", "sqlite": "sqlite", "mysql": "mysql", "mariadb": "mysql"}


def _dialect(conn: Any) -> str:
    bind = conn.get_bind() if hasattr(conn, "get_bind") else conn
    name = bind.dialect.name
    try:
        return _DIALECTS[name]
    except KeyError:
        raise ConfigurationError(f"outboxer does not support the {name!r} database") from None


@functools.cache
def _insert(sql: str) -> TextClause:
    # Building a TextClause parses its bind parameters: do it once per statement, not per call.
    return text(sql)


def _statement(outbox: Outbox, conn: Any, row: Row) -> tuple[Any, dict[str, Any]]:
    dialect = _dialect(conn)
    params = {f"p{i}": value for i, value in enumerate(row.for_dialect(dialect), start=1)}
    return _insert(outbox.insert_sql(dialect, "named")), params


def insert(outbox: Outbox, conn: Any, row: Row) -> None:
    """INSERT through a sync ``Session`` or ``Connection``."""
    if type(conn).__name__.startswith("Async"):
        raise ConfigurationError(
            f"{type(conn).__name__} is asynchronous: use 'await enqueue_async(...)'"
        )
    conn.execute(*_statement(outbox, conn, row))


async def insert_async(outbox: Outbox, conn: Any, row: Row) -> None:
    """INSERT through an ``AsyncSession`` or ``AsyncConnection``."""
    if not type(conn).__name__.startswith("Async"):
        raise ConfigurationError(f"{type(conn).__name__} is synchronous: use 'enqueue(...)'")
    await conn.execute(*_statement(outbox, conn, row))
