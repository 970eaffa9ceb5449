"""``manage.py outboxer relay|consume|stats|dlq|messages ...``: the ``outboxer`` command on this
project's database.

The command line is the ``outboxer`` command's, parsed by it (``manage.py outboxer relay
--help`` lists the relay's options). Options not given come from the environment as usual, then
from the settings: the database URL from ``DATABASES[OUTBOXER["DATABASE"]]``, the other keys of
``OUTBOXER`` as the ``OUTBOXER_*`` variables they name, so no URL is written twice.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand

from outboxer.integrations.django.conf import environment


@contextmanager
def _settings_as_environment() -> Iterator[None]:
    """The settings' ``OUTBOXER_*`` values where the environment has none, for one command."""
    added = {name: value for name, value in environment().items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


#: Options of every management command that Django's ManagementUtility has applied already
#: (DJANGO_SETTINGS_MODULE, sys.path) before the command runs: not outboxer's to parse.
_DJANGO_OPTIONS = ("--settings", "--pythonpath")


def _without_django_options(arguments: list[str]) -> list[str]:
    """``arguments`` without ``--settings X`` / ``--settings=X`` / ``--pythonpath ...``."""
    kept: list[str] = []
    skip = False
    for argument in arguments:
        if skip:
            skip = False
        elif argument in _DJANGO_OPTIONS:
            skip = True
        elif not argument.startswith(tuple(f"{option}=" for option in _DJANGO_OPTIONS)):
            kept.append(argument)
    return kept


class Command(BaseCommand):
    help = "outboxer's command (relay, consume, stats, dlq, messages) on this project's database."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("arguments", nargs=argparse.REMAINDER, help="outboxer's arguments")

    def run_from_argv(self, argv: list[str]) -> None:
        # outboxer's parser gets the whole command line (its --help and its errors included)
        prog_name = f"{os.path.basename(argv[0])} {argv[1]}"
        try:
            self._outboxer(_without_django_options(argv[2:]), prog_name)
        except ImproperlyConfigured as exc:  # a setting the command cannot take: one line
            sys.stderr.write(f"{prog_name}: error: {exc}\n")
            sys.exit(2)

    def handle(self, *args: Any, **options: Any) -> None:
        self._outboxer(list(options["arguments"]), "manage.py outboxer")

    def _outboxer(self, arguments: list[str], prog_name: str) -> None:
        from outboxer.cli import invoke

        with _settings_as_environment():
            invoke(arguments, prog_name)
