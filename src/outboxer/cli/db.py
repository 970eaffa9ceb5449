"""``outboxer db``: schema management."""

from __future__ import annotations

import asyncio

import click

from outboxer.cli._common import open_store
from outboxer.cli.options import database_options
from outboxer.config import TableNames


@click.group()
def db() -> None:
    """Schema management."""


@db.command("upgrade")
@database_options
def db_upgrade(database_url: str, schema: str | None, table: str) -> None:
    """Create or migrate the outbox schema (idempotent)."""
    names = TableNames(table=table, schema=schema)

    async def upgrade() -> list[int]:
        async with open_store(database_url, names, check=False) as store:
            applied: list[int] = await store.migrate()
            return applied

    applied = asyncio.run(upgrade())
    if applied:
        click.echo(f"outbox schema upgraded to version {applied[-1]} (applied {applied})")
    else:
        click.echo("outbox schema is up to date")
