"""The one-statement write with SQLAlchemy Core, on PostgreSQL.

:func:`with_message` marks the caller's ``insert(...).returning(...)`` (or ``update``/``delete``)
with the message it announces; when SQLAlchemy sends the statement, the SQL it compiled becomes
the business part of the SQL of :mod:`outboxer.writers.cte`::

    WITH outboxer_business AS (INSERT INTO orders ... RETURNING orders.id),
         outboxer_message AS (INSERT INTO outbox (...) SELECT ... FROM outboxer_business AS b)
    SELECT * FROM outboxer_business

Execute it as any statement (``session.execute``, ``await conn.execute``): it returns the rows
the caller's statement returns, and writes one message per row. The values are checked and
encoded by the write core as ``enqueue`` does, before any SQL; a :class:`~outboxer.Returned`
column must be one the statement returns (checked too).

The message travels as an execution option of the statement (not part of SQLAlchemy's cache
key), and a ``before_cursor_execute`` listener on every :class:`~sqlalchemy.engine.Engine`,
registered when this module is imported, wraps the compiled SQL and adds outboxer's parameters
in the dialect's style (psycopg and psycopg2 ``%(name)s``, pg8000 ``%s``, asyncpg ``$n``). So
SQLAlchemy compiles, caches and reads the results of the caller's own statement, as without a
message: composing the CTE from SQLAlchemy constructs instead (a ``Select`` over the business
statement's CTE and a ``text()`` with bound values) cost more client CPU than a second statement,
since every call built a new tree, its cache key and its result columns (docs/benchmarks.md,
*Write overhead*). A statement without the option costs the listener one dictionary lookup.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine

from outboxer.errors import ConfigurationError
from outboxer.message import Returned, RowTemplate
from outboxer.outbox import Outbox
from outboxer.writers import cte

__all__ = ["with_message"]

_default = Outbox()
_OPTION = "outboxer_message"
"""The execution option that holds a statement's message: ``(TableNames, RowTemplate)``."""

#: How outboxer's parameters are written for a dialect's parameter style (``"format"``, ``%s``,
#: is psycopg's positional style as well).
_DRIVERS = {"pyformat": "psycopg", "format": "psycopg", "numeric_dollar": "asyncpg"}

Statement = TypeVar("Statement", bound=sa.Insert | sa.Update | sa.Delete)


def with_message(
    statement: Statement,
    topic: str,
    payload: object,
    *,
    outbox: Outbox | None = None,
    **options: Any,
) -> Statement:
    """``statement`` writing a message in the same SQL statement (see the module docstring).

    Args:
        statement: An ``insert``/``update``/``delete`` with ``.returning(...)``.
        topic: As :func:`outboxer.enqueue`.
        payload: As :func:`outboxer.enqueue`; the values of a dict may be
            :class:`~outboxer.Returned` columns of ``statement``.
        outbox: The outbox to write to (default: the default ``outbox`` table).
        **options: As :func:`outboxer.enqueue`; ``key`` may be a :class:`~outboxer.Returned`.

    Returns:
        A copy of ``statement`` that carries the message: execute it once (a second execution
        would write the same message id again, which the outbox's primary key refuses).

    Raises:
        ConfigurationError: a refused value, a statement without ``RETURNING`` or a
            :class:`~outboxer.Returned` column it does not return. Executed on a database
            other than PostgreSQL, or with several parameter sets (``executemany``), the
            statement raises it too, before anything is sent.
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
    entity = statement.entity_description.get("entity")
    if entity is not None and len(getattr(sa.inspect(entity, raiseerr=False), "tables", ())) > 1:
        # The ORM sends one statement per table of a joined-table inheritance, each with this
        # statement's execution options: each would write the message, the second one failing
        # on its id and aborting the caller's transaction (a probe).
        raise ConfigurationError(
            f"with_message(): {getattr(entity, '__name__', entity)} is mapped to several "
            "tables (joined-table inheritance), which the ORM writes with one statement each: "
            "use outboxer.enqueue"
        )
    if template.key or template.payload_columns:
        template = _in_sql_names(template, statement)
    return cast(Statement, statement.execution_options(**{_OPTION: (outbox.names, template)}))


def _in_sql_names(
    template: RowTemplate, statement: sa.Insert | sa.Update | sa.Delete
) -> RowTemplate:
    """``template`` with each :class:`~outboxer.Returned` column named as the SQL names it: a
    Core column's ``key`` may differ from its name (``Column("id", key="order_id")``), and
    the CTE reads the SQL name (``Returned("order_id")`` passed the check, then failed in the
    database; ``Returned("id")`` was refused: a probe). Either is accepted."""
    returned = statement.exported_columns  # (memoized: the execution reads it too)
    by_key = {key: column.name for key, column in returned.items() if column.name}
    sql_names = set(by_key.values())

    def sql_name(ref: Returned) -> Returned:
        if ref.column in by_key:
            return Returned(by_key[ref.column])
        if ref.column in sql_names:
            return ref
        raise ConfigurationError(
            f"Returned({ref.column!r}): the statement returns {list(returned.keys())}"
        )

    return template._replace(
        key=None if template.key is None else sql_name(template.key),
        payload_columns=tuple(sql_name(ref) for ref in template.payload_columns),
    )


@event.listens_for(Engine, "before_cursor_execute", retval=True)
def _with_message(
    conn: sa.Connection,
    cursor: Any,
    statement: str,
    parameters: Any,
    context: Any,
    executemany: bool,
) -> tuple[str, Any]:
    message = context.execution_options.get(_OPTION) if context is not None else None
    if message is None:
        return statement, parameters
    dialect = conn.dialect
    driver = _DRIVERS.get(dialect.paramstyle)
    if dialect.name != "postgresql" or driver is None:
        raise ConfigurationError(
            "with_message() writes in one statement on PostgreSQL (psycopg, psycopg2, pg8000 "
            f"or asyncpg), not with {dialect.name}+{dialect.driver}: use outboxer.enqueue"
        )
    if executemany:
        raise ConfigurationError(
            "with_message(): one statement writes one message id: execute it with one set "
            "of parameters (outboxer.enqueue_many writes batches)"
        )
    names, template = message
    return cte.with_message(names, statement, parameters, template, driver)
