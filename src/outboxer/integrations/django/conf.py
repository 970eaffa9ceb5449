"""The ``OUTBOXER`` setting and the database URL outboxer derives from ``DATABASES``.

Read when used, never at import, so ``override_settings`` and test databases (whose ``NAME``
Django swaps in) are seen.
"""

from __future__ import annotations

from functools import cache
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections

from outboxer.outbox import Outbox

__all__ = ["ConfiguredOutbox", "database_url", "environment", "outbox"]

#: Keys of ``OUTBOXER`` that are not options of the ``outboxer`` command.
_OWN = frozenset({"DATABASE"})


class ConfiguredOutbox(Outbox):
    """The outbox of the ``OUTBOXER`` setting, and the database alias it lives in."""

    def __init__(self, table: str, schema: str | None, database: str) -> None:
        super().__init__(table, schema)
        self.database = database


def _setting() -> dict[str, Any]:
    value = getattr(settings, "OUTBOXER", {})
    if not isinstance(value, dict):
        raise ImproperlyConfigured("OUTBOXER must be a dict")
    return value


def outbox() -> ConfiguredOutbox:
    """The configured outbox (``TABLE``, ``SCHEMA``, ``DATABASE`` of ``OUTBOXER``)."""
    conf = _setting()
    database = conf.get("DATABASE", DEFAULT_DB_ALIAS)
    if database not in settings.DATABASES:
        raise ImproperlyConfigured(f"OUTBOXER['DATABASE'] {database!r} is not in DATABASES")
    return _configured(conf.get("TABLE", "outbox"), conf.get("SCHEMA"), database)


@cache
def _configured(table: str, schema: str | None, database: str) -> ConfiguredOutbox:
    # one per setting: the names are validated once, not at every enqueue
    return ConfiguredOutbox(table, schema, database)


def database_url(alias: str | None = None) -> str:
    """The outboxer URL of ``DATABASES[alias]`` (default: ``OUTBOXER["DATABASE"]``), for the
    commands and the admin: PostgreSQL, MySQL/MariaDB or an SQLite file.

    Raises:
        ImproperlyConfigured: an in-memory SQLite database or another backend.
    """
    connection = connections[alias or outbox().database]
    conf = connection.settings_dict
    if connection.vendor == "sqlite":
        name = str(conf["NAME"])
        if name == ":memory:" or name.startswith("file:"):
            raise ImproperlyConfigured(
                f"outboxer's relay cannot share the in-memory SQLite database {name!r}: use a file"
            )
        return f"sqlite:///{name}"
    scheme = {"postgresql": "postgresql", "mysql": "mysql"}.get(connection.vendor)
    if scheme is None:
        raise ImproperlyConfigured(f"outboxer has no store for Django's {connection.vendor!r}")
    user = quote(str(conf.get("USER") or ""), safe="")
    password = quote(str(conf.get("PASSWORD") or ""), safe="")
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    port = f":{conf['PORT']}" if conf.get("PORT") else ""
    return f"{scheme}://{credentials}{conf.get('HOST') or ''}{port}/{quote(str(conf['NAME']))}"


def environment(alias: str | None = None) -> dict[str, str]:
    """The ``OUTBOXER_*`` variables the ``outboxer`` command reads, from the settings: the
    database URL, table and schema, and every other key of ``OUTBOXER``.

    Raises:
        ImproperlyConfigured: a key that is no option of the ``outboxer`` command.
    """
    from outboxer.cli import main

    known = _variables(main)
    env = {}
    for key, value in _setting().items():
        variable = f"OUTBOXER_{key.upper().replace('-', '_')}"
        if key in _OWN or value is None:
            continue
        if variable not in known:
            raise ImproperlyConfigured(
                f"OUTBOXER[{key!r}] is no option of the outboxer command; options: "
                f"{', '.join(sorted(v.removeprefix('OUTBOXER_') for v in known))}"
            )
        env[variable] = str(value).lower() if isinstance(value, bool) else str(value)
    env["OUTBOXER_DATABASE_URL"] = database_url(alias)
    return env


def _variables(command: Any) -> set[str]:
    """Every ``OUTBOXER_*`` variable of a click command and its subcommands."""
    found = {p.envvar for p in command.params if isinstance(getattr(p, "envvar", None), str)}
    for sub in getattr(command, "commands", {}).values():
        found |= _variables(sub)
    return found
