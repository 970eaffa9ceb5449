"""Redis settings, read from a ``redis://`` URL with one declared URL spec.

One URL serves the publisher and the consumer: server, db, credentials, timeouts, client name
and TLS are shared; ``maxlen`` and ``max_connections`` only concern the publisher,
``claim_idle`` and ``block`` only the consumer. No driver is imported here.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from outboxer import urls
from outboxer.brokers.subscription import check_subscription, reconnect_backoff
from outboxer.config import Backoff
from outboxer.errors import ConfigurationError
from outboxer.urls import Option

__all__ = [
    "CONNECTION_OPTIONS",
    "CONSUMER_OPTIONS",
    "SPEC",
    "RedisConsumerSettings",
    "RedisSettings",
]

DEFAULT_PORT = 6379
CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}

#: Connection and publisher options; their names are :class:`RedisSettings` fields.
CONNECTION_OPTIONS = (
    Option("maxlen", "int", help="trim each stream to about this many entries"),
    Option("connect_timeout", "float", 5.0, help="seconds"),
    Option("socket_timeout", "float", 5.0, help="seconds"),
    Option("max_connections", "int", 16, help="pooled connections"),
    Option("client_name", default="outboxer", help="CLIENT SETNAME value"),
    Option("ssl_ca_certs", help="CA bundle (rediss:// only)"),
    Option("ssl_cert_reqs", default="required", choices=tuple(CERT_REQS)),
)
#: Consumer options; their names are :class:`RedisConsumerSettings` fields.
CONSUMER_OPTIONS = (
    Option("claim_idle", "float", 30.0, help="seconds before a stale entry is reclaimed"),
    Option("block", "float", 1.0, help="seconds one read waits"),
)
SPEC = urls.UrlSpec(
    what="redis URL",
    schemes=("redis", "rediss"),
    default_port=DEFAULT_PORT,
    default_host=None,
    path="optional",
    options=(*CONNECTION_OPTIONS, *CONSUMER_OPTIONS),
    example="redis://127.0.0.1:6379/0",
)


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """Where and how to connect, parsed from a ``redis://`` or ``rediss://`` URL.

    Build one with :meth:`from_url` and adjust it with :func:`dataclasses.replace`.

    Attributes:
        host: Server host name or address.
        port: Server port.
        db: Database number (``SELECT``); streams live in it.
        username: ACL user (Redis 6+), or None for the default user.
        password: Password; never shown by ``repr`` or in errors.
        tls: Connect with TLS (``rediss://``).
        maxlen: Trim each stream to about this many entries on every ``XADD``; None keeps all.
        connect_timeout: Seconds to open a connection (TCP, TLS and handshake).
        socket_timeout: Seconds to wait for a pipeline's replies before the broker counts as
            unavailable.
        max_connections: Pooled connections; one per concurrent ``publish`` call.
        client_name: ``CLIENT SETNAME`` value, so operators can spot the relay in ``CLIENT LIST``.
        ssl_ca_certs: CA bundle that signs the server certificate (TLS only).
        ssl_cert_reqs: Server certificate check: ``required``, ``optional`` or ``none``.
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    maxlen: int | None = None
    connect_timeout: float = 5.0
    socket_timeout: float = 5.0
    max_connections: int = 16
    client_name: str | None = "outboxer"
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: str = "required"

    def __post_init__(self) -> None:
        name = self.client_name
        # (refused, why): the first refused setting is reported.
        checks = (
            (not self.host, "a host is required, e.g. redis://127.0.0.1:6379/0"),
            (not 0 < self.port < 65536, f"port {self.port} is out of range"),
            (self.db < 0, f"database number {self.db} must be >= 0"),
            (
                self.maxlen is not None and self.maxlen < 1,
                f"maxlen={self.maxlen} must be a positive integer",
            ),
            (not self.connect_timeout > 0, "connect_timeout must be a positive number of seconds"),
            (not self.socket_timeout > 0, "socket_timeout must be a positive number of seconds"),
            (self.max_connections < 1, "max_connections must be at least 1"),
            # Redis refuses such a name in CLIENT SETNAME, which would fail every connection.
            (
                name is not None and (not name.isprintable() or " " in name),
                "client_name must not contain spaces",
            ),
            (
                self.ssl_cert_reqs not in CERT_REQS,
                f"ssl_cert_reqs={self.ssl_cert_reqs!r}: use required, optional or none",
            ),
            (
                not self.tls and self.ssl_ca_certs is not None,
                "ssl_ca_certs needs a rediss:// (TLS) URL",
            ),
        )
        for refused, why in checks:
            if refused:
                raise ConfigurationError(f"redis URL: {why}")

    @classmethod
    def from_url(cls, url: str) -> RedisSettings:
        """Parse ``redis://[[user]:password@]host[:port][/db][?options]`` (or ``rediss://``)."""
        return cls.from_parsed(urls.parse(url, SPEC))

    @classmethod
    def from_parsed(cls, url: urls.ParsedUrl) -> RedisSettings:
        """The connection settings of a parsed ``redis://`` URL (the path is the db number)."""
        db = url.path.strip("/")
        if db and not db.isdigit():
            raise ConfigurationError(
                f"redis URL: the path must be a database number such as /0, not /{db}"
            )
        values = url.values(CONNECTION_OPTIONS)
        values["client_name"] = values["client_name"] or None
        values["ssl_ca_certs"] = values["ssl_ca_certs"] or None
        return cls(
            host=url.host,
            port=url.port or DEFAULT_PORT,
            db=int(db) if db else 0,
            username=url.username,
            password=url.password,
            tls=url.scheme == "rediss",
            **values,
        )

    def safe_url(self) -> str:
        """The server's URL for log lines and errors: the password is replaced by ``***``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "rediss" if self.tls else "redis"
        netloc = f"{host}:{self.port}/{self.db}"
        return urls.safe_url(scheme, netloc, username=self.username, password=self.password)

    def connection_arguments(self) -> dict[str, Any]:
        """redis-py's connection arguments, shared by the publisher's pool and the consumer's
        client (TLS: the publisher adds ``SSLConnection``, the consumer ``ssl=True``)."""
        arguments: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "db": self.db,
            "username": self.username,
            "password": self.password,
            "client_name": self.client_name,
            "socket_connect_timeout": self.connect_timeout,
            "socket_timeout": self.socket_timeout,
            "socket_keepalive": True,
        }
        if self.tls:
            arguments["ssl_ca_certs"] = self.ssl_ca_certs
            arguments["ssl_cert_reqs"] = CERT_REQS[self.ssl_cert_reqs]
        return arguments


@dataclass(frozen=True, slots=True)
class RedisConsumerSettings:
    """A consumer group member.

    Attributes:
        connection: Server, db, credentials and TLS, parsed like the publisher's URL.
        group: The consumer group (the consumer name).
        topics: Streams to read.
        batch_size: Entries read and acknowledged together.
        claim_idle: Seconds before another member's unacknowledged entry is reclaimed.
        block: Seconds one read waits for new entries.
        reconnect: Pause between attempts while Redis is unreachable.
    """

    connection: RedisSettings
    group: str
    topics: tuple[str, ...]
    batch_size: int = 100
    claim_idle: float = 30.0
    block: float = 1.0
    reconnect: Backoff = field(default_factory=reconnect_backoff)

    def __post_init__(self) -> None:
        check_subscription("Redis", self.group, self.topics, "stream")
        if self.claim_idle <= 0:
            raise ConfigurationError("redis URL: claim_idle must be a positive number of seconds")
        if not 0 < self.block < self.connection.socket_timeout:
            raise ConfigurationError(
                "redis URL: block must be positive and below socket_timeout "
                f"({self.connection.socket_timeout:g} s)"
            )

    @classmethod
    def from_url(
        cls, url: str, *, name: str, topics: Sequence[str], batch_size: int = 100
    ) -> RedisConsumerSettings:
        """The publisher's ``redis://`` URL plus the consumer options (module docstring)."""
        parsed = urls.parse(url, SPEC)
        return cls(
            connection=RedisSettings.from_parsed(parsed),
            group=name,
            topics=tuple(topics),
            batch_size=batch_size,
            **parsed.values(CONSUMER_OPTIONS),
        )
