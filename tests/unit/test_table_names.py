"""Every name the database derives from an outbox's table and schema names fits its limit.

PostgreSQL truncates an identifier longer than 63 bytes (with a notice, not an error), so two
derived names can become one ("relation already exists" at `db upgrade`) and a LISTEN on a
truncated channel never hears the NOTIFY. TableNames refuses, where a name is accepted, any
name whose derived names would not fit.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest

from outboxer.config import MAX_IDENTIFIER, MAX_MYSQL_IDENTIFIER, MAX_TABLE_NAME, TableNames
from outboxer.errors import ConfigurationError
from outboxer.stores import _sql

# "{t}_something" (`{t}_something` on MySQL): an index or trigger named after the table
_DERIVED = re.compile(r'"\{t\}(\w*)"')
_MYSQL_DERIVED = re.compile(r"`\{t\}(\w*)`")


def derived_suffixes(pattern: re.Pattern[str] = _DERIVED) -> set[str]:
    """The suffix of every name derived from the table, in every dialect's SQL files."""
    suffixes = set()
    for store in resources.files("outboxer.stores").iterdir():
        files = store.joinpath("sql")
        if not files.is_dir():
            continue
        for sql in files.iterdir():
            if sql.name.endswith(".sql"):
                suffixes.update(pattern.findall(sql.read_text()))
    return suffixes


def test_every_mysql_name_of_the_longest_accepted_table_fits() -> None:
    """MySQL refuses a name over 64 characters: found by a probe, a table name of 42-43
    characters passed, and `db upgrade` stopped half-way (two versions applied)."""
    suffixes = derived_suffixes(_MYSQL_DERIVED)
    assert "_inbox_failures_message" in suffixes  # the scan finds the names it is meant to check
    longest = "t" * MAX_TABLE_NAME
    assert TableNames(table=longest).table == longest
    too_long = {longest + s for s in suffixes if len(longest + s) > MAX_MYSQL_IDENTIFIER}
    assert not too_long


def test_every_derived_name_of_the_longest_accepted_table_fits() -> None:
    suffixes = derived_suffixes()
    assert "_inbox_failures_dead" in suffixes  # the scan finds the names it is meant to check
    names = TableNames(table="t" * MAX_TABLE_NAME, schema="s" * (53 - MAX_TABLE_NAME))
    tables = {
        value.split(".")[-1].strip('"')
        for key, value in _sql.placeholders(names).items()
        if key not in ("t", "channel")
    }
    derived = {names.table + suffix for suffix in suffixes} | tables | {names.channel}
    too_long = {name for name in derived if len(name.encode()) > MAX_IDENTIFIER}
    assert not too_long
    assert len(names.channel) == MAX_IDENTIFIER  # the limit is reached, not merely respected


@pytest.mark.parametrize(
    ("table", "schema"),
    [
        ("t" * (MAX_TABLE_NAME + 1), None),  # <table>_inbox_failures_dead would be truncated
        ("t" * 40, "s" * 14),  # outboxer.<schema>.<table> over 63: the NOTIFY would fail
        ("t" * 63, None),
    ],
)
def test_names_whose_derived_names_cannot_fit_are_refused(table: str, schema: str | None) -> None:
    with pytest.raises(ConfigurationError, match="invalid"):
        TableNames(table=table, schema=schema)
