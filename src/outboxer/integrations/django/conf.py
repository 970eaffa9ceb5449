"""The ``OUTBOXER`` setting and the database URL outboxer derives from ``DATABASES``.

Read when used, never at import, so ``override_settings`` and test databases (whose ``NAME``
Django swaps in) are seen.
"""

from __future__ import annotations

from functools import cache
from typing import Any
from urllib.parse import quote, urlencode

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections

from outboxer.config import TableNames
from outboxer.errors import ConfigurationError
from outboxer.outbox import Outbox

__all__ = [
    "ConfiguredOutbox",
    "database_url",
    "environment",
    "outbox",
    "outbox_on",
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
    """The configured outbox (``TABLE``, ``SCHEMA``, ``DATABASE`` of ``OUTBOXER``).

    Raises:
        ImproperlyConfigured: a value that is not a name, or a ``DATABASE`` not in
            ``DATABASES``.
    """
    conf = _setting()
    database = conf.get("DATABASE", DEFAULT_DB_ALIAS)
    table, schema = conf.get("TABLE", "outbox"), conf.get("SCHEMA")
    for key, value in (("DATABASE", database), ("TABLE", table), ("SCHEMA", schema)):
        if not isinstance(value, str) and (key != "SCHEMA" or value is not None):
            raise ImproperlyConfigured(f"OUTBOXER[{key!r}] must be a string, not {value!r}")
    if database not in settings.DATABASES:
        raise ImproperlyConfigured(f"OUTBOXER['DATABASE'] {database!r} is not in DATABASES")
    try:
        return _configured(table, schema, database)
    except ConfigurationError as exc:  # an invalid table or schema name
        raise ImproperlyConfigured(f"OUTBOXER: {exc}") from None


def outbox_on(alias: str | None = None) -> ConfiguredOutbox:
    """:func:`outbox` as it is on ``connections[alias]`` (default: ``OUTBOXER["DATABASE"]``):
    SQLite has no schemas, so there ``SCHEMA`` is left out, as the dead-letter model's table
    name leaves it (a project whose PostgreSQL outbox has a schema may run its tests, or keep
    another database, on SQLite: ``migrate``, ``enqueue``, the commands and the admin use the
    plain table names there)."""
    conf = outbox()
    if conf.names.schema is not None and connections[alias or conf.database].vendor == "sqlite":
        return _configured(conf.names.table, None, conf.database)
    return conf


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
    port = str(conf.get("PORT") or "")
    if host.startswith("/"):  # a Unix socket
        query["host" if scheme == "postgresql" else "unix_socket"] = host
        if scheme == "postgresql" and port:
            query["port"] = port  # PostgreSQL names the socket file after the port
        host = port = ""
    elif ":" in host and not host.startswith("["):
        host = f"[{quote(host, safe=':')}]"  # an IPv6 address (a zone's % encoded)
    port = f":{port}" if port else ""
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
    """The first schema of a ``search_path`` set in ``OPTIONS["options"]`` (PostgreSQL: ``-c
    search_path=…``, ``-csearch_path=…``, ``--search-path=…``): where Django's migrations
    created the outbox when ``OUTBOXER["SCHEMA"]`` is not set, and so where the commands and
    the admin must look for it. Read as PostgreSQL reads it: unquoted names in lower case,
    quoted ones as they are, ``$user`` and ``pg_*`` schemas skipped."""
    connection = connections[alias or outbox().database]
    options = (connection.settings_dict.get("OPTIONS") or {}).get("options")
    if connection.vendor != "postgresql" or not isinstance(options, str):
        return None
    value = _setting_in_options(options, "search_path")
    if value is None:
        return None
    for name in _identifier_list(value):
        if name != "$user" and not name.startswith("pg_"):
            return name
    return None


def _setting_in_options(options: str, wanted: str) -> str | None:
    """The value libpq's ``options`` give the setting ``wanted`` (the last one wins)."""
    words: list[str] = []
    word, escaped, started = "", False, False
    for ch in options:  # libpq: whitespace separates, a backslash escapes the next character
        if escaped:
            word, escaped = word + ch, False
        elif ch == "\\":
            escaped = started = True
        elif ch.isspace():
            if started:
                words.append(word)
            word, started = "", False
        else:
            word, started = word + ch, True
    if started:
        words.append(word)
    found = None
    for n, arg in enumerate(words):
        if arg == "-c" and n + 1 < len(words):
            setting = words[n + 1]
        elif arg.startswith("-c") or arg.startswith("--"):
            setting = arg[2:]
        else:
            continue
        name, equals, value = setting.partition("=")
        if equals and name.strip().lower().replace("-", "_") == wanted:
            found = value
    return found


def _identifier_list(value: str) -> list[str]:
    """The names of a comma-separated list of SQL identifiers (``"My Shop", public``)."""
    names, name, quoted, n = [], "", False, 0
    while n < len(value):
        ch = value[n]
        if quoted:
            if ch == '"' and value[n + 1 : n + 2] == '"':
                name, n = name + '"', n + 1
            elif ch == '"':
                quoted = False
            else:
                name += ch
        elif ch == '"':
            quoted = True
        elif ch == ",":
            names.append(name.strip())
            name = ""
        else:
            name += ch.lower()
        n += 1
    names.append(name.strip())
    return [name for name in names if name]


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
        if (
            key in _OWN
            or value is None
            or (key == "SCHEMA" and outbox_on(alias).names.schema is None)
        ):
            continue
        if variable not in known:
            raise ImproperlyConfigured(
                f"OUTBOXER[{key!r}] is no option of the outboxer command; options: "
                f"{', '.join(sorted(v.removeprefix('OUTBOXER_') for v in known))}"
            )
        env[variable] = _variable_value(key, value)
    env["OUTBOXER_DATABASE_URL"] = database_url(alias)
    schema = search_path_schema(alias)
    if schema is not None and _setting().get("SCHEMA") is None:  # (None: as if unset)
        env["OUTBOXER_SCHEMA"] = schema
    return env


def _variable_value(key: str, value: object) -> str:
    """A setting's value as its ``OUTBOXER_*`` variable reads it: ``true``/``false``, or a
    list (``TOPICS``, ``ALLOWED_HOSTS``) as its items separated by spaces."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple | set | frozenset):
        items = [str(item) for item in value]
        if any(not item or any(ch.isspace() for ch in item) for item in items):
            raise ImproperlyConfigured(
                f"OUTBOXER[{key!r}]: a list item must be a non-empty word, not one of {items!r}"
            )
        return " ".join(items)
    if isinstance(value, dict):
        raise ImproperlyConfigured(f"OUTBOXER[{key!r}] must be a value or a list, not a dict")
    return str(value)


def tool_names(alias: str | None = None) -> TableNames:
    """The table names the admin's store uses: the configured outbox's, in the schema of a
    ``search_path`` in ``OPTIONS`` when ``OUTBOXER["SCHEMA"]`` is not set (as the commands)."""
    names = outbox_on(alias).names
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
