"""The MySQL writers' statements: SQL literals of every value, chunks that fit the server's
packet, large payloads as parameters, a large row alone in its statement
(outboxer.writers.mysql)."""

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
    [statement] = mysql.statements(
        NAMES, [row(payload=odd), row(1, key=None, type="é", available_at=when)]
    )
    sql, parameters = statement.sql, statement.parameters
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


def test_chunks_end_at_a_thousand_rows_or_before_a_mebibyte() -> None:
    rows = [row(n) for n in range(2500)]
    statements = list(mysql.statements(NAMES, rows))
    assert [s.sql.count("), (") + 1 for s in statements] == [1000, 1000, 500]
    assert [s.first for s in statements] == [0, 1000, 2000]
    big = [row(n, payload=bytes(40_000)) for n in range(40)]  # 80 kB of hex each
    statements = list(mysql.statements(NAMES, big))
    assert len(statements) == 4  # 3.2 MB of SQL
    assert all(len(s.sql) <= s.size <= (1 << 20) for s in statements)
    # each ends because the next row would not fit
    assert all(s.size > (1 << 20) - 80_300 for s in statements[:-1])


def test_a_statement_over_a_mebibyte_holds_one_row_and_names_it() -> None:
    """Only a single large row makes a statement over a chunk: the one a refusal names, by its
    position in the whole batch (``first``: where ``rows`` start in it)."""
    large = b"'" * 600_000  # a parameter escaped to at most twice its size
    rows = [row(0), row(1), row(2, payload=large), row(3)]
    statements = list(mysql.statements(NAMES, rows, first=5000))
    assert [(s.first, s.row.id) for s in statements] == [
        (5000, "id-0"),
        (5002, "id-2"),
        (5003, "id-3"),
    ]
    assert [s.size > (1 << 20) for s in statements] == [False, True, False]
    assert statements[1].size >= len(statements[1].sql) + 2 * len(large)


def test_a_large_payload_is_a_parameter() -> None:
    large = b"%s'\x00" * 20_000
    rows = [row(0), row(1, payload=large), row(2), row(3, payload=large)]
    [(sql, parameters, *_)] = mysql.statements(NAMES, rows)
    assert parameters == [large, large]
    assert sql.count("%s") == 2
    assert "%" not in sql.replace("%s", "")  # the drivers' % formatting sees only these
    # aiomysql cannot escape bytes: hex digits, restored by the server
    [(sql, parameters, *_)] = mysql.statements(NAMES, rows, escapes_bytes=False)
    assert parameters == [large.hex(), large.hex()]
    assert sql.count("UNHEX(%s)") == 2
