"""HTTP webhook settings, read from an ``http(s)://`` URL with one declared URL spec.

The URL is the receiver's: only the query parameters named ``outboxer_*`` are options (the
spec's ``option_prefix``); every other parameter is the receiver's own and is sent byte for
byte. Keyword arguments of :class:`~outboxer.brokers.http.publisher.HttpPublisher` win over URL
options. The signing secret is never read from the URL (URLs end up in logs).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from outboxer import urls
from outboxer.brokers.http import wire
from outboxer.errors import ConfigurationError
from outboxer.urls import Option

__all__ = ["OPTIONS", "SPEC", "HttpSettings"]

#: The ``outboxer_*`` options; without the prefix, their names are :class:`HttpSettings` fields.
OPTIONS = (
    Option("outboxer_concurrency", "int", 64, help="requests in flight at once"),
    Option("outboxer_timeout", "float", 10.0, help="seconds to wait for the response"),
    Option("outboxer_connect_timeout", "float", 5.0, help="seconds to connect"),
    Option("outboxer_source", default="outboxer", help="the CloudEvents source attribute"),
)
#: Declared only to be refused with a reason (and masked in that error).
_SECRET = Option("outboxer_secret", secret=True)
SPEC = urls.UrlSpec(
    what="HTTP publisher URL",
    schemes=("http", "https"),
    path="optional",
    options=(*OPTIONS, _SECRET),
    option_prefix="outboxer_",
    example="https://hooks.example.com/outbox",
)


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """Validated settings of an :class:`~outboxer.brokers.http.publisher.HttpPublisher`.

    Attributes:
        endpoint: The URL to POST to, ``outboxer_*`` options removed; may contain ``{topic}``.
            Not shown in ``repr`` (it may carry credentials); see :attr:`display_endpoint`.
        secret: HMAC-SHA256 key for the ``webhook-signature`` header; ``None`` sends none.
        source: The CloudEvents ``source`` attribute.
        concurrency: Requests in flight at once, and the size of the connection pool.
        timeout: Seconds to wait for a response (read) or to send a request (write).
        connect_timeout: Seconds to establish a connection (TCP and TLS).
        headers: Static headers sent with every request (e.g. ``Authorization``); hidden from
            ``repr`` and reserved against message headers.
        verify: TLS verification: ``True`` (system/certifi CAs), ``False``, a CA bundle file or
            directory, or an ``ssl.SSLContext`` (e.g. with a client certificate for mTLS).
    """

    endpoint: str = field(repr=False)
    secret: bytes | None = field(default=None, repr=False)
    source: str = "outboxer"
    concurrency: int = 64
    timeout: float = 10.0
    connect_timeout: float = 5.0
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    verify: bool | str | ssl.SSLContext = True

    def __post_init__(self) -> None:
        if not self.source:
            raise ConfigurationError("HTTP publisher: source must not be empty")
        if self.secret is not None and not self.secret:
            raise ConfigurationError("HTTP publisher: secret must not be empty")
        for name in ("concurrency", "timeout", "connect_timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigurationError(f"HTTP publisher: {name} must be positive, got {value!r}")
        for name, value in self.headers.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise ConfigurationError("HTTP publisher: header names and values are strings")
            problem = wire.header_problem(name, value)
            if problem is not None:
                raise ConfigurationError(f"HTTP publisher: static {problem}")
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))

    @classmethod
    def from_url(cls, url: str, **given: Any) -> HttpSettings:
        """Settings from ``http(s)://host[:port]/path[?outboxer_concurrency=N&...]``; the
        keyword arguments that are not ``None`` win over the URL's options."""
        parsed = urls.parse(url, SPEC)
        if _SECRET.name in parsed.given:
            raise ConfigurationError(
                "HTTP publisher: the signing secret is not taken from the URL (URLs get "
                "logged); pass secret= or set OUTBOXER_WEBHOOK_SECRET"
            )
        options = {
            name.removeprefix("outboxer_"): value for name, value in parsed.values(OPTIONS).items()
        }
        options.update({name: value for name, value in given.items() if value is not None})
        return cls(endpoint=_endpoint(parsed), **options)

    @property
    def display_endpoint(self) -> str:
        """The endpoint without user info and query string, safe to log."""
        parts = urlsplit(self.endpoint)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{host}:{parts.port}" if parts.port is not None else host
        return urlunsplit((parts.scheme, netloc, parts.path, "..." if parts.query else "", ""))


def _endpoint(url: urls.ParsedUrl) -> str:
    """The URL to POST to: as written, without the options, with at least the path ``/``."""
    base = url.url.partition("?")[0]
    after_credentials = base.partition("://")[2].rpartition("@")[2]
    if "/" not in after_credentials:
        base += "/"
    return base + ("?" + url.kept_query if url.kept_query else "")
