"""Where a bulk write's time goes on MariaDB: CPU per message of the client and of the server.

The transactions of :mod:`benchmarks.bulk_writes` (10,000 messages, ``enqueue`` per message or
one ``enqueue_many``, from the first write to the commit's return) through PyMySQL and asyncmy,
measured per message: wall time, the client's CPU (``time.process_time``) and the CPU of the
MariaDB server process (from ``/proc``, so the server must run on this machine: its pid is read
from ``@@pid_file``; every thread of the server counts, background ones too). Also the two
client steps of ``enqueue_many`` alone, without a database: ``Outbox.rows`` (validating and
encoding, shared by every database) and the MySQL writer's statements
(``outboxer.writers.mysql.statements``; absent from trees older than that function). CPU is
summed over ``ROUNDS`` rounds: the server's is counted in clock ticks (10 ms), 0.3 µs per
message over 30,000.

Run: ``PYTHONPATH=. .venv/bin/python -m benchmarks.bulk_writes_cpu``; an older tree with this
file: ``PYTHONPATH=<old tree>/src:. .venv/bin/python -m benchmarks.bulk_writes_cpu``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pymysql  # type: ignore[import-untyped]

from benchmarks.bulk_writes import DRIVERS, MYSQL_DATABASE, N, empty, messages, outbox_of, write
from benchmarks.common import save
from benchmarks.inbox_cpu import backend_seconds
from outboxer.config import TableNames
from outboxer.stores.mysql import MysqlStore

ROUNDS = 3
MYSQL = ("mariadb_pymysql", "mariadb_asyncmy")


def server_pid() -> int:
    with contextlib.closing(pymysql.connect(host="127.0.0.1", user="root")) as conn:
        cursor = conn.cursor()
        cursor.execute("SELECT @@pid_file")
        (pid_file,) = cursor.fetchone()
    return int(Path(pid_file).read_text())


async def one_round(driver: str, bulk: bool, pid: int) -> tuple[float, float, float]:
    """(wall, client CPU, server CPU) seconds of one transaction of ``N`` messages."""
    outbox = outbox_of(driver)
    batch = messages()
    committed: list[float] = []
    async with DRIVERS[driver](committed) as (conn, is_async):
        started, client, server = time.perf_counter(), time.process_time(), backend_seconds([pid])
        await write(outbox, conn, is_async, bulk, batch)
    return (
        committed[0] - started,
        time.process_time() - client,
        backend_seconds([pid]) - server,
    )


def client_steps() -> dict[str, float]:
    """µs per message of ``enqueue_many``'s client steps alone (best of ``ROUNDS``)."""
    outbox = outbox_of(MYSQL[0])
    batch = messages()
    steps: dict[str, float] = {}
    for _ in range(ROUNDS):
        started = time.process_time()
        rows = outbox.rows(batch)
        rows_cpu = time.process_time() - started
        steps["rows_us"] = min(steps.get("rows_us", 1e9), rows_cpu / N * 1e6)
        try:
            # (absent from trees older than the function)
            from outboxer.writers.mysql import statements
        except ImportError:
            continue
        started = time.process_time()
        for _ in statements(TableNames(schema=MYSQL_DATABASE), rows):
            pass
        statements_cpu = time.process_time() - started
        steps["statements_us"] = min(steps.get("statements_us", 1e9), statements_cpu / N * 1e6)
    return steps


async def main() -> dict[str, Any]:
    pid = server_pid()
    names = TableNames(schema=MYSQL_DATABASE)
    async with MysqlStore("mysql://root@127.0.0.1:3306/test", names) as store:
        await store.migrate()
    sums: dict[tuple[str, bool], list[float]] = {}
    try:
        for _ in range(ROUNDS):
            for driver in MYSQL:
                for bulk in (False, True):
                    measured = await one_round(driver, bulk, pid)
                    total = sums.setdefault((driver, bulk), [1e9, 0.0, 0.0])
                    total[0] = min(total[0], measured[0])
                    total[1] += measured[1]
                    total[2] += measured[2]
                    await empty(driver)
    finally:
        with contextlib.closing(pymysql.connect(host="127.0.0.1", user="root")) as conn:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{MYSQL_DATABASE}`")
    result: dict[str, Any] = {"messages": N, "rounds": ROUNDS, **client_steps()}
    for (driver, bulk), (wall, client, server) in sums.items():
        way = "enqueue_many" if bulk else "enqueue"
        figures = {
            "wall_us": round(wall / N * 1e6, 1),  # the best round
            "client_cpu_us": round(client / N / ROUNDS * 1e6, 1),
            "server_cpu_us": round(server / N / ROUNDS * 1e6, 1),
        }
        result.setdefault(driver, {})[way] = figures
        print(
            f"{driver:16} {way:12} wall {figures['wall_us']:6.1f}  client CPU "
            f"{figures['client_cpu_us']:5.1f}  server CPU {figures['server_cpu_us']:5.1f} µs/msg"
        )
    print(", ".join(f"{name} {value:.2f}" for name, value in result.items() if "_us" in name))
    save("bulk_writes_cpu", result)
    return result


if __name__ == "__main__":
    asyncio.run(main())
