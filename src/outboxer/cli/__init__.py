"""The ``outboxer`` command.

This is the composition point: it reads options and ``OUTBOXER_*`` environment variables, builds
the store and publisher from their URLs and hands them to the relay. Every failure the user can
cause ends in one readable line on stderr and a non-zero exit, never a traceback.

One module per command group; this one holds the ``main`` group and the console entry point
(``[project.scripts] outboxer = "outboxer.cli:run"``).
"""

from __future__ import annotations

import logging
import sys

import click

from outboxer.cli._common import errors_as_one_line
from outboxer.cli.broker import broker
from outboxer.cli.consume import consume
from outboxer.cli.db import db
from outboxer.cli.demo import demo
from outboxer.cli.dlq import dlq
from outboxer.cli.messages import messages
from outboxer.cli.options import env_option
from outboxer.cli.relay import relay
from outboxer.cli.serve import serve
from outboxer.cli.stats import stats

__all__ = ["invoke", "main", "run"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="outboxer")
@env_option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@env_option(
    "--log-format",
    default="text",
    show_default=True,
    type=click.Choice(["text", "json"], case_sensitive=False),
    help="json: one JSON object per line (time, level, logger, message, extra fields).",
)
def main(log_level: str, log_format: str) -> None:
    """outboxer: a transactional outbox. Every option can also be set by the OUTBOXER_*
    environment variable shown beside it."""
    from outboxer.observability.logging import configure_logging

    # Both formats redact passwords in URLs and tokens (docs/observability.md).
    configure_logging(log_level, log_format.lower())
    # pika logs several ERROR lines per failed connection attempt; the RabbitMQ publisher
    # reports each outage in one line of its own.
    logging.getLogger("pika").setLevel(logging.CRITICAL)


for command in (db, relay, stats, dlq, messages, broker, demo, consume, serve):
    main.add_command(command)


def run() -> None:
    """Console entry point: every failure, usage errors included (click prints three lines),
    becomes one line and the exit code docs/operations.md gives."""
    sys.exit(invoke())


def invoke(args: list[str] | None = None, prog_name: str | None = None) -> int:
    """Run the ``outboxer`` command on ``args`` (default: ``sys.argv``) and return its exit code
    when it succeeds; a failure prints one line and raises ``SystemExit`` (as :func:`run`).
    ``manage.py outboxer`` of the Django app calls it with its own ``prog_name``."""
    with errors_as_one_line():
        code = main.main(args, prog_name=prog_name, standalone_mode=False)
    return code if isinstance(code, int) else 0
