"""The one-statement write with SQLAlchemy Core, on PostgreSQL.

:func:`with_message` turns the caller's ``insert(...).returning(...)`` (or ``update``/``delete``)
into one statement that also writes a message, the SQL of :mod:`outboxer.writers.cte`::

    WITH outboxer_business AS (INSERT INTO orders ... RETURNING orders.id),
         outboxer_message AS (INSERT INTO outbox (...) SELECT ... FROM outboxer_business AS b)
    SELECT outboxer_business.id FROM outboxer_business

Execute it as any statement (``session.execute``, ``await conn.execute``): it returns the rows
the caller's statement returns, and writes one message per row. The values are checked and
encoded by the write core as ``enqueue`` does, before any SQL; a :class:`~outboxer.Returned`
column must be one the statement returns (checked too).

The outbox INSERT is a ``text()`` construct, built once per outbox and shape (which columns are
returned ones) and given the values as bound parameters of declared types: composing it from
SQLAlchemy expressions cost ≈ 25× the time of the caller's ``insert(...)`` on every call, and the
statement compiles to the same SQL (SQLAlchemy's compiled cache keys on it).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.dml import DMLWhereBase, Insert

from outboxer.errors import ConfigurationError
from outboxer.outbox import Outbox
from outboxer.writers.cte import BUSINESS, MESSAGE, outbox_insert

__all__ = ["with_message"]

_default = Outbox()
_TYPES: dict[str, sa.types.TypeEngine[Any]] = {
    "text": sa.Text(),
    "bytea": sa.LargeBinary(),
    "timestamptz": sa.DateTime(timezone=True),
}


@cache
def _insert(sql: str, types: tuple[str, ...]) -> sa.TextClause:
    # Parsing a text() for its bind parameters: once per SQL text. The declared types keep a
    # datetime from being sent as a timestamp without time zone.
    return sa.text(sql).bindparams(
        *(sa.bindparam(f"outboxer_{n}", type_=_TYPES[t]) for n, t in enumerate(types, 1))
    )


def with_message(
    statement: Insert | DMLWhereBase,
    topic: str,
    payload: object,
    *,
    outbox: Outbox | None = None,
    **options: Any,
) -> sa.Select[Any]:
    """``statement`` and the INSERT of a message as one statement (see the module docstring).

    Args:
        statement: An ``insert``/``update``/``delete`` with ``.returning(...)``.
        topic: As :func:`outboxer.enqueue`.
        payload: As :func:`outboxer.enqueue`; the values of a dict may be
            :class:`~outboxer.Returned` columns of ``statement``.
        outbox: The outbox to write to (default: the default ``outbox`` table).
        **options: As :func:`outboxer.enqueue`; ``key`` may be a :class:`~outboxer.Returned`.

    Raises:
        ConfigurationError: a refused value, a statement without ``RETURNING`` or a
            :class:`~outboxer.Returned` column it does not return.
    """
    outbox = outbox or _default
    template = outbox.template(topic, payload, **options)
    if not isinstance(statement, sa.Insert | sa.Update | sa.Delete) or not getattr(
        statement, "_returning", ()
    ):
        raise ConfigurationError(
            "with_message() takes an insert/update/delete with .returning(...): "
            "one message is written per returned row"
        )
    if template.key or template.payload_columns:
        returned = statement.exported_columns.keys()
        for ref in (template.key, *template.payload_columns):
            if ref is not None and ref.column not in returned:
                raise ConfigurationError(
                    f"Returned({ref.column!r}): the statement returns {returned}"
                )
    sql, values, types = outbox_insert(outbox.names, template, ":name")
    message = (
        _insert(sql, types)
        .bindparams(**{f"outboxer_{n}": value for n, value in enumerate(values, 1)})
        .columns()
        .cte(MESSAGE)
    )
    business = statement.cte(BUSINESS)
    # (in this order: a CTE can only refer to the ones before it)
    return sa.select(business).add_cte(business, message)
