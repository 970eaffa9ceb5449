"""``outboxer db``: schema management."""

from __future__ import annotations

import asyncio

import click

from outboxer.cli._common import open_store
from outboxer.cli.options import database_options, database_url_help, env_option, names_options
from outboxer.config import TableNames
from outboxer.errors import ConfigurationError
from outboxer.stores import ddl


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


@db.command("sql")
@env_option("--database-url", default=None, help=f"{database_url_help} (only its scheme is used)")
@click.option(
    "--dialect",
    type=click.Choice(sorted(ddl.DIALECTS)),
    default=None,
    help="Instead of --database-url.",
)
@click.option(
    "--from-version",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="The schema version installed (0: none, a fresh install).",
)
@names_options
def db_sql(
    database_url: str | None, dialect: str | None, from_version: int, schema: str | None, table: str
) -> None:
    """Print the DDL 'db upgrade' would apply, to review it or apply it yourself.

    Nothing is connected to. The script records the versions it applies, so 'db upgrade' and
    the relay find the schema current afterwards.
    """
    if (database_url is None) == (dialect is None):
        raise ConfigurationError("give either --database-url or --dialect")
    target = ddl.dialect_of(dialect or database_url or "")
    click.echo(ddl.upgrade_script(target, TableNames(table=table, schema=schema), from_version))
