"""Kafka topics created ahead of the relay, which never creates topics itself.

The publisher refuses to auto-create topics (a typo would silently create a topic nobody reads),
so a topic must exist before its first message. :func:`create_topics` (``outboxer broker setup
--topic``) creates them with the admin client. It is idempotent: a topic that exists with the
asked number of partitions is reported as such; one with another number is a
:class:`~outboxer.errors.ConfigurationError` (partitions are never changed behind the
operator's back: adding some moves keys to other partitions, which breaks per-key order for the
messages already written).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from outboxer.brokers.kafka._client_log import client_log
from outboxer.brokers.kafka.settings import KafkaSettings, invalid_topic_name
from outboxer.errors import BrokerUnavailable, ConfigurationError

__all__ = ["create_topics"]

_TIMEOUT = 15.0


def create_topics(settings: KafkaSettings, topics: Sequence[str], partitions: int) -> list[str]:
    """Create each of ``topics`` with ``partitions`` partitions (the broker's default replication).

    Returns:
        One line per topic, for the operator.

    Raises:
        ConfigurationError: A topic exists with another number of partitions, or Kafka refuses
            the name or the number.
        BrokerUnavailable: Kafka cannot be reached or refuses the request (authorization).
    """
    where = settings.safe_url()
    for topic in topics:  # some brokers (Tansu) create them, and the relay refuses them then
        invalid = invalid_topic_name(topic)
        if invalid is not None:
            raise ConfigurationError(invalid)
    config: dict[str, Any] = settings.connection_config()
    config["logger"] = client_log(f"{__name__}.librdkafka")
    admin = AdminClient(config)
    futures = admin.create_topics(
        # A topic named twice is one topic (Kafka refuses a request that repeats a name).
        [NewTopic(topic, num_partitions=partitions) for topic in dict.fromkeys(topics)],
        request_timeout=_TIMEOUT,
    )
    done: list[str] = []
    for topic, future in futures.items():
        try:
            future.result(timeout=_TIMEOUT)
            done.append(f"topic {topic!r}: {partitions} partitions")
            continue
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not isinstance(error, KafkaError) or error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise _refused(where, topic, error or exc) from exc
        except TimeoutError as exc:
            raise BrokerUnavailable(f"{where}: no answer within {_TIMEOUT:g}s") from exc
        existing = _partitions(admin, topic, where)
        if existing != partitions:
            raise ConfigurationError(
                f"{where}: topic {topic!r} exists with {existing} partitions, not {partitions}; "
                "use another name or change it with Kafka's own tools"
            )
        done.append(f"topic {topic!r}: {partitions} partitions (existed)")
    return done


def _partitions(admin: AdminClient, topic: str, where: str) -> int:
    try:
        found = admin.list_topics(topic, timeout=_TIMEOUT).topics[topic]
    except KafkaException as exc:
        raise BrokerUnavailable(f"{where}: reading topic {topic!r}: {exc}") from exc
    return len(found.partitions)


def _refused(where: str, topic: str, error: object) -> Exception:
    """A refusal as the relay's error classes: a bad name or number is the operator's to fix;
    anything else (unreachable, not authorized) means the broker cannot do it now."""
    text = f"{error.name()}: {error.str()}" if isinstance(error, KafkaError) else str(error)
    message = f"{where}: creating topic {topic!r}: {text}"
    if isinstance(error, KafkaError) and error.code() in (
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.INVALID_PARTITIONS,
        KafkaError.INVALID_REPLICATION_FACTOR,
        KafkaError.POLICY_VIOLATION,
    ):
        return ConfigurationError(message)
    return BrokerUnavailable(message)
