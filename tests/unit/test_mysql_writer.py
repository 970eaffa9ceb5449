"""The MySQL writers' statements: SQL literals of every value, chunks that fit the server's
packet, large payloads as parameters (outboxer.writers.mysql)."""

from __future__ import annotations

import datetime as dt

from outboxer.config import TableNames
from outboxer.message import Row
from outboxer.writers import mysql

NAMES = TableNames(schema="app")


def row(n: int = 0, payload: bytes = b'{"n":0}', **changes: object) -> Row:
    made = Row(f"id-{n}", "orders", "k'1", None, payload, "application/json", "{}", None)
    return made._replace(**changes)


def hexed(value: str | bytes) -> str:
    return f"X'{(value.encode() if isinstance(value, str) else value).hex()}'"


def test_values_are_literals_of_their_bytes() -> None:
    when = dt.datetime(2030, 1, 2, 4, 4, 5, 678000, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    odd = b"\x00'%s\\"
    [(sql, parameters)] = mysql.statements(
        NAMES, [row(payload=odd), row(1, key=None, type="é", available_at=when)]
    )
    assert parameters is None  # nothing for the driver to escape or interpolate
    key, payload = hexed("k'1"), hexed('{"n":0}')
    json, headers = hexed("application/json"), hexed("{}")
    assert sql == (
        "INSERT INTO `app`.`outbox` (`id`, `topic`, `key`, `type`, `payload`, `content_type`, "
        "`headers`, `available_at`) VALUES "
        f"({hexed('id-0')}, {hexed('orders')}, {key}, NULL, {hexed(odd)}, {json}, "
        f"{headers}, DEFAULT), "  # the column's default: the database's clock
        f"({hexed('id-1')}, {hexed('orders')}, NULL, {hexed('é')}, {payload}, {json}, "
        f"{headers}, '2030-01-02 03:04:05.678000')"  # naive UTC
    )


def test_chunks_end_at_a_thousand_rows_or_a_megabyte() -> None:
    rows = [row(n) for n in range(2500)]
    counts = [sql.count("), (") + 1 for sql, _ in mysql.statements(NAMES, rows)]
    assert counts == [1000, 1000, 500]
    big = [row(n, payload=bytes(40_000)) for n in range(40)]  # 80 kB of hex each
    sizes = [len(sql) for sql, _ in mysql.statements(NAMES, big)]
    assert len(sizes) == 3  # 3.2 MB of SQL
    assert all((1 << 20) <= size < (1 << 20) + 80_300 for size in sizes[:-1])  # one row past


def test_a_large_payload_is_a_parameter() -> None:
    large = b"%s'\x00" * 20_000
    rows = [row(0), row(1, payload=large), row(2), row(3, payload=large)]
    [(sql, parameters)] = mysql.statements(NAMES, rows)
    assert parameters == [large, large]
    assert sql.count("%s") == 2
    assert "%" not in sql.replace("%s", "")  # the drivers' % formatting sees only these
    # aiomysql cannot escape bytes: hex digits, restored by the server
    [(sql, parameters)] = mysql.statements(NAMES, rows, escapes_bytes=False)
    assert parameters == [large.hex(), large.hex()]
    assert sql.count("UNHEX(%s)") == 2
