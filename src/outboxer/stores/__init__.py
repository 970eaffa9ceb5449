"""Store adapters, one package per database: ``postgres``, ``sqlite``, ``mysql`` (MariaDB too).

Every store package has the same shape, so a new one starts by copying it:

- ``__init__.py``: the store class, assembled from its parts, and ``from_url(url, names, *,
  connections)``, which :func:`open_store` calls;
- ``connection.py``: the connection seam: the URL's :class:`~outboxer.urls.UrlSpec`, the
  pool or connection, ``connection()``/``transaction()`` context managers, and the translation
  of driver errors into outboxer's (in that one place);
- ``relay.py``, ``sweeper.py``, ``dead_letters.py`` (with the figures), ``messages.py``,
  ``schema.py``, ``inbox.py``: one module per port of :mod:`outboxer.ports`; what they share
  (row mapping, pages, the lifecycle, the inbox purge loop) is in :mod:`outboxer.stores._common`;
- ``sql/``: versioned migrations (``0001_initial.sql`` ...) and named queries
  (``queries.sql``), loaded by :mod:`outboxer.stores._sql`;

and it passes ``tests/contracts/store.py`` and the inbox contract of
``tests/integration/test_inbox_store.py``.

This module imports no driver: :func:`open_store` imports the store's package when it is used.
"""

from __future__ import annotations

import importlib
import importlib.util

from outboxer import urls
from outboxer.config import TableNames
from outboxer.errors import ConfigurationError
from outboxer.ports import DatabaseStore

__all__ = ["open_store"]


def open_store(
    url: str, names: TableNames | None = None, *, connections: int | None = None
) -> DatabaseStore:
    """The (not yet opened) store for a database URL: ``postgresql://…``, ``sqlite:///path.db``,
    ``mysql://…`` or ``mariadb://…``.

    The scheme picks the store package (:data:`outboxer.urls.SCHEMES`); use the result as
    ``async with store:``.

    Args:
        url: The database URL; checked at once (the password never shows in an error).
        names: Table and schema names.
        connections: Connections the store may hold at once, where it has a pool (the default
            suits a relay; a consumer needs one per message it handles at a time).

    Raises:
        ConfigurationError: unsupported scheme, malformed URL, or a store whose driver (or
            whose package) is not installed.
    """
    entry = urls.lookup(url, "database")
    if importlib.util.find_spec(entry.module) is None:
        raise ConfigurationError(
            f"{urls.scheme_of(url)}:// databases are not supported by this version of outboxer"
        )
    module = urls.loader(url, "database")()
    store: DatabaseStore = module.from_url(url, names, connections=connections)
    return store
