"""SQL lives in versioned ``.sql`` files beside the stores; this module loads and renders it.

Each store package keeps its SQL in ``stores/<dialect>/sql/``: the numbered migrations
(``0001_initial.sql`` ...) and ``queries.sql``, the named queries (``-- name: claim_ordered``).
The files are read as resources of ``outboxer.stores`` (whose ``__init__`` imports no driver), so
the write side can render a dialect's INSERT without importing that store's driver.

Placeholders such as ``{outbox}`` are replaced by the validated, quoted names of a
:class:`~outboxer.config.TableNames`. Only known placeholders are replaced, so JSON literals like
``'{}'`` in the SQL are left alone. Values are always passed as query parameters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable

from outboxer.config import TableNames
from outboxer.errors import SchemaError

_PLACEHOLDER = re.compile(
    r"\{(outbox|dead_letters|relays|sweeps|schema_version|notify_fn|inbox|inbox_failures"
    r"|t|channel)\}"
)
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_\w+\.sql$")


#: The tables of one outbox: each one's placeholder and the suffix of its name.
TABLES = {
    "outbox": "",
    "dead_letters": "_dead_letters",
    "relays": "_relays",
    "sweeps": "_sweeps",
    "schema_version": "_schema_version",
    "inbox": "_inbox",
    "inbox_failures": "_inbox_failures",
}

#: A column each of an outbox's tables has had since it was created (version 1-3), and no other
#: of them has: a table of the outbox's names without it is not this outbox's (an application's
#: own, or another outbox's: the outbox ``outbox_inbox`` is where ``outbox`` keeps its inbox).
OWN_COLUMNS = {
    "outbox": "claim_token",
    "dead_letters": "dl_seq",
    "relays": "relay_id",
    "sweeps": "swept_by",
    "schema_version": "applied_at",
    "inbox": "expires_at",
    "inbox_failures": "next_attempt_at",
}


def refuse_foreign_tables(
    names: TableNames, columns: Callable[[str], Collection[str] | None], quote: str = '"'
) -> None:
    """Raise ``SchemaError`` if a table of ``names``' outbox exists and is not one outboxer
    made for it (``columns``: a table's column names, ``None`` where there is no such table).
    A table an interrupted install made has the column checked, and passes."""
    for table, suffix in TABLES.items():
        name, column = f"{names.table}{suffix}", OWN_COLUMNS[table]
        found = columns(name)
        if found is not None and column not in {c.lower() for c in found}:
            raise SchemaError(
                f"table {quote}{name}{quote} already exists and was not created by outboxer "
                f"for this outbox (it has no {column} column): nothing was changed; choose "
                "another --table (or --schema) for the outbox"
            )


def placeholders(names: TableNames, quote: str = '"') -> dict[str, str]:
    """The substitutions for one outbox."""
    return {
        **{table: names.qualified(suffix, quote=quote) for table, suffix in TABLES.items()},
        "notify_fn": names.qualified("_notify", quote=quote),
        "t": names.table,
        "channel": names.channel,
    }


def render(sql: str, names: TableNames, quote: str = '"') -> str:
    """Substitute the table placeholders of ``sql``."""
    values = placeholders(names, quote)
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], sql)


def _directory(dialect: str) -> Traversable:
    return resources.files("outboxer.stores").joinpath(dialect, "sql")


@cache
def read(dialect: str, filename: str) -> str:
    """The text of ``<dialect>/sql/<filename>``."""
    return _directory(dialect).joinpath(filename).read_text()


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations(dialect: str) -> list[Migration]:
    """The schema migrations of a dialect, in version order."""
    found = []
    for entry in _directory(dialect).iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text()))
    return sorted(found, key=lambda m: m.version)


def pending_migrations(dialect: str, current: int, target: int | None = None) -> list[Migration]:
    """The migrations to apply to a schema at version ``current``, up to ``target``.

    Raises:
        SchemaError: the schema is newer than this version of outboxer knows; it is never
            reported as up to date, since an older relay could corrupt what a newer one wrote.
    """
    available = migrations(dialect)
    latest = available[-1].version
    if current > latest:
        raise SchemaError(
            f"outbox schema is at version {current}, newer than this outboxer understands "
            f"({latest}): upgrade outboxer"
        )
    return [m for m in available if m.version > current and (target is None or m.version <= target)]


def queries(dialect: str, names: TableNames, quote: str = '"') -> dict[str, str]:
    """The named queries of ``<dialect>/queries.sql``, rendered for ``names``."""
    text = read(dialect, "queries.sql")
    parts = _NAME.split(text)
    return {
        name: render(body.strip(), names, quote)
        for name, body in zip(parts[1::2], parts[2::2], strict=False)
    }


def split_statements(sql: str) -> list[str]:
    """Split a migration into statements, keeping ``$$``-quoted bodies whole."""
    statements, current, in_dollar = [], [], False
    for line in sql.splitlines():
        if line.lstrip().startswith("--") and not in_dollar:
            continue
        current.append(line)
        in_dollar ^= line.count("$$") % 2 == 1
        if not in_dollar and line.rstrip().endswith(";"):
            statement = "\n".join(current).strip()
            if statement.strip(";").strip():
                statements.append(statement)
            current = []
    tail = "\n".join(current).strip()
    if tail:
        statements.append(tail)
    return statements
