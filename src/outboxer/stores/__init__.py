"""Store adapters. ``open_store`` picks one by database URL and imports its driver lazily."""

from __future__ import annotations

from typing import TYPE_CHECKING

from outboxer.config import TableNames
from outboxer.errors import ConfigurationError

if TYPE_CHECKING:
    from outboxer.stores.mysql import MysqlStore
    from outboxer.stores.postgres import PostgresStore
    from outboxer.stores.sqlite import SqliteStore

__all__ = ["store_from_url"]


def store_from_url(
    url: str, names: TableNames | None = None
) -> PostgresStore | SqliteStore | MysqlStore:
    """A (not yet opened) store for ``postgresql://…``, ``sqlite:///path.db`` or
    ``mysql://…``/``mariadb://…``."""
    scheme = url.partition("://")[0].split("+")[0].lower() if "://" in url else ""
    if scheme in ("postgresql", "postgres"):
        from outboxer.stores.postgres import PostgresStore

        return PostgresStore(url, names)
    if scheme == "sqlite":
        from outboxer.stores.sqlite import SqliteStore

        return SqliteStore(url, names)
    if scheme in ("mysql", "mariadb"):
        from outboxer.stores.mysql import MysqlStore

        return MysqlStore(url, names)
    raise ConfigurationError(
        f"unsupported database URL {_redact(url)!r}: "
        "use postgresql://…, mysql://… or sqlite:///path.db"
    )


def _redact(url: str) -> str:
    """Never echo a password: ``scheme://user:***@host``."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        creds, _, host = rest.rpartition("@")
        user = creds.split(":")[0]
        return f"{scheme}://{user}:***@{host}"
    return url
