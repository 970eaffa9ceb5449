"""RabbitMQ settings, read from an ``amqp://`` URL with one declared URL spec.

One URL serves the publisher and the consumer: the connection options (credentials, vhost,
``exchange``, timeouts, ``heartbeat``) are shared; ``unroutable``, ``max_unconfirmed``,
``confirm_timeout`` and ``max_message_size`` only concern the publisher, ``prefetch``, ``queue``
and ``queue_type`` only the consumer.
"""

from __future__ import annotations

import dataclasses
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import pika  # type: ignore[import-untyped]

from outboxer import urls
from outboxer.brokers.subscription import reconnect_backoff
from outboxer.config import Backoff
from outboxer.errors import ConfigurationError
from outboxer.urls import Option

__all__ = [
    "CONNECTION_OPTIONS",
    "CONSUMER_OPTIONS",
    "SPEC",
    "RabbitMQConsumerSettings",
    "RabbitMQSettings",
]

Unroutable = Literal["dead-letter", "ack"]

# RabbitMQ's rule for exchange names; anything else is refused with a channel error.
_EXCHANGE_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,255}$")

#: Connection and publisher options; their names are :class:`RabbitMQSettings` fields.
CONNECTION_OPTIONS = (
    Option("exchange", default="outbox", help="topic exchange, declared durable"),
    Option("unroutable", default="dead-letter", choices=("dead-letter", "ack")),
    Option("max_unconfirmed", "int", 5000, help="publisher confirms window"),
    Option("confirm_timeout", "float", 15.0, help="seconds"),
    Option("connect_timeout", "float", 10.0, help="seconds"),
    Option("heartbeat", "int", 60, help="seconds, 0 = off"),
    Option("max_message_size", "int", 16 * 1024 * 1024, help="bytes"),
    Option("connection_name", default="outboxer publisher"),
)
#: Consumer options; their names are :class:`RabbitMQConsumerSettings` fields.
CONSUMER_OPTIONS = (
    Option("prefetch", "int", 0, help="unacknowledged deliveries (0: twice the batch)"),
    Option("queue", help="queue name (default: the consumer name)"),
    Option("queue_type", default="classic", choices=("classic", "quorum")),
)
SPEC = urls.UrlSpec(
    what="RabbitMQ URL",
    schemes=("amqp", "amqps"),
    default_port={"amqp": 5672, "amqps": 5671},
    default_host="localhost",
    path="optional",
    options=(*CONNECTION_OPTIONS, *CONSUMER_OPTIONS),
    example="amqp://guest:guest@127.0.0.1:5672/%2F",
)


@dataclass(frozen=True, slots=True)
class RabbitMQSettings:
    """Where and how to publish; built from the broker URL by :meth:`from_url`.

    Attributes:
        host: Broker host name or address.
        port: Broker port (5672, or 5671 with TLS).
        username: Login user.
        password: Login password; kept out of ``repr``, logs and errors.
        virtual_host: The vhost to open.
        tls: Connect with TLS (``amqps://``).
        exchange: Topic exchange that receives every message; declared durable on connect.
        unroutable: What a returned (unroutable) message means: ``dead-letter`` reports a
            ``PermanentPublishError``, ``ack`` counts it as delivered.
        max_unconfirmed: Messages written but not yet confirmed, at most, on the connection
            (all concurrent calls together): the pipelining window.
        confirm_timeout: Seconds a ``publish`` call waits for its confirms (and for room in
            the window) before reporting the broker unavailable; keep it below the relay's
            lease so a stuck call is settled before another relay takes the batch over.
        connect_timeout: Seconds for TCP connect, TLS and the AMQP handshake together.
        heartbeat: AMQP heartbeat interval proposed to the broker, seconds (0 = off).
        max_message_size: Largest payload sent; bigger ones fail permanently instead of
            making RabbitMQ close the channel (its ``max_message_size``: 16 MiB by default
            in RabbitMQ 4, 128 MiB in 3.x).
        connection_name: Shown for the connection in RabbitMQ's management UI and
            ``rabbitmqctl list_connections client_properties`` (e.g. the relay's name).
    """

    host: str = "localhost"
    port: int = 5672
    username: str = "guest"
    password: str = field(default="guest", repr=False)
    virtual_host: str = "/"
    tls: bool = False
    exchange: str = "outbox"
    unroutable: Unroutable = "dead-letter"
    max_unconfirmed: int = 5000
    confirm_timeout: float = 15.0
    connect_timeout: float = 10.0
    heartbeat: int = 60
    max_message_size: int = 16 * 1024 * 1024
    connection_name: str = "outboxer publisher"

    def __post_init__(self) -> None:
        if not _EXCHANGE_NAME.match(self.exchange):
            raise ConfigurationError(
                f"invalid RabbitMQ exchange name {self.exchange!r}: use 1-255 letters, digits, "
                "'-', '_', '.' or ':'"
            )
        if self.unroutable not in ("dead-letter", "ack"):
            raise ConfigurationError(
                f"invalid RabbitMQ unroutable={self.unroutable!r}: use 'dead-letter' or 'ack'"
            )
        checks = {
            "port": 0 < self.port < 65536,
            "max_unconfirmed": self.max_unconfirmed >= 1,
            "confirm_timeout": self.confirm_timeout > 0,
            "connect_timeout": self.connect_timeout > 0,
            "heartbeat": self.heartbeat >= 0,
            "max_message_size": self.max_message_size >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ConfigurationError(f"invalid RabbitMQ setting {name}={getattr(self, name)!r}")

    @classmethod
    def from_url(cls, url: str) -> RabbitMQSettings:
        """Parse ``amqp://`` / ``amqps://`` URLs (see :mod:`.publisher`)."""
        return cls.from_parsed(urls.parse(url, SPEC))

    @classmethod
    def from_parsed(cls, url: urls.ParsedUrl) -> RabbitMQSettings:
        """The connection settings of a parsed ``amqp://`` URL."""
        return cls(
            host=url.host,
            port=url.port or 5672,
            username=url.username or "guest",
            password=url.password if url.password is not None else "guest",
            virtual_host=url.path or "/",
            tls=url.scheme == "amqps",
            **url.values(CONNECTION_OPTIONS),
        )

    def safe_url(self) -> str:
        """The connection's URL without the password, for logs and error messages."""
        scheme = "amqps" if self.tls else "amqp"
        vhost = quote(self.virtual_host, safe="")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{quote(self.username, safe='')}@{host}:{self.port}/{vhost}"

    def connection_parameters(self, ssl_context: ssl.SSLContext | None = None) -> Any:
        """pika's connection parameters: one attempt, bounded in time, no hidden retries."""
        ssl_options = None
        if self.tls:
            context = ssl_context or ssl.create_default_context()
            ssl_options = pika.SSLOptions(context, server_hostname=self.host)
        return pika.ConnectionParameters(
            host=self.host,
            port=self.port,
            virtual_host=self.virtual_host,
            credentials=pika.PlainCredentials(self.username, self.password),
            heartbeat=self.heartbeat,
            connection_attempts=1,
            socket_timeout=self.connect_timeout,
            stack_timeout=self.connect_timeout,
            # A connection RabbitMQ blocks (memory or disk alarm) is closed by pika after this
            # long; its unconfirmed messages then report BrokerUnavailable.
            blocked_connection_timeout=self.confirm_timeout,
            ssl_options=ssl_options,
            client_properties={"connection_name": self.connection_name},
        )


@dataclass(frozen=True, slots=True)
class RabbitMQConsumerSettings:
    """Where to consume from and how much to take at once.

    Attributes:
        connection: Broker, credentials, vhost and exchange, parsed like the publisher's URL.
        queue: The durable queue (default: the consumer name).
        topics: Binding keys of the queue on the exchange.
        batch_size: Messages delivered to the inbox and acknowledged together.
        prefetch: Unacknowledged messages in flight to this consumer (0: twice the batch).
        queue_type: ``classic`` or ``quorum``.
        reconnect: Pause between connection attempts while RabbitMQ is unreachable.
    """

    connection: RabbitMQSettings
    queue: str
    topics: tuple[str, ...]
    batch_size: int = 100
    prefetch: int = 0
    queue_type: str = "classic"
    reconnect: Backoff = field(default_factory=reconnect_backoff)

    def __post_init__(self) -> None:
        if not self.topics:
            raise ConfigurationError("RabbitMQ consumer: at least one topic is required")
        for key in self.topics:  # AMQP's short strings: a longer one fails at the broker
            if not key or len(key.encode()) > 255:
                raise ConfigurationError(
                    f"invalid RabbitMQ binding key {key!r}: use 1-255 bytes (UTF-8)"
                )
        if (
            not self.queue
            or len(self.queue.encode()) > 255
            or not self.queue.isprintable()
            or self.queue.startswith("amq.")
        ):
            raise ConfigurationError(
                f"invalid RabbitMQ queue name {self.queue!r}: use 1-255 bytes of printable "
                "text, not starting with 'amq.' (reserved)"
            )
        if self.prefetch < 0 or self.prefetch > 65535:
            raise ConfigurationError(f"RabbitMQ URL: prefetch={self.prefetch} must be 0 to 65535")
        if self.queue_type not in ("classic", "quorum"):
            raise ConfigurationError(
                f"RabbitMQ URL: queue_type={self.queue_type!r}: use classic or quorum"
            )

    @property
    def window(self) -> int:
        return self.prefetch or min(65535, 2 * self.batch_size)

    @classmethod
    def from_url(
        cls, url: str, *, name: str, topics: Sequence[str], batch_size: int = 100
    ) -> RabbitMQConsumerSettings:
        """The publisher's ``amqp://`` URL plus the consumer options (module docstring)."""
        parsed = urls.parse(url, SPEC)
        connection = RabbitMQSettings.from_parsed(parsed)
        connection = dataclasses.replace(connection, connection_name=f"outboxer consumer {name}")
        values = parsed.values(CONSUMER_OPTIONS)
        return cls(
            connection=connection,
            queue=values.pop("queue") or name,
            topics=tuple(topics),
            batch_size=batch_size,
            **values,
        )
