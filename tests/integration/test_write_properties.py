"""Property: whatever the caller passes, ``enqueue`` either refuses it with an ``OutboxerError``
(and the transaction goes on) or stores a row that reads back as what was given.

Hypothesis draws topics, keys, types, ids, headers and payloads from all of Unicode (NUL and
lone surrogates included), over-long strings, non-finite floats, huge ints and wrong types; each
example runs in the open transaction of a real PostgreSQL (psycopg), SQLite or MariaDB (PyMySQL)
connection, and a refusal must leave that transaction usable: the next example writes in the
same one.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pymysql  # type: ignore[import-untyped]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import outboxer
from outboxer.errors import OutboxerError
from outboxer.message import JSON, OCTET_STREAM, TEXT
from outboxer.stores.mysql import MysqlStore
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.sqlite import SqliteStore

# Text from anywhere in Unicode: the default alphabet leaves out surrogates; this one does not.
ANY_CHAR = st.characters(exclude_categories=())
TEXT_VALUES = st.one_of(
    st.text(max_size=12),
    st.text(ANY_CHAR, max_size=12),
    st.text(st.sampled_from("aé€😀\x00"), min_size=60, max_size=300),  # around the byte limit
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(ANY_CHAR, max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(ANY_CHAR, max_size=6), children)
    ),
    max_leaves=12,
)
MESSAGES = st.fixed_dictionaries(
    {"topic": TEXT_VALUES, "payload": JSON_VALUES | st.binary() | TEXT_VALUES},
    optional={
        "key": st.none() | TEXT_VALUES | st.integers() | st.floats(),
        "type": st.none() | TEXT_VALUES,
        "id": TEXT_VALUES,
        "headers": st.none()
        | st.dictionaries(TEXT_VALUES, TEXT_VALUES, max_size=3)
        | st.dictionaries(st.text(max_size=3), st.integers(), min_size=1, max_size=1),
    },
)


def expected_payload(stored: bytes, content_type: str) -> Any:
    """The stored payload decoded back into what ``enqueue`` was given."""
    if content_type == JSON:
        return json.loads(stored)
    if content_type == TEXT:
        return stored.decode()
    assert content_type == OCTET_STREAM
    return stored


def check_round_trip(
    outbox: outboxer.Outbox, conn: Any, read: Callable[[str], Any]
) -> Callable[[dict[str, Any]], None]:
    """The property, on ``conn`` in an open transaction; ``read`` returns the row of one id:
    topic, key, type, payload, content type and headers."""
    used: set[str] = set()

    @settings(
        max_examples=300,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(MESSAGES)
    def check(message: dict[str, Any]) -> None:
        if message.get("id") in used:
            message = {**message, "id": None}  # a reused id is the caller's own conflict
        try:
            message_id = outbox.enqueue(conn, **message)
        except OutboxerError:
            return
        used.add(message_id)
        topic, key, type_, payload, content_type, headers = read(message_id)
        assert topic == message["topic"]
        given_key = message.get("key")
        assert key == (None if given_key is None else str(given_key))
        assert type_ == message.get("type")
        assert json.loads(headers) == (message.get("headers") or {})
        assert expected_payload(bytes(payload), content_type) == message["payload"]
        assert message.get("id") in (None, message_id)

    return check


async def test_enqueue_stores_exactly_what_it_accepts_on_postgres(
    pg_store: PostgresStore, pg_url: str
) -> None:
    outbox = outboxer.Outbox(schema=pg_store.names.schema)
    select = (
        "SELECT topic, key, type, payload, content_type, headers::text "
        f"FROM {pg_store.names.qualified()} WHERE id = %s"
    )
    with psycopg.connect(pg_url) as conn, conn.transaction():  # one transaction for all examples
        check_round_trip(outbox, conn, lambda id_: conn.execute(select, (id_,)).fetchone())()
        assert conn.execute("SELECT 1").fetchone() == (1,)  # still usable at the end


async def test_enqueue_stores_exactly_what_it_accepts_on_sqlite(
    sqlite_store: SqliteStore, sqlite_path: Path
) -> None:
    select = "SELECT topic, key, type, payload, content_type, headers FROM outbox WHERE id = ?"
    conn = sqlite3.connect(sqlite_path)
    try:
        with conn:
            check_round_trip(
                outboxer.Outbox(), conn, lambda id_: conn.execute(select, (id_,)).fetchone()
            )()
    finally:
        conn.close()


async def test_enqueue_stores_exactly_what_it_accepts_on_mariadb(
    mysql_store: MysqlStore, mysql_database: str
) -> None:
    # The MySQL writers send every value as a SQL literal of its bytes (outboxer.writers.mysql).
    select = "SELECT topic, `key`, type, payload, content_type, headers FROM outbox WHERE id = %s"
    conn = pymysql.connect(host="127.0.0.1", user="root", database=mysql_database)

    def read(message_id: str) -> tuple[Any, ...]:
        with conn.cursor() as cursor:
            cursor.execute(select, (message_id,))
            topic, key, type_, payload, content_type, headers = cursor.fetchone()
        # VARBINARY columns read back as bytes: their text is UTF-8
        text = [None if v is None else v.decode() for v in (topic, key, type_, content_type)]
        return text[0], text[1], text[2], payload, text[3], headers

    try:
        conn.begin()
        check_round_trip(outboxer.Outbox(schema=mysql_database), conn, read)()
        conn.commit()
    finally:
        conn.close()
