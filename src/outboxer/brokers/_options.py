"""Typed reading of broker URL query options, shared by the adapters (no driver imports)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import overload
from urllib.parse import unquote

from outboxer.errors import ConfigurationError


class QueryOptions:
    """The ``?name=value`` options of a broker URL, read with one readable error each.

    Args:
        what: How errors name the URL, e.g. ``"kafka URL"``.
        options: The options, one value per name.
    """

    def __init__(self, what: str, options: Mapping[str, str]) -> None:
        self.what = what
        self.options = options

    @overload
    def int(self, name: str) -> int | None: ...
    @overload
    def int(self, name: str, default: int) -> int: ...
    def int(self, name: str, default: int | None = None) -> int | None:
        raw = self.options.get(name)
        if raw is None:
            return default
        try:
            return int(raw)
        except ValueError:
            raise ConfigurationError(f"{self.what}: {name}={raw!r} is not an integer") from None

    def float(self, name: str, default: float) -> float:
        raw = self.options.get(name)
        if raw is None:
            return default
        try:
            return float(raw)
        except ValueError:
            raise ConfigurationError(f"{self.what}: {name}={raw!r} is not a number") from None

    def bool(self, name: str, default: bool) -> bool:
        raw = self.options.get(name)
        if raw is None:
            return default
        value = raw.strip().lower()
        if value in ("true", "1", "yes", "on"):
            return True
        if value in ("false", "0", "no", "off"):
            return False
        raise ConfigurationError(f"{self.what}: {name}={raw!r}: use true or false")


def split_options(url: str, names: Sequence[str]) -> tuple[str, dict[str, str]]:
    """Take the consumer-only query options ``names`` out of ``url``.

    Returns the URL without them (for the publisher's settings parser, which knows the
    connection options and refuses unknown ones) and the options found.

    Raises:
        ConfigurationError: an option is given twice.
    """
    base, sep, query = url.partition("?")
    if not sep:
        return url, {}
    query, hash_, fragment = query.partition("#")
    kept: list[str] = []
    found: dict[str, str] = {}
    for part in query.split("&"):
        if not part:
            continue
        key, _, value = part.partition("=")
        if key in names:
            if key in found:
                raise ConfigurationError(f"broker URL option {key!r} is given more than once")
            found[key] = unquote(value)
        else:
            kept.append(part)
    rebuilt = base + ("?" + "&".join(kept) if kept else "") + (hash_ + fragment)
    return rebuilt, found
