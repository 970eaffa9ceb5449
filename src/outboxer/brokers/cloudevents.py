"""CloudEvents 1.0 attribute names and time format, shared by every broker's wire format.

Kafka's protocol binding names the attributes ``ce_id``, ``ce_type``...; the HTTP binding (also
used for NATS headers) names them ``ce-id``, ``ce-type``... Both write ``time`` as RFC 3339 in
UTC with microseconds and a ``Z`` (``2025-01-31T12:00:00.123456Z``), and read it back with
:func:`parse_time`. No broker client is imported here: every broker package may use it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

__all__ = [
    "CONTENT_TYPE",
    "HEADERS",
    "KAFKA",
    "SPECVERSION",
    "Binding",
    "format_time",
    "moment_from_epoch",
    "parse_time",
]

SPECVERSION = "1.0"
#: The content type attribute's name in every binding (a plain protocol header).
CONTENT_TYPE = "content-type"


@dataclass(frozen=True, slots=True)
class Binding:
    """The header names of the CloudEvents attributes in one protocol binding."""

    id: str
    type: str
    source: str
    specversion: str
    time: str
    partitionkey: str
    topic: str

    @classmethod
    def prefixed(cls, prefix: str) -> Binding:
        return cls(*(prefix + name for name in cls.__slots__))

    @property
    def names(self) -> frozenset[str]:
        """Every attribute header of the binding, plus ``content-type``."""
        return frozenset(getattr(self, name) for name in self.__slots__) | {CONTENT_TYPE}


#: Kafka protocol binding (``ce_`` prefix).
KAFKA = Binding.prefixed("ce_")
#: HTTP protocol binding (``ce-`` prefix), also the NATS header names.
HEADERS = Binding.prefixed("ce-")


def format_time(created_at: dt.datetime) -> str:
    """RFC 3339 in UTC with a ``Z`` and microseconds; a naive timestamp is taken to be UTC
    already (stores hand back UTC)."""
    tz = created_at.tzinfo
    if tz is dt.UTC:  # the common case, one call: "...+00:00" -> "...Z"
        return created_at.isoformat(timespec="microseconds")[:-6] + "Z"
    if tz is not None:
        created_at = created_at.astimezone(dt.UTC).replace(tzinfo=None)
    return created_at.isoformat(timespec="microseconds") + "Z"


#: The moments every store keeps (MariaDB's ``DATETIME`` range; PostgreSQL's drivers refuse a
#: moment whose UTC falls outside Python's years 1-9999). Any client can publish a time, so a
#: decoder takes a moment outside these as unreadable: the message then gets its arrival time
#: instead of stopping the consumer each time the broker delivers it again.
_EARLIEST = dt.datetime(1000, 1, 1, tzinfo=dt.UTC)
_LATEST = dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)
#: The latest epoch seconds read: the last day's start (a float a hair under the year 10000
#: rounds up into it).
_LATEST_SECONDS = dt.datetime(9999, 12, 31, tzinfo=dt.UTC).timestamp()


def parse_time(text: str | None) -> dt.datetime | None:
    """The moment a ``time`` attribute names (UTC when it has no offset); ``None`` if
    unreadable or outside the years 1000-9999 UTC (see :data:`_EARLIEST`)."""
    if not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment if _EARLIEST <= moment <= _LATEST else None


def moment_from_epoch(seconds: float) -> dt.datetime | None:
    """The moment ``seconds`` after the Unix epoch (a broker's timestamp, set by whichever
    client published); ``None`` for one that is not positive, not a number or outside the
    years 1000-9999 (a client that wrote milliseconds where seconds belong: an AMQP
    ``timestamp`` of 1700000000000 is the year 55840)."""
    if not 0 < seconds <= _LATEST_SECONDS:  # also false for NaN
        return None
    return dt.datetime.fromtimestamp(seconds, dt.UTC)
