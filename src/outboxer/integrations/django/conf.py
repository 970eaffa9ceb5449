"""The ``OUTBOXER`` setting and the database URL outboxer derives from ``DATABASES``.

Read when used, never at import, so ``override_settings`` and test databases (whose ``NAME``
Django swaps in) are seen.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any
from urllib.parse import quote, urlencode

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections

from outboxer.config import TableNames
from outboxer.outbox import Outbox

__all__ = [
    "ConfiguredOutbox",
    "database_url",
    "environment",
    "outbox",
    "search_path_schema",
    "tool_names",
]

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
    commands and the admin: PostgreSQL, MySQL/MariaDB or an SQLite file. A ``HOST`` that is a
    path is a Unix socket (a directory on PostgreSQL, the socket file on MySQL, or
    ``OPTIONS["unix_socket"]``); the ``OPTIONS`` the store's URL knows (TLS, timeouts,
    ``application_name``, ``target_session_attrs``) are carried, the others are Django's.

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
    options = dict(conf.get("OPTIONS") or {})
    carried = _PG_OPTIONS if scheme == "postgresql" else _MYSQL_OPTIONS
    query = {key: str(options[key]) for key in carried if options.get(key) is not None}
    host = str(conf.get("HOST") or "")
    if host.startswith("/"):  # a Unix socket
        query["host" if scheme == "postgresql" else "unix_socket"] = host
        host = ""
    elif ":" in host:
        host = f"[{host}]"  # an IPv6 address
    port = f":{conf['PORT']}" if conf.get("PORT") and host else ""
    tail = f"?{urlencode(query, quote_via=quote)}" if query else ""
    return f"{scheme}://{credentials}{host}{port}/{quote(str(conf['NAME']))}{tail}"


#: ``OPTIONS`` of a Django database that the store's URL takes as they are.
_PG_OPTIONS = (
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "application_name",
    "target_session_attrs",
    "connect_timeout",
)
_MYSQL_OPTIONS = ("unix_socket", "connect_timeout")


def search_path_schema(alias: str | None = None) -> str | None:
    """The first schema of a ``-c search_path=…`` in ``OPTIONS["options"]`` (PostgreSQL): where
    Django's migrations created the outbox when ``OUTBOXER["SCHEMA"]`` is not set, and so
    where the commands and the admin must look for it."""
    connection = connections[alias or outbox().database]
    options = str((connection.settings_dict.get("OPTIONS") or {}).get("options") or "")
    found = re.search(r"(?:-c\s*|--)search_path\s*=\s*([^\s,]+)", options)
    if connection.vendor != "postgresql" or found is None:
        return None
    schema = found.group(1).strip("'\"")
    return None if schema == "$user" else schema


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
    schema = search_path_schema(alias)
    if schema is not None and "SCHEMA" not in _setting():
        env["OUTBOXER_SCHEMA"] = schema
    return env


def tool_names(alias: str | None = None) -> TableNames:
    """The table names the admin's store uses: the configured outbox's, in the schema of a
    ``search_path`` in ``OPTIONS`` when ``OUTBOXER["SCHEMA"]`` is not set (as the commands)."""
    names = outbox().names
    if names.schema is None:
        schema = search_path_schema(alias)
        if schema is not None:
            return TableNames(table=names.table, schema=schema)
    return names


def _variables(command: Any) -> set[str]:
    """Every ``OUTBOXER_*`` variable of a click command and its subcommands."""
    found = {p.envvar for p in command.params if isinstance(getattr(p, "envvar", None), str)}
    for sub in getattr(command, "commands", {}).values():
        found |= _variables(sub)
    return found
