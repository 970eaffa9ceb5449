"""The asyncpg writer: ``$n`` parameters, binary COPY for many rows.

``insert_many`` sends the rows with ``copy_records_to_table`` (binary COPY): one statement,
measured ≈ 2.5× faster than ``executemany`` and ≈ 2× faster than an ``INSERT ... SELECT FROM
unnest($1::text[], ...)``. COPY fires the same statement trigger (the NOTIFY doorbell) and
fills the same defaults as INSERT; it cannot compute ``COALESCE(available_at, now())``, so a
batch with a delayed message uses ``executemany`` (pipelined by asyncpg: one round trip).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Literal

import asyncpg

from outboxer.config import TableNames
from outboxer.message import Row
from outboxer.writers import insert_into

__all__ = ["ASYNC", "AsyncpgWriter"]

_COPIED = Row._fields[:-1]  # all but available_at, which COPY leaves to its default


@cache
def _insert(names: TableNames) -> str:
    return insert_into(
        names, "VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, COALESCE($8::timestamptz, now()))"
    )


class AsyncpgWriter:
    """``asyncpg.Connection`` or a pool's connection proxy, in its open transaction (outside
    one, asyncpg commits each statement on its own)."""

    is_async: Literal[True] = True

    async def insert(self, conn: asyncpg.Connection, names: TableNames, row: Row) -> None:
        await conn.execute(_insert(names), *row)

    async def insert_many(
        self, conn: asyncpg.Connection, names: TableNames, rows: Sequence[Row]
    ) -> None:
        if any(row.available_at is not None for row in rows):
            await conn.executemany(_insert(names), rows)
            return
        await conn.copy_records_to_table(
            names.table,
            schema_name=names.schema,
            columns=_COPIED,
            records=[row[:-1] for row in rows],
        )

    def joins_transaction(self, conn: asyncpg.Connection) -> bool:
        # SQLAlchemy's asyncpg adapter opens its transaction lazily, at its first statement:
        # before that, a statement sent here would commit on its own.
        return conn.is_in_transaction()


ASYNC = AsyncpgWriter()
