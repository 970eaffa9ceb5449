"""Bulk ``outboxer dlq replay``/``purge`` show a progress bar with a count on a terminal."""

from __future__ import annotations

import os
import pty
import subprocess
import threading

import asyncpg

import outboxer
from outboxer.config import TableNames
from outboxer.ports import ClaimRequest, Settlement
from outboxer.stores.postgres import PostgresStore
from tests.acceptance.conftest import OUTBOXER, Cli
from tests.conftest import wait_past_commit_gate


async def dead_letters(pg_url: str, store: PostgresStore, schema: str, topic: str, n: int) -> None:
    outbox = outboxer.Outbox(schema=schema)
    messages = [{"topic": topic, "payload": {"n": i}, "key": f"k{i}"} for i in range(n)]
    conn = await asyncpg.connect(pg_url)
    try:
        async with conn.transaction():
            await outbox.enqueue_many_async(conn, messages)
    finally:
        await conn.close()
    await wait_past_commit_gate(store)
    while True:
        claim = await store.claim_batch(
            ClaimRequest(limit=500, lease_seconds=30, ordered=False, relay_id="t")
        )
        if not claim.messages:
            return
        await store.settle(claim, Settlement(dead=[(m.id, "broken") for m in claim.messages]))


def run_on_a_terminal(cli: Cli, *args: str) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-terminal (stdout piped); return code, stdout, terminal."""
    controller, terminal = pty.openpty()
    seen: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: the other side is closed
                return
            if not chunk:
                return
            seen.append(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        proc = subprocess.Popen(
            [OUTBOXER, *args],
            stdout=subprocess.PIPE,
            stderr=terminal,
            text=True,
            env=cli.env,
        )
        os.close(terminal)
        out, _ = proc.communicate(timeout=120)
    finally:
        reader.join(timeout=10)
        os.close(controller)
    return proc.returncode, out, b"".join(seen).decode(errors="replace")


async def test_replay_all_shows_a_counted_progress_bar_and_moves_everything(
    cli: Cli, pg_url: str, pg_schema: str
) -> None:
    async with PostgresStore(pg_url, TableNames(schema=pg_schema)) as store:
        await store.migrate()
        await dead_letters(pg_url, store, pg_schema, "orders", 1234)
        assert (await store.stats()).dead_letters == 1234
        dead = [
            row["id"]
            for row in await store.execute("SELECT id FROM {dead_letters} ORDER BY dl_seq")
        ]
        db = ["--database-url", pg_url, "--schema", pg_schema]
        code, out, terminal = run_on_a_terminal(cli, "dlq", "replay", *db, "--all")
        assert code == 0, terminal
        assert "replaying" in terminal and "1234/1234" in terminal and "100%" in terminal
        assert "500/1234" in terminal or "1000/1234" in terminal  # chunks of 500
        assert out.startswith("replayed 1234 dead letter(s)")
        stats = await store.stats()
        assert (stats.dead_letters, stats.pending) == (0, 1234)
        # back in the outbox in the order they were written, as without a terminal: the
        # chunks went newest first, a key's newer messages ahead of its older ones (a probe)
        rows = await store.execute("SELECT id FROM {outbox} ORDER BY seq")
        assert [row["id"] for row in rows] == dead


async def test_purge_by_topic_with_progress_leaves_other_topics(
    cli: Cli, pg_url: str, pg_schema: str
) -> None:
    async with PostgresStore(pg_url, TableNames(schema=pg_schema)) as store:
        await store.migrate()
        await dead_letters(pg_url, store, pg_schema, "orders", 700)
        await dead_letters(pg_url, store, pg_schema, "audit", 30)
        db = ["--database-url", pg_url, "--schema", pg_schema]
        code, out, terminal = run_on_a_terminal(
            cli, "dlq", "purge", *db, "--topic", "orders", "--yes"
        )
        assert code == 0, terminal
        assert "purging" in terminal and "700/700" in terminal
        assert out.startswith("purged 700 dead letter(s)")
        assert (await store.stats()).dead_letters == 30


async def test_json_output_has_no_progress_bar(cli: Cli, pg_url: str, pg_schema: str) -> None:
    async with PostgresStore(pg_url, TableNames(schema=pg_schema)) as store:
        await store.migrate()
        await dead_letters(pg_url, store, pg_schema, "orders", 3)
        db = ["--database-url", pg_url, "--schema", pg_schema]
        code, out, terminal = run_on_a_terminal(cli, "dlq", "replay", *db, "--all", "--json")
        assert code == 0, terminal
        assert terminal.strip() == ""
        assert '"count": 3' in out
