"""Kafka settings, read from a ``kafka://`` URL with one declared :class:`~outboxer.urls.UrlSpec`.

One URL serves the publisher and the consumer: the connection options (brokers, SASL, TLS,
``client_id``) are shared; the producer options are ignored by the consumer and the consumer
options (``session_timeout_ms``, ``heartbeat_interval_ms``, ``max_poll_interval_ms``,
``fetch_wait_max_ms``, ``auto_offset_reset``) by the publisher. No driver is imported here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from outboxer import urls
from outboxer.brokers.subscription import check_subscription
from outboxer.errors import ConfigurationError
from outboxer.urls import Option

__all__ = [
    "CONNECTION_OPTIONS",
    "CONSUMER_OPTIONS",
    "SPEC",
    "KafkaConsumerSettings",
    "KafkaSettings",
    "invalid_topic_name",
]

COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
SECURITY_PROTOCOLS = ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
OFFSET_RESETS = ("earliest", "latest")

#: The connection and producer options; their names are :class:`KafkaSettings` fields.
CONNECTION_OPTIONS = (
    Option("source", default="outboxer", help="CloudEvents ce_source of every record"),
    Option("client_id", default="outboxer", help="librdkafka client.id"),
    Option("auto_create_topics", "bool", False, help="let the broker create missing topics"),
    Option("linger_ms", "float", 0.0, help="librdkafka linger.ms"),
    Option("delivery_timeout", "float", 10.0, minimum=0.1, maximum=3600, help="seconds"),
    Option("missing_topic_timeout", "float", 5.0, minimum=0, maximum=3600, help="seconds"),
    Option("compression", default="none", choices=COMPRESSIONS),
    Option("security_protocol", choices=SECURITY_PROTOCOLS),
    Option("sasl_mechanism", choices=SASL_MECHANISMS),
    Option("ssl_ca_location", help="CA bundle that signs the brokers' certificates"),
)
#: The consumer group options; their names are :class:`KafkaConsumerSettings` fields.
CONSUMER_OPTIONS = (
    Option("session_timeout_ms", "int", 6000, minimum=1),
    Option("heartbeat_interval_ms", "int", 500, minimum=1),
    Option("max_poll_interval_ms", "int", 300_000, minimum=1),
    Option(
        "fetch_wait_max_ms",
        "int",
        100,
        minimum=1,
        maximum=60_000,
        help="librdkafka fetch.wait.max.ms: how long a broker may hold a fetch for new records",
    ),
    Option("auto_offset_reset", default="earliest", choices=OFFSET_RESETS),
)
SPEC = urls.UrlSpec(
    what="kafka URL",
    schemes=("kafka",),
    hosts="many",
    default_port=9092,
    default_host=None,
    options=(*CONNECTION_OPTIONS, *CONSUMER_OPTIONS),
    example="kafka://127.0.0.1:9092",
)

_LEGAL_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


def invalid_topic_name(topic: str) -> str | None:
    """Why Kafka can never have a topic of this name, or None when it can (librdkafka reports
    such a topic as missing, as if creating it would help)."""
    if _LEGAL_TOPIC.fullmatch(topic) and topic not in (".", ".."):
        return None
    return (
        f"{topic!r} is not a valid Kafka topic name (1 to 249 of a-z A-Z 0-9 . _ -, "
        "not '.' or '..')"
    )


#: librdkafka properties the adapter's guarantees rest on: ``extra`` may not change them.
_PROTECTED = frozenset(
    {
        "enable.idempotence",
        "acks",
        "request.required.acks",
        "error_cb",
        "logger",
        "on_delivery",
        "dr_cb",
        "dr_msg_cb",
        "transactional.id",
        "bootstrap.servers",
        "metadata.broker.list",
    }
)


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """How to reach the cluster and what to put on the wire, parsed from a ``kafka://`` URL.

    Build one with :meth:`from_url` or directly, and adjust it with :func:`dataclasses.replace`.

    Attributes:
        bootstrap_servers: ``host:port[,host:port...]`` to fetch the cluster metadata from.
        source: The CloudEvents ``ce_source`` header of every record.
        client_id: librdkafka ``client.id``, so operators can spot the relay in broker logs.
        auto_create_topics: Let the broker create a missing topic on first use (if the broker
            allows it). Off by default: a missing topic is a ``PermanentPublishError``.
        linger_ms: How long librdkafka waits to fill a batch (``linger.ms``). 0, because the
            relay already hands over whole batches, which fill requests while earlier ones are
            in flight: throughput at 0, 1, 2 and 5 ms measured within the noise, while each
            millisecond adds to commit-to-ack latency (p50 at 1,000 msg/s: 3.6 ms at 0 against
            5.4-5.6 ms at 1, docs/benchmarks.md).
        delivery_timeout: Seconds a record may wait for its acknowledgement before it counts as
            ``BrokerUnavailable`` (``message.timeout.ms``); also bounds connect and request time.
        missing_topic_timeout: Seconds a topic may be absent from the metadata before records
            for it fail (``topic.metadata.propagation.max.ms``); a topic created a moment ago
            may not have reached every broker yet.
        compression: ``compression.type``: none, gzip, snappy, lz4 or zstd.
        security_protocol: plaintext, ssl, sasl_plaintext or sasl_ssl (librdkafka's default,
            plaintext, when None).
        sasl_mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
        sasl_username: SASL user (the URL's user).
        sasl_password: SASL password (the URL's password); never shown by ``repr`` or in errors.
        ssl_ca_location: CA bundle that signs the brokers' certificates.
        extra: Any other librdkafka producer property, e.g. ``{"batch.size": 1000000}``; the
            ones the delivery guarantees rest on (idempotence, acks, callbacks) are refused.
    """

    bootstrap_servers: str
    source: str = "outboxer"
    client_id: str = "outboxer"
    auto_create_topics: bool = False
    linger_ms: float = 0.0
    delivery_timeout: float = 10.0
    missing_topic_timeout: float = 5.0
    compression: str = "none"
    security_protocol: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_ca_location: str | None = None
    extra: Mapping[str, str | int | float | bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        servers = [s.strip() for s in self.bootstrap_servers.split(",")]
        if not all(servers):
            raise ConfigurationError(
                "kafka URL: at least one host:port is required, e.g. kafka://127.0.0.1:9092"
            )
        if not self.source:
            raise ConfigurationError("kafka URL: source (ce_source) must not be empty")
        if not 0 <= self.linger_ms <= 900_000:
            raise ConfigurationError(f"kafka URL: linger_ms={self.linger_ms} is out of range")
        if not 0.1 <= self.delivery_timeout <= 3600:
            raise ConfigurationError(
                f"kafka URL: delivery_timeout={self.delivery_timeout} must be 0.1 to 3600 s"
            )
        if self.linger_ms >= self.delivery_timeout * 1000:
            raise ConfigurationError("kafka URL: linger_ms must be shorter than delivery_timeout")
        if not 0 <= self.missing_topic_timeout <= 3600:
            raise ConfigurationError(
                f"kafka URL: missing_topic_timeout={self.missing_topic_timeout} must be 0 to 3600 s"
            )
        for name, allowed in (
            ("compression", COMPRESSIONS),
            ("security_protocol", SECURITY_PROTOCOLS),
            ("sasl_mechanism", SASL_MECHANISMS),
        ):
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise ConfigurationError(
                    f"kafka URL: {name}={value!r}: use one of " + ", ".join(allowed)
                )
        refused = sorted(set(self.extra) & _PROTECTED)
        if refused:
            raise ConfigurationError(
                f"kafka settings: extra property {refused[0]!r} cannot be changed: the delivery "
                "guarantees rest on it"
            )

    @classmethod
    def from_url(cls, url: str) -> KafkaSettings:
        """Parse ``kafka://[user:password@]host[:port][,host[:port]...][?options]``."""
        return cls.from_parsed(urls.parse(url, SPEC))

    @classmethod
    def from_parsed(cls, url: urls.ParsedUrl) -> KafkaSettings:
        """The connection settings of a parsed ``kafka://`` URL (user and password: SASL)."""
        values = url.values(CONNECTION_OPTIONS)
        sasl = url.username is not None  # credentials in the URL mean SASL
        values["client_id"] = values["client_id"] or "outboxer"
        values["security_protocol"] = values["security_protocol"] or (
            "sasl_plaintext" if sasl else None
        )
        values["sasl_mechanism"] = values["sasl_mechanism"] or ("PLAIN" if sasl else None)
        values["ssl_ca_location"] = values["ssl_ca_location"] or None
        return cls(
            bootstrap_servers=url.netloc(),
            sasl_username=url.username,
            sasl_password=url.password,
            **values,
        )

    def safe_url(self) -> str:
        """The cluster's URL for log lines and errors: the password is replaced by ``***``."""
        return urls.safe_url(
            "kafka",
            self.bootstrap_servers,
            username=self.sasl_username,
            password=self.sasl_password,
        )

    def connection_config(self) -> dict[str, Any]:
        """The librdkafka properties of reaching the cluster (servers, client id, security),
        shared by the producer, the consumer and the admin client."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": self.client_id,
        }
        optional = {
            "security.protocol": self.security_protocol,
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
            "ssl.ca.location": self.ssl_ca_location,
        }
        config.update({k: v for k, v in optional.items() if v is not None})
        return config

    def producer_config(self) -> dict[str, Any]:
        """The librdkafka producer properties (without the callbacks the publisher adds)."""
        timeout_ms = int(self.delivery_timeout * 1000)
        config: dict[str, Any] = {
            **self.connection_config(),
            # Idempotence: librdkafka's retries never duplicate or reorder a partition's records,
            # which keeps per-key order across retries; it implies acks=all, stated anyway.
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": self.linger_ms,
            # A down broker must be reported within seconds, not librdkafka's 5 minutes. An
            # in-flight request is only given up after request.timeout.ms, so it is kept at half
            # the delivery timeout: the worst case is about 1.5 x delivery_timeout.
            "message.timeout.ms": timeout_ms,
            "request.timeout.ms": max(1000, min(30_000, timeout_ms // 2)),
            "socket.connection.setup.timeout.ms": max(1000, timeout_ms),
            "allow.auto.create.topics": self.auto_create_topics,
            "topic.metadata.propagation.max.ms": int(self.missing_topic_timeout * 1000),
            # The Java client's default partitioner: a key lands where JVM producers put it.
            "partitioner": "murmur2_random",
            "compression.type": self.compression,
            # Idle connections closed by the broker are normal, not worth an error log line.
            "log.connection.close": False,
            # While a broker is down, reconnect at the pace of the relay's outage backoff
            # (doubling up to its 60 s cap) rather than librdkafka's 0.1 s doubling to 10 s.
            "reconnect.backoff.ms": 500,
            "reconnect.backoff.max.ms": 60_000,
        }
        config.update(self.extra)
        return config


@dataclass(frozen=True, slots=True)
class KafkaConsumerSettings:
    """A consumer group member: connection settings plus group tuning.

    Attributes:
        connection: Brokers, client id and security, parsed like the publisher's URL.
        group: The consumer group id (the consumer name).
        topics: Topics to subscribe to (a name starting with ``^`` is a regular expression).
        batch_size: Records fetched per ``consume`` call and committed together.
        session_timeout_ms: See the module docstring.
        heartbeat_interval_ms: See the module docstring.
        max_poll_interval_ms: See the module docstring.
        fetch_wait_max_ms: librdkafka's ``fetch.wait.max.ms`` (its default is 500). Kafka
            answers a fetch as soon as a record arrives; a broker that holds every fetch for
            this long (Tansu does) delays each delivery by up to it: publish → deliver p50
            131 ms at 500, 31 ms at 100, 6 ms at 10 against Tansu at 1,000 msg/s
            (``benchmarks/kafka_batch_latency.py``). An idle member sends a fetch this often.
        auto_offset_reset: ``earliest`` or ``latest``.
    """

    connection: KafkaSettings
    group: str
    topics: tuple[str, ...]
    batch_size: int = 100
    session_timeout_ms: int = 6000
    heartbeat_interval_ms: int = 500
    max_poll_interval_ms: int = 300_000
    fetch_wait_max_ms: int = 100
    auto_offset_reset: str = "earliest"

    def __post_init__(self) -> None:
        check_subscription("kafka", self.group, self.topics, "topic")
        for topic in self.topics:
            invalid = None if topic.startswith("^") else invalid_topic_name(topic)
            if invalid is not None:  # librdkafka would wait for it to exist, for ever
                raise ConfigurationError(f"kafka consumer: {invalid}")
        if self.auto_offset_reset not in ("earliest", "latest"):
            raise ConfigurationError(
                f"kafka URL: auto_offset_reset={self.auto_offset_reset!r}: use earliest or latest"
            )
        if not 0 < self.heartbeat_interval_ms < self.session_timeout_ms:
            raise ConfigurationError(
                "kafka URL: heartbeat_interval_ms must be positive and below session_timeout_ms"
            )
        if self.max_poll_interval_ms < self.session_timeout_ms:
            raise ConfigurationError(
                "kafka URL: max_poll_interval_ms must be at least session_timeout_ms"
            )

    @classmethod
    def from_url(
        cls, url: str, *, name: str, topics: Sequence[str], batch_size: int = 100
    ) -> KafkaConsumerSettings:
        """The publisher's ``kafka://`` URL plus the consumer options (module docstring)."""
        parsed = urls.parse(url, SPEC)
        return cls(
            connection=KafkaSettings.from_parsed(parsed),
            group=name,
            topics=tuple(topics),
            batch_size=batch_size,
            **parsed.values(CONSUMER_OPTIONS),
        )

    def consumer_config(self) -> dict[str, Any]:
        """The librdkafka consumer properties (without the callbacks)."""
        config: dict[str, Any] = {
            **self.connection.connection_config(),
            "group.id": self.group,
            # Offsets are committed by the adapter after the inbox committed, never in the
            # background: an auto-commit could run ahead of a transaction that then fails.
            "enable.auto.commit": False,
            "auto.offset.reset": self.auto_offset_reset,
            "session.timeout.ms": self.session_timeout_ms,
            "heartbeat.interval.ms": self.heartbeat_interval_ms,
            "max.poll.interval.ms": self.max_poll_interval_ms,
            "fetch.wait.max.ms": self.fetch_wait_max_ms,
            "log.connection.close": False,
        }
        return config
