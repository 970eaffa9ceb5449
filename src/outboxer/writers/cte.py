"""The one-statement write in raw SQL, on PostgreSQL: the business statement and the outbox
INSERT as one data-modifying CTE, in asyncpg's or psycopg's parameter style.

::

    WITH outboxer_business AS (<the caller's INSERT ... RETURNING ...>),
         outboxer_message AS (
             INSERT INTO <outbox> (id, topic, key, type, payload, content_type, headers,
                                   available_at)
             SELECT $3, $4, ..., COALESCE($10, now()) FROM outboxer_business AS b)
    SELECT * FROM outboxer_business

One round trip instead of two. The caller's statement is never parsed: outboxer's parameters
are numbered after the caller's (asyncpg ``$n``), appended (psycopg ``%s``) or named
``outboxer_n`` (psycopg ``%(name)s``; ``outboxer__n`` and so on when the caller has such
names). One message per returned row, and the statement returns what the caller's returned.
Every parameter is cast to its column's type: the types of a ``SELECT``'s output are not taken
from the INSERT's columns, and the headers travel as text so that an application's own
``jsonb`` codec changes nothing (see :mod:`outboxer.writers.asyncpg`).

A returned column inside the JSON payload is written by the database (``to_json(column)``)
between the JSON text outboxer encoded around it: the payload is the same bytes ``enqueue``
would write, but for the column's value as PostgreSQL writes it in JSON (numbers as numbers,
text and times as strings, a NULL as ``null``). The SQL text depends only on which columns are
used, so it is built once per shape and the drivers' prepared-statement caches keep it.
MariaDB and MySQL have no data-modifying CTE (and SQLite's INSERT cannot be one): there,
``enqueue`` in the same transaction is the way. Through SQLAlchemy
(:mod:`outboxer.integrations.sqlalchemy`), the SQL SQLAlchemy compiled for the caller's
statement takes its place here.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from outboxer.errors import ConfigurationError
from outboxer.message import RowTemplate
from outboxer.writers import columns

if TYPE_CHECKING:
    from outboxer.config import TableNames

__all__ = ["BUSINESS", "MESSAGE", "with_message"]

BUSINESS = "outboxer_business"
"""The CTE holding the caller's statement."""
MESSAGE = "outboxer_message"
"""The CTE holding the outbox INSERT."""


#: How each parameter style writes outboxer's ``n``-th parameter and its cast (a named one:
#: its name's prefix first).
_PLACEHOLDERS: dict[str, Callable[[str, int, str], str]] = {
    "$n": lambda prefix, n, type_: f"${n}::{type_}",
    "%s": lambda prefix, n, type_: f"%s::{type_}",
    "%(name)s": lambda prefix, n, type_: f"%({prefix}{n})s::{type_}",
}


def _column(column: str) -> str:
    quoted = column.replace('"', '""')  # a quoted identifier holds any name safely
    return f'b."{quoted}"'


def _json(column: str) -> str:
    """The returned column as JSON text; a NULL as ``null`` (``to_json(NULL)`` is NULL, which
    made the whole payload NULL and the business statement fail: a probe)."""
    return f"COALESCE(to_json({_column(column)})::text, 'null')"


@functools.cache
def _insert(
    names: TableNames,
    key: str | None,
    payload: tuple[str, ...],
    style: str,
    first: int,
    prefix: str = "outboxer_",
) -> str:
    """The SQL, once per outbox, returned columns (the key's, the payload's), parameter style
    and first number: it depends on nothing else. The parameters are those of :func:`_values`,
    in the same order."""
    count = itertools.count(first)

    def param(type_: str) -> str:
        return _PLACEHOLDERS[style](prefix, next(count), type_)

    items = [param("text"), param("text")]  # id, topic
    items.append(f"{_column(key)}::text" if key else param("text"))
    items.append(param("text"))  # type
    if payload:  # the JSON text around each column, the column as the database writes JSON
        joined = "".join(f"{param('text')} || {_json(c)} || " for c in payload)
        items.append(f"convert_to({joined}{param('text')}, 'UTF8')")
    else:
        items.append(param("bytea"))
    items.append(param("text"))  # content type
    items.append(f"{param('text')}::jsonb")  # headers, as text: see the module docstring
    items.append(f"COALESCE({param('timestamptz')}, now())")
    return (
        f"INSERT INTO {names.qualified()} ({columns()}) SELECT {', '.join(items)} "
        f"FROM {BUSINESS} AS b"
    )


def _values(template: RowTemplate) -> list[Any]:
    """The parameters of :func:`_insert`'s SQL, in its order."""
    row = template.row
    values: list[Any] = [row.id, row.topic]
    if template.key is None:
        values.append(row.key)
    values.append(row.type)
    if template.payload_columns:
        values += template.payload_parts
    else:
        values.append(row.payload)
    values += (row.content_type, row.headers, row.available_at)
    return values


def with_message(
    names: TableNames,
    statement: str,
    args: Sequence[Any] | Mapping[str, Any],
    template: RowTemplate,
    driver: str,
) -> tuple[str, list[Any] | dict[str, Any]]:
    """The SQL of the module docstring and its parameters, ``args`` first."""
    if driver not in ("asyncpg", "psycopg"):
        raise ConfigurationError(f"driver must be 'asyncpg' or 'psycopg', not {driver!r}")
    key = template.key.column if template.key else None
    payload = tuple(column.column for column in template.payload_columns)
    values = _values(template)
    if isinstance(args, Mapping):
        if driver == "asyncpg":
            raise ConfigurationError("asyncpg takes positional parameters ($1): pass a sequence")
        named = dict(args)
        # Outboxer's names must not be the caller's: SQLAlchemy names its parameters after the
        # columns, and a column "outboxer_1" made with_message() refuse the table (a probe).
        prefix = "outboxer_"
        while any(f"{prefix}{n}" in named for n in range(1, len(values) + 1)):
            prefix += "_"
        named.update((f"{prefix}{n}", value) for n, value in enumerate(values, 1))
        return _statement(names, statement, key, payload, "%(name)s", 1, prefix), named
    positional = list(args)
    style = "$n" if driver == "asyncpg" else "%s"
    return _statement(names, statement, key, payload, style, len(positional) + 1), [
        *positional,
        *values,
    ]


@functools.lru_cache(maxsize=1024)
def _statement(
    names: TableNames,
    statement: str,
    key: str | None,
    payload: tuple[str, ...],
    style: str,
    first: int,
    prefix: str = "outboxer_",
) -> str:
    """The whole statement, kept for the statements an application writes again and again: the
    same text object each time, whose hash the drivers' statement caches need not compute."""
    insert = _insert(names, key, payload, style, first, prefix)
    # A trailing ";" would end the statement inside the CTE, a trailing "-- comment" swallow
    # the rest of the line: both broke the caller's transaction with a syntax error (a probe).
    business = statement[: _end_of_statement(statement)]
    return f"WITH {BUSINESS} AS ({business}\n), {MESSAGE} AS ({insert}) SELECT * FROM {BUSINESS}"


def _end_of_statement(sql: str) -> int:
    """Where the statement's last token ends: before the trailing ``;``, whitespace and
    comments (``... RETURNING id; -- done``), read as PostgreSQL's lexer reads quotes, dollar
    quotes and comments.

    Raises:
        ConfigurationError: a ``;`` followed by another statement.
    """
    end = position = 0
    semicolon = None  # where a ";" ended the statement, if one did
    length = len(sql)
    while position < length:
        ch = sql[position]
        if ch.isspace():
            position += 1
            continue
        if sql.startswith("--", position):
            newline = sql.find("\n", position)
            position = length if newline < 0 else newline + 1
            continue
        if sql.startswith("/*", position):
            position = _block_comment_end(sql, position)
            continue
        if ch == ";":
            semicolon = position
            position += 1
            continue
        if semicolon is not None:
            raise ConfigurationError(
                "the business statement must be one statement: text follows its ';'"
            )
        position = _token_end(sql, position)
        end = position
    return end


def _block_comment_end(sql: str, position: int) -> int:
    depth, position = 1, position + 2  # PostgreSQL's block comments nest
    while depth and position < len(sql):
        if sql.startswith("/*", position):
            depth, position = depth + 1, position + 2
        elif sql.startswith("*/", position):
            depth, position = depth - 1, position + 2
        else:
            position += 1
    return position


def _token_end(sql: str, position: int) -> int:
    """The end of the token at ``position``: a word (keyword or name, ``$`` inside it
    included) whole, a quoted literal or identifier whole (``E'...'`` with its backslash
    escapes), a dollar quote whole, else one character."""
    ch = sql[position]
    if ch.isalpha() or ch == "_" or not ch.isascii():
        end = position + 1
        while end < len(sql) and (sql[end].isalnum() or sql[end] in "_$" or not sql[end].isascii()):
            end += 1
        if end == position + 1 and ch in "eE" and sql.startswith("'", end):
            return _quoted_end(sql, end, escapes=True)  # E'...': an escape string
        return end
    if ch in "'\"":
        return _quoted_end(sql, position, escapes=False)
    if ch == "$":
        close = sql.find("$", position + 1)
        tag = sql[position : close + 1] if close > 0 else ""
        plain = tag[1:-1].replace("_", "a")
        if tag and (tag == "$$" or plain.isalnum()) and not tag[1].isdigit():
            found = sql.find(tag, close + 1)
            return len(sql) if found < 0 else found + len(tag)
    return position + 1


def _quoted_end(sql: str, position: int, *, escapes: bool) -> int:
    """The end of the quoted literal or identifier opening at ``position`` (a doubled quote
    inside it is one quote; with ``escapes``, a backslash escapes the next character)."""
    quote, position = sql[position], position + 1
    while position < len(sql):
        if escapes and sql[position] == "\\":
            position += 2
        elif sql[position] == quote:
            if not sql.startswith(quote * 2, position):
                return position + 1
            position += 2
        else:
            position += 1
    return position
