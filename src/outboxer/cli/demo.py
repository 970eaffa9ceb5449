"""``outboxer demo``: the order pipeline on SQLite, no services needed."""

from __future__ import annotations

import logging

import click

from outboxer.cli._common import run_async


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

    logging.getLogger("outboxer").setLevel(logging.ERROR)  # the demo narrates itself
    run_async(demo_module.run(database))
