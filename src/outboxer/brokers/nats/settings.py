"""NATS settings, read from a ``nats://`` URL with one declared URL spec.

One URL serves the publisher and the consumer: servers, credentials, ``name``,
``connect_timeout`` and ``tls_ca_file`` are shared; ``source``, ``ack_timeout`` and
``max_pending`` only concern the publisher, ``ack_wait`` and ``max_ack_pending`` only the
consumer. No driver is imported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from outboxer import urls
from outboxer.brokers.subscription import check_subscription, reconnect_backoff
from outboxer.config import Backoff
from outboxer.errors import ConfigurationError
from outboxer.urls import Option

__all__ = ["CONNECTION_OPTIONS", "CONSUMER_OPTIONS", "SPEC", "NatsConsumerSettings", "NatsSettings"]

DEFAULT_PORT = 4222

#: Connection and publisher options; their names are :class:`NatsSettings` fields.
CONNECTION_OPTIONS = (
    Option("source", default="outboxer", help="CloudEvents source of every message"),
    Option("ack_timeout", "float", 5.0, help="seconds a publish call waits for its PubAcks"),
    Option("connect_timeout", "float", 2.0, help="seconds per connection attempt"),
    Option("max_pending", "int", 4096, help="un-acknowledged messages in flight"),
    Option("name", default="outboxer", help="client name shown by the server"),
    Option("tls_ca_file", help="CA bundle of a TLS server signed by a private CA"),
)
#: Consumer options; their names are :class:`NatsConsumerSettings` fields.
CONSUMER_OPTIONS = (
    Option("ack_wait", "float", 30.0, help="seconds before an unacknowledged redelivery"),
    Option("max_ack_pending", "int", 0, help="unacknowledged messages (0: twice the batch)"),
)
SPEC = urls.UrlSpec(
    what="NATS URL",
    schemes=("nats",),
    hosts="many",
    default_port=DEFAULT_PORT,
    default_host=None,
    options=(*CONNECTION_OPTIONS, *CONSUMER_OPTIONS),
    example="nats://127.0.0.1:4222",
)


@dataclass(frozen=True, slots=True)
class NatsSettings:
    """How :class:`NatsPublisher` connects and publishes.

    Attributes:
        servers: ``nats://host:port`` entries without credentials.
        user: User name, or ``None``.
        password: Password for ``user``; never logged or shown in errors.
        token: Authentication token (``nats://token@host``); never logged or shown in errors.
        source: CloudEvents ``source`` attribute of every message.
        ack_timeout: Seconds one ``publish()`` call waits for all its PubAcks (including the time
            spent waiting for room in the window) before reporting the rest as broker-down.
        connect_timeout: Seconds one connection attempt may take.
        max_pending: Un-acknowledged messages in flight per publisher, across concurrent calls.
        name: Client name shown by ``nats server report connections``.
        tls_ca_file: CA bundle to verify a TLS server with (a private CA). Without it a server
            that requires TLS is verified against the system CAs.
    """

    servers: tuple[str, ...] = (f"nats://127.0.0.1:{DEFAULT_PORT}",)
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    source: str = "outboxer"
    ack_timeout: float = 5.0
    connect_timeout: float = 2.0
    max_pending: int = 4096
    name: str = "outboxer"
    tls_ca_file: str | None = None

    @classmethod
    def from_url(cls, url: str) -> NatsSettings:
        """Settings from ``nats://[user:pass@|token@]host:port[,host:port][?option=...]``."""
        return cls.from_parsed(urls.parse(url, SPEC))

    @classmethod
    def from_parsed(cls, url: urls.ParsedUrl) -> NatsSettings:
        """The connection settings of a parsed ``nats://`` URL; a user without a password is
        a token (``nats://token@host``)."""
        token = url.username if url.password is None else None
        return cls(
            servers=tuple(f"nats://{server}" for server in url.netloc().split(",")),
            user=None if token else url.username,
            password=url.password,
            token=token,
            **url.values(CONNECTION_OPTIONS),
        )

    def __post_init__(self) -> None:
        if not self.servers:
            raise ConfigurationError("NATS: at least one server is required")
        if self.ack_timeout <= 0 or self.connect_timeout <= 0:
            raise ConfigurationError("NATS: ack_timeout and connect_timeout must be positive")
        if self.max_pending < 1:
            raise ConfigurationError("NATS: max_pending must be at least 1")
        if not self.source:
            raise ConfigurationError("NATS: source must not be empty")

    def describe(self) -> str:
        """The servers, for logs and errors (credentials are never part of it)."""
        return ",".join(s.removeprefix("nats://") for s in self.servers)


@dataclass(frozen=True, slots=True)
class NatsConsumerSettings:
    """Durable pull consumers for one inbox consumer.

    Attributes:
        connection: Servers, credentials and TLS, parsed like the publisher's URL.
        name: The consumer name (durable names are derived from it, see :func:`durable_name`).
        topics: Subjects; each must be captured by a stream.
        batch_size: Messages fetched and acknowledged together.
        ack_wait: Seconds before an unacknowledged message is delivered again.
        max_ack_pending: Unacknowledged messages at once (0: twice the batch).
        reconnect: Pause between first-connection attempts while NATS is unreachable.
    """

    connection: NatsSettings
    name: str
    topics: tuple[str, ...]
    batch_size: int = 100
    ack_wait: float = 30.0
    max_ack_pending: int = 0
    reconnect: Backoff = field(default_factory=reconnect_backoff)

    def __post_init__(self) -> None:
        check_subscription("NATS", self.name, self.topics, "subject")
        if self.ack_wait <= 0 or self.max_ack_pending < 0:
            raise ConfigurationError("NATS URL: ack_wait must be positive, max_ack_pending >= 0")

    @classmethod
    def from_url(
        cls, url: str, *, name: str, topics: Sequence[str], batch_size: int = 100
    ) -> NatsConsumerSettings:
        """The publisher's ``nats://`` URL plus the consumer options (module docstring)."""
        parsed = urls.parse(url, SPEC)
        return cls(
            connection=NatsSettings.from_parsed(parsed),
            name=name,
            topics=tuple(topics),
            batch_size=batch_size,
            **parsed.values(CONSUMER_OPTIONS),
        )
