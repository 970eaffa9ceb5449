"""Every broker's wire format: ``decode(encode(message))`` gives the message back.

No broker is needed: each ``wire`` module encodes to and decodes from plain values (what the
client library hands over), so the two halves of one format are checked against each other.
What a consumer makes of text no store keeps (NUL, lone surrogates) is checked last.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import re

import pika
import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client as NatsClient

from outboxer.brokers.cloudevents import format_time, parse_time
from outboxer.brokers.http import wire as http_wire
from outboxer.brokers.kafka import wire as kafka_wire
from outboxer.brokers.nats import wire as nats_wire
from outboxer.brokers.rabbitmq import wire as rabbitmq_wire
from outboxer.brokers.redis import wire as redis_wire
from outboxer.message import JSON, Message, received, storable_text

CREATED = dt.datetime(2025, 1, 31, 12, 0, 0, 123456, tzinfo=dt.UTC)


def _messages() -> list[Message]:
    return [
        Message(
            id="0194b5a0-0000-7000-8000-000000000001",
            topic="orders.created",
            payload=b'{"order": 42, "name": "h\xc3\xa9llo"}',
            key="order-42",
            type="OrderCreated",
            headers={"tenant": "acme", "x-trace": "abc-1"},
            content_type=JSON,
            created_at=CREATED,
        ),
        Message(
            id="plain-2",
            topic="blobs",
            payload=b"\x00\x01\xff",
            created_at=CREATED.replace(microsecond=0),
        ),
    ]


def _same(decoded: Message, message: Message, *, whole_seconds: bool = False) -> None:
    expected_time = (
        message.created_at.replace(microsecond=0) if whole_seconds else message.created_at
    )
    assert (decoded.id, decoded.topic, decoded.key, decoded.type) == (
        message.id,
        message.topic,
        message.key,
        message.type,
    )
    assert decoded.payload == message.payload
    assert decoded.content_type == message.content_type
    assert dict(decoded.headers) == dict(message.headers)
    assert decoded.created_at == expected_time


@pytest.mark.parametrize("message", _messages(), ids=lambda m: m.id)
def test_kafka(message: Message) -> None:
    headers = kafka_wire.header_encoder("billing")(message)
    assert ("ce_source", "billing") in headers
    decoded = kafka_wire.decode(
        topic=message.topic,
        partition=0,
        offset=7,
        key=None if message.key is None else message.key.encode(),
        value=message.payload,
        headers=[(name, v.encode() if isinstance(v, str) else v) for name, v in headers],
    )
    _same(decoded, message)


def test_kafka_user_headers_cannot_replace_the_id() -> None:
    message = Message(id="real", topic="t", payload=b"", headers={"ce_id": "forged"})
    headers = kafka_wire.header_encoder("s")(message)
    assert [value for name, value in headers if name == "ce_id"] == ["real"]


@pytest.mark.parametrize("message", _messages(), ids=lambda m: m.id)
def test_rabbitmq(message: Message) -> None:
    encoded = rabbitmq_wire.encode_properties(message)
    # Byte for byte what pika encodes for the documented fields.
    headers = dict(message.headers)
    if message.key is not None:
        headers["x-outbox-key"] = message.key
    expected = pika.BasicProperties(
        content_type=message.content_type,
        headers=headers,
        delivery_mode=2,
        message_id=message.id,
        timestamp=int(message.created_at.timestamp()),
        type=message.type,
    )
    assert encoded == b"".join(expected.encode())
    properties = pika.BasicProperties().decode(encoded)
    assert properties.delivery_mode == 2
    decoded = rabbitmq_wire.decode(
        routing_key=message.topic,
        body=message.payload,
        message_id=properties.message_id,
        type=properties.type,
        timestamp=properties.timestamp,
        content_type=properties.content_type,
        headers=properties.headers,
    )
    _same(decoded, message, whole_seconds=True)  # AMQP timestamps are whole seconds


async def _nats_read(block: bytes) -> dict[str, str]:
    """A header block as nats-py's own reader hands it to a consumer."""
    headers = await NatsClient()._process_headers(block)  # private: nats-py has no public one
    assert headers is not None
    return dict(headers)


@pytest.mark.parametrize("message", _messages(), ids=lambda m: m.id)
async def test_nats(message: Message) -> None:
    block = nats_wire.header_block(message, "billing")
    assert block.startswith(b"NATS/1.0\r\n")
    assert block.endswith(b"\r\n\r\n")
    headers = await _nats_read(block)
    assert headers == nats_wire.headers(message, "billing")
    assert headers["Nats-Msg-Id"] == message.id
    decoded = nats_wire.decode(subject=message.topic, data=message.payload, headers=headers)
    _same(decoded, message)


async def test_nats_header_values_are_trimmed_and_cannot_break_their_line() -> None:
    message = dataclasses.replace(
        _messages()[0], headers={"note": "  a\r\nHPUB x 1 1\r\n  ", "tail": "b\n"}
    )
    block = nats_wire.header_block(message, "billing")
    assert b"\r\nnote: a  HPUB x 1 1\r\ntail: b\r\n" in block
    headers = await _nats_read(block)
    assert (headers["note"], headers["tail"]) == ("a  HPUB x 1 1", "b")
    assert headers["ce-id"] == message.id


def test_rabbitmq_key_replaces_a_user_header_of_its_name_and_text_is_utf8() -> None:
    message = Message(
        id="m-é",
        topic="t",
        payload=b"",
        key="clé",
        headers={"x-outbox-key": "forged", "note": "ünïcode"},
    )
    properties = pika.BasicProperties().decode(rabbitmq_wire.encode_properties(message))
    assert list(properties.headers.items()) == [("x-outbox-key", "clé"), ("note", "ünïcode")]
    assert (properties.message_id, properties.type) == ("m-é", None)


@pytest.mark.parametrize("message", _messages(), ids=lambda m: m.id)
def test_redis(message: Message) -> None:
    command = redis_wire.xadd(message, (b"MAXLEN", b"~", b"10"))
    assert command[:6] == (b"XADD", message.topic.encode(), b"MAXLEN", b"~", b"10", b"*")
    pairs = command[6:]
    fields = dict(zip(pairs[::2], pairs[1::2], strict=True))
    # Redis keeps no creation time: the entry id's milliseconds stand in for it.
    millis = int(message.created_at.timestamp() * 1000)
    decoded = redis_wire.decode(stream=message.topic, entry_id=f"{millis}-0", fields=fields)
    to_millis = message.created_at.replace(
        microsecond=message.created_at.microsecond // 1000 * 1000
    )
    _same(decoded, dataclasses.replace(message, created_at=to_millis))


@pytest.mark.parametrize("message", _messages()[:1], ids=lambda m: m.id)
def test_http(message: Message) -> None:
    # ce-type is the topic when a message has no type, so the typed message is the round trip.
    headers = http_wire.headers(message, "billing", b"secret")
    headers.update(message.headers)  # the publisher adds the (checked) user headers
    decoded = http_wire.decode(headers, b"")
    _same(decoded, dataclasses.replace(message, payload=b""))
    expected = http_wire.signature(b"secret", message.id, format_time(CREATED), message.payload)
    assert http_wire.headers(message, "billing", b"secret")["webhook-signature"] == expected


def test_http_percent_encodes_attributes() -> None:
    message = Message(id="id 1", topic="t", payload=b"", key='k"é%')
    headers = http_wire.headers(message, "s", None)
    assert headers["ce-partitionkey"] == "k%22%C3%A9%25"
    assert "webhook-signature" not in headers
    assert http_wire.decode(headers, b"").key == 'k"é%'


def test_ce_time_is_rfc3339_utc() -> None:
    paris = dt.timezone(dt.timedelta(hours=1))
    assert (
        format_time(dt.datetime(2025, 1, 31, 13, 0, tzinfo=paris)) == "2025-01-31T12:00:00.000000Z"
    )
    assert format_time(dt.datetime(2025, 1, 31, 12, 0, 0, 5)) == "2025-01-31T12:00:00.000005Z"
    assert parse_time("2025-01-31T12:00:00.000005Z") == dt.datetime(
        2025, 1, 31, 12, 0, 0, 5, dt.UTC
    )
    assert parse_time("2025-01-31T12:00:00") == dt.datetime(2025, 1, 31, 12, tzinfo=dt.UTC)
    assert parse_time("yesterday") is None


def test_a_time_no_store_keeps_is_read_as_the_arrival_time() -> None:
    """Any client sets the time a broker carries: milliseconds where seconds belong, an id of
    its own choosing, a year a store cannot keep. Decoding never fails on it (the consumer
    would stop at each redelivery) and gives a moment every store keeps."""
    before = dt.datetime.now(dt.UTC)
    decoded = [
        rabbitmq_wire.decode(
            routing_key="t",
            body=b"",
            message_id="ms",
            type=None,
            timestamp=1_700_000_000_000,  # milliseconds: the year 55840
            content_type=None,
            headers=None,
        ),
        redis_wire.decode(stream="t", entry_id="253402300800000-0", fields={b"id": b"year-10000"}),
        kafka_wire.decode(
            topic="t", partition=0, offset=1, key=None, value=b"", headers=None,
            timestamp_ms=2**62,
        ),
        kafka_wire.decode(
            topic="t", partition=0, offset=2, key=None, value=b"",
            headers=[("ce_time", "0001-01-01T00:00:00+01:00")],  # UTC: the year 0
        ),
        nats_wire.decode(
            subject="t", data=b"", headers={"ce-time": "9999-12-31T23:59:59-05:00"}
        ),
        nats_wire.decode(subject="t", data=b"", headers={"ce-time": "0999-12-31T23:59:59Z"}),
    ]  # fmt: skip
    for message in decoded:
        assert before <= message.created_at <= dt.datetime.now(dt.UTC), message
    assert parse_time("1000-01-01T00:00:00Z") == dt.datetime(1000, 1, 1, tzinfo=dt.UTC)


def test_rabbitmq_text_that_is_not_utf8_is_decoded_with_replacement_characters() -> None:
    """pika hands a short string that is not UTF-8 over as bytes (any client can send one)."""
    decoded = rabbitmq_wire.decode(
        routing_key=b"orders.\xff",
        body=b"",
        message_id=b"id-\xff",
        type=b"\xffType",
        timestamp=None,
        content_type=None,
        headers={b"h\xff": b"v\xff", "n": 7, "x-outbox-key": b"k\xff"},
    )
    assert (decoded.id, decoded.topic, decoded.type, decoded.key) == (
        "id-\ufffd",
        "orders.\ufffd",
        "\ufffdType",
        "k\ufffd",
    )
    assert decoded.headers == {"h\ufffd": "v\ufffd", "n": "7"}


# every code point, surrogates included, and the ones that matter often
@given(st.text(st.characters(exclude_categories=()) | st.sampled_from("\x00\ud800\udfffé😀")))
def test_storable_text_replaces_only_nul_and_lone_surrogates(text: str) -> None:
    stored = storable_text(text)
    assert stored.encode().decode() == stored and "\x00" not in stored
    assert len(stored) == len(text)
    unchanged = [a == b for a, b in zip(text, stored, strict=True)]
    assert unchanged == [c != "\x00" and not 0xD800 <= ord(c) <= 0xDFFF for c in text]
    if all(unchanged):
        assert stored is text


def test_received_keeps_a_storable_message_and_replaces_the_rest() -> None:
    clean = _messages()[0]
    assert received(clean) is clean
    fields = {  # field: (as delivered, as received)
        "id": ("id\x00", "id\ufffd"),
        "topic": ("t\ud800", "t\ufffd"),
        "key": ("k\x00", "k\ufffd"),
        "type": ("T\udfff", "T\ufffd"),
        "headers": ({"h\x00": "\ud83dv"}, {"h\ufffd": "\ufffdv"}),
        "content_type": ("text/\x00", "text/\ufffd"),
    }
    dirty = dataclasses.replace(clean, **{name: d for name, (d, _) in fields.items()})
    assert received(dirty) == dataclasses.replace(
        clean, **{name: r for name, (_, r) in fields.items()}
    )


def test_received_replaces_text_over_255_bytes_by_its_digest() -> None:
    """Any client can publish an id or key longer than the stores index (PostgreSQL's b-tree
    entry limit, MariaDB's 255-byte columns): it becomes a digest, the same at every delivery."""
    clean = _messages()[0]
    fits = dataclasses.replace(clean, id="i" * 255, key="é" * 127, type="😀" * 63)
    assert received(fits) == fits  # 255, 254 and 252 bytes
    long_id, long_key = "i" * 256, "😀" * 64  # 256 bytes each
    digest = received(dataclasses.replace(clean, id=long_id, key=long_key, topic="t" * 3000))
    assert digest.id == f"sha256:{hashlib.sha256(long_id.encode()).hexdigest()}"
    assert digest.key == f"sha256:{hashlib.sha256(long_key.encode()).hexdigest()}"
    assert digest.topic == f"sha256:{hashlib.sha256(b't' * 3000).hexdigest()}"
    assert (digest.type, digest.headers, digest.payload) == (
        clean.type,
        clean.headers,
        clean.payload,
    )
    # NUL replaced first: the digest is of the text as stored
    replaced = ("\ufffd" * 300).encode()
    assert received(dataclasses.replace(clean, id="\x00" * 300)).id == (
        f"sha256:{hashlib.sha256(replaced).hexdigest()}"
    )


def test_redis_headers_nested_too_deep_are_no_headers() -> None:
    """Any client may XADD any text: JSON headers nested 100,000 deep raised a RecursionError
    that stopped the consumer at every start (the entry stayed pending; a probe)."""
    for deep in ("[" * 100_000, '{"a":' * 100_000):
        decoded = redis_wire.decode(
            stream="t", entry_id="1-0", fields={b"id": b"deep", b"headers": deep.encode()}
        )
        assert (decoded.id, decoded.headers) == ("deep", {})


@pytest.mark.parametrize(
    "payload",
    [
        '{"order": 42, "name": "héllo"}'.encode(),
        b"\xef\xbb\xbf" + '{"order": 42, "name": "héllo"}'.encode(),  # a UTF-8 BOM
        '{"order": 42, "name": "héllo"}'.encode("utf-16"),
        '{"order": 42, "name": "héllo"}'.encode("utf-32-le"),
    ],
    ids=["utf-8", "utf-8-bom", "utf-16", "utf-32"],
)
def test_a_json_payload_decodes_in_every_encoding_json_loads_reads(payload: bytes) -> None:
    message = Message(id="m", topic="t", payload=payload)
    assert message.json() == {"order": 42, "name": "héllo"}


@pytest.mark.parametrize("payload", [b"{", b"\xff\xfe\x00", b"", b'{"a": 1} x'])
def test_a_payload_that_is_not_json_raises_what_json_loads_raises(payload: bytes) -> None:
    try:
        json.loads(payload)
    except ValueError as exc:
        expected = exc
    with pytest.raises(type(expected), match=re.escape(str(expected))):
        Message(id="m", topic="t", payload=payload).json()
