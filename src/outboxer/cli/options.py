"""Options shared by several commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def env_option(*declarations: str, **attributes: Any) -> Callable[[F], F]:
    """``click.option`` that also reads ``OUTBOXER_<NAME>`` and shows it in ``--help``."""
    name = declarations[0].lstrip("-").replace("-", "_").upper()
    attributes.setdefault("envvar", f"OUTBOXER_{name}")
    attributes.setdefault("show_envvar", True)
    decorator: Callable[[F], F] = click.option(*declarations, **attributes)
    return decorator


def database_options(function: F) -> F:
    """``--database-url``, ``--schema``, ``--table``, shared by every command that needs a DB."""
    options = [
        env_option(
            "--database-url",
            required=True,
            help="postgresql://user@host/db or sqlite:///path.db",
        ),
        env_option(
            "--schema",
            default=None,
            help="Schema of the outbox tables (PostgreSQL). Default: the connection's.",
        ),
        env_option(
            "--table",
            default="outbox",
            show_default=True,
            help="Outbox table name; the other tables are named after it.",
        ),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def json_option(function: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(function)
