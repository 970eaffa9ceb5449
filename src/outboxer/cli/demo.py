"""``outboxer demo``: the order pipeline on SQLite, no services needed."""

from __future__ import annotations

import asyncio
import logging

import click


@click.command()
@click.option(
    "--database",
    "database",
    default=None,
    type=click.Path(dir_okay=False),
    help="SQLite file to use (default: a fresh temporary file).",
)
def demo(database: str | None) -> None:
    """The order pipeline and welcome e-mails on SQLite with in-process handlers."""
    from outboxer import demo as demo_module

    logging.getLogger("outboxer").setLevel(logging.CRITICAL)  # the demo narrates itself
    asyncio.run(demo_module.run(database))
