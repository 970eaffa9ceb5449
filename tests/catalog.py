"""The outbox schema as the database's catalog describes it, to compare two installs.

Tests of every way of applying the schema (``db upgrade``, ``db sql``'s script, Alembic, the
Django app's migrations) compare what the catalog holds, not the statements sent: columns with
types, nullability and defaults, indexes, constraints, triggers, functions, table options, and
the versions recorded. Only the outbox's objects count (those named after its table, so a
project's own tables beside it are left out), and the schema's own name is replaced by ``S``
so two schemas compare.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pymysql

_PG = {
    "columns": "SELECT table_name, column_name, data_type, is_nullable, column_default, "
    "is_identity FROM information_schema.columns WHERE table_schema = %(s)s",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %(s)s",
    "constraints": "SELECT c.relname, k.conname, pg_get_constraintdef(k.oid) FROM pg_constraint k "
    "JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %(s)s",
    "triggers": "SELECT tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c "
    "ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %(s)s AND NOT t.tgisinternal",
    "functions": "SELECT proname, prosrc FROM pg_proc p JOIN pg_namespace n "
    "ON n.oid = p.pronamespace WHERE n.nspname = %(s)s",
    "tables": "SELECT relname, relkind, reloptions FROM pg_class c JOIN pg_namespace n "
    "ON n.oid = c.relnamespace WHERE n.nspname = %(s)s",
}

_MYSQL = {
    "columns": "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT, EXTRA, "
    "COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %(s)s",
    "indexes": "SELECT TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX, COLUMN_NAME, NON_UNIQUE, SUB_PART "
    "FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %(s)s",
    "tables": "SELECT TABLE_NAME, ENGINE, TABLE_COLLATION FROM information_schema.TABLES "
    "WHERE TABLE_SCHEMA = %(s)s",
}


def _sorted(rows: Any, schema: str, table: str) -> list[tuple[str, ...]]:
    return sorted(
        tuple(str(value).replace(schema, "S") for value in row)
        for row in rows
        if str(row[0]).startswith(table)
    )


def postgres(url: str, schema: str, table: str = "outbox") -> dict[str, Any]:
    """The catalog of the outbox tables in ``schema``."""
    with psycopg.connect(url, autocommit=True) as conn:
        # definitions name what is outside the search path with its schema: the same for both
        conn.execute(f'SET search_path TO "{schema}"')  # type: ignore[arg-type]
        found = {
            name: _sorted(conn.execute(sql, {"s": schema}), schema, table)
            for name, sql in _PG.items()
        }
        found["versions"] = _versions(
            conn.execute(f'SELECT version FROM "{schema}"."{table}_schema_version"')
        )
    return found


def mysql(database: str, table: str = "outbox") -> dict[str, Any]:
    """The catalog of the outbox tables in ``database`` on the test server."""
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cursor:
            found = {}
            for name, sql in _MYSQL.items():
                cursor.execute(sql, {"s": database})
                found[name] = _sorted(cursor.fetchall(), database, table)
            cursor.execute(f"SELECT version FROM `{database}`.`{table}_schema_version`")
            found["versions"] = _versions(cursor.fetchall())
    finally:
        conn.close()
    return found


def sqlite(path: Path | str, table: str = "outbox") -> dict[str, Any]:
    """The catalog of the outbox tables in the SQLite file at ``path``."""
    conn = sqlite3.connect(path)
    try:
        found: dict[str, Any] = {
            "objects": sorted(
                conn.execute(
                    "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name LIKE ?",
                    (f"{table}%",),
                )
            )
        }
        found["versions"] = _versions(conn.execute(f'SELECT version FROM "{table}_schema_version"'))
    finally:
        conn.close()
    return found


def _versions(rows: Any) -> list[int]:
    return sorted(int(row[0]) for row in rows)
