"""The ``outboxer`` command, driven as a user drives it: a subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import shlex
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

import outboxer
from outboxer.config import TableNames
from outboxer.stores import _sql, open_store
from tests.acceptance.conftest import OUTBOXER, Cli, assert_one_line_error, lines
from tests.conftest import give_up_on

INPROCESS = "inprocess://tests.acceptance.handlers:registry"
RELAY = ["--database-url", "sqlite:///UPGRADED", "--broker", INPROCESS]
HANDLERS = "tests.acceptance.handlers:registry"
CONSUME = ["--broker", "redis://127.0.0.1:6379/0", "--handlers", HANDLERS, "--topic", "t"]


def wait_until(predicate, timeout: float = 60, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'app.db'}"


class Database:
    """A database as the CLI sees it (its options) and as an application writes to it."""

    def __init__(self, url: str, schema: str | None = None) -> None:
        self.url, self.schema = url, schema
        self.args = ["--database-url", url, *(["--schema", schema] if schema else [])]
        self.outbox = outboxer.Outbox(schema=schema)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        """A connection of the application, committed at the end."""
        if self.url.startswith("sqlite"):
            conn: Any = sqlite3.connect(self.url.removeprefix("sqlite:///"))
        elif self.url.startswith("mariadb"):
            conn = pymysql.connect(host="127.0.0.1", user="root", database=self.schema)
        else:
            conn = psycopg.connect(self.url)
        try:
            yield conn
            conn.commit()
        finally:
            conn.close()

    async def give_up_on(self, message_id: str) -> None:
        """A consumer of this database gives up on ``message_id``: a consume dead letter."""
        async with open_store(self.url, TableNames(schema=self.schema)) as store:
            await give_up_on(store, message_id)

    def write(self, count: int, *, poison: int = 0) -> list[str]:
        """``count`` orders of their own keys, then ``poison`` messages handlers reject."""
        messages = [{"topic": "orders", "payload": {"n": n}, "key": str(n)} for n in range(count)]
        messages += [
            {"topic": "audit", "payload": {"p": n}, "key": f"p{n}", "type": "Poison"}
            for n in range(poison)
        ]
        with self.transaction() as conn:
            return [self.outbox.enqueue(conn, **message) for message in messages]


@pytest.fixture
def sqlite_db(sqlite_url: str) -> Database:
    return Database(sqlite_url)


@pytest.fixture
def mariadb_db(mysql_url: str, mysql_database: str) -> Database:
    return Database(mysql_url.replace("mysql://", "mariadb://"), mysql_database)


@pytest.fixture(params=["sqlite", "mariadb"])
def database(request: pytest.FixtureRequest) -> Database:
    """SQLite (the embedded default) and a server database, the CLI the same on both."""
    return request.getfixturevalue(f"{request.param}_db")


@pytest.fixture(params=["postgres", "mariadb"])
def server_database(request: pytest.FixtureRequest) -> Database:
    if request.param == "postgres":
        return Database(request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema"))
    return request.getfixturevalue("mariadb_db")


def test_help_lists_every_environment_variable(cli: Cli) -> None:
    result = cli("relay", "--help")
    assert result.returncode == 0
    for variable in (
        "OUTBOXER_DATABASE_URL",
        "OUTBOXER_BROKER",
        "OUTBOXER_BATCH_SIZE",
        "OUTBOXER_MAX_ATTEMPTS",
        "OUTBOXER_UNORDERED",
        "OUTBOXER_LEASE_SECONDS",
    ):
        assert variable in result.stdout


def test_db_upgrade_is_idempotent_on_sqlite(cli: Cli, sqlite_url: str) -> None:
    first = cli("db", "upgrade", "--database-url", sqlite_url)
    latest = _sql.migrations("sqlite")[-1].version
    assert first.returncode == 0 and f"upgraded to version {latest}" in first.stdout
    again = cli("db", "upgrade", "--database-url", sqlite_url)
    assert again.returncode == 0 and "up to date" in again.stdout


def test_an_sqlite_path_that_cannot_be_a_database_is_one_line(cli: Cli, tmp_path: Path) -> None:
    """Found by a probe: after the one-line error, aiosqlite's thread reported to the closed
    event loop: a 25-line traceback, most runs."""
    directory = f"sqlite:///{tmp_path}"
    for command in (["stats"], ["dlq", "list"], ["db", "upgrade"]):
        result = cli(*command, "--database-url", directory)
        assert_one_line_error(result, 2, "is a directory, not a database file")
    unopenable = f"sqlite:///{tmp_path}/{'a' * 300}"  # a name longer than the system allows
    assert_one_line_error(cli("db", "upgrade", "--database-url", unopenable), 1, "cannot open")


def test_db_upgrade_is_idempotent_on_a_server_database(cli: Cli, server_database: Database) -> None:
    cli.env["OUTBOXER_DATABASE_URL"] = server_database.url  # options come from the environment
    cli.env["OUTBOXER_SCHEMA"] = server_database.schema or ""
    assert "upgraded" in cli("db", "upgrade").stdout
    assert "up to date" in cli("db", "upgrade").stdout


def test_relay_delivers_then_stops_gracefully_on_sigterm(
    cli: Cli, sqlite_url: str, sink: Path
) -> None:
    assert cli("db", "upgrade", "--database-url", sqlite_url).returncode == 0
    ids = Database(sqlite_url).write(300)
    relay = cli.start(
        "relay", "--database-url", sqlite_url, "--broker", INPROCESS, "--poll-interval", "0.1"
    )
    try:
        wait_until(lambda: len(lines(sink)) >= 300, what="300 deliveries")
        relay.send_signal(signal.SIGTERM)
        _, stderr = relay.communicate(timeout=30)
    finally:
        relay.kill()
    assert relay.returncode == 0, stderr
    assert "stopped" in stderr
    assert sorted(lines(sink)) == sorted(ids)
    stats = json.loads(cli("stats", "--database-url", sqlite_url, "--json").stdout)
    assert (stats["pending"], stats["in_flight"], stats["relays"]) == (0, 0, [])


def test_kill_9_mid_stream_loses_nothing_and_duplicates_stay_bounded(
    cli: Cli, server_database: Database, sink: Path
) -> None:
    batch, window, total = 200, 2, 20_000
    base = server_database.args
    assert cli("db", "upgrade", *base).returncode == 0
    messages = [{"topic": "orders", "payload": {"n": n}, "key": n % 500} for n in range(total)]
    with server_database.transaction() as conn:
        ids = set(server_database.outbox.enqueue_many(conn, messages))
    relay_args = [
        "relay",
        *base,
        "--broker",
        INPROCESS,
        "--batch-size",
        str(batch),
        "--window",
        str(window),
        "--lease-seconds",
        "3",
    ]
    cli.env["OUTBOXER_TEST_DELAY"] = "0.0001"
    first = cli.start(*relay_args)
    try:
        wait_until(lambda: len(lines(sink)) >= total // 3, what="a third delivered")
        first.kill()  # SIGKILL: no cleanup, its claims stay leased until they expire
        first.communicate(timeout=10)
    finally:
        first.kill()
    delivered_before = len(lines(sink))
    assert delivered_before < total, "the relay finished before it could be killed"
    second = cli.start(*relay_args)
    try:
        wait_until(lambda: set(lines(sink)) >= ids, timeout=120, what="every message")
        second.send_signal(signal.SIGTERM)
        second.communicate(timeout=30)
    finally:
        second.kill()
    delivered = lines(sink)
    duplicates = len(delivered) - len(set(delivered))
    print(
        f"\nkill -9 after {delivered_before} deliveries: {duplicates} duplicates "
        f"(bound: window × batch = {window * batch})"
    )
    assert set(delivered) == ids
    assert duplicates <= window * batch
    stats = json.loads(cli("stats", *base, "--json").stdout)
    assert (stats["pending"], stats["in_flight"], stats["dead_letters"]) == (0, 0, 0)


def test_dead_letters_listed_shown_replayed_and_purged(cli: Cli, database: Database) -> None:
    db = database.args
    assert cli("db", "upgrade", *db).returncode == 0
    ids = database.write(2, poison=3)
    poison = ids[2:]
    relay = cli.start(
        "relay", *db, "--broker", INPROCESS, "--retry-base", "0.05", "--poll-interval", "0.05"
    )
    try:

        def dead_count() -> int:
            return int(json.loads(cli("stats", *db, "--json").stdout)["dead_letters"])

        wait_until(lambda: dead_count() == 3, what="three dead letters")
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.communicate(timeout=30)

    page = json.loads(cli("dlq", "list", *db, "--json", "--limit", "2").stdout)
    assert len(page["items"]) == 2 and page["next_cursor"]
    rest = json.loads(cli("dlq", "list", *db, "--json", "--cursor", page["next_cursor"]).stdout)
    listed = [d["id"] for d in page["items"] + rest["items"]]
    assert sorted(listed) == sorted(poison) and rest["next_cursor"] is None
    shown = json.loads(cli("dlq", "show", *db, poison[0], "--json").stdout)
    assert shown["attempts"] == 3 and shown["direction"] == "publish"
    assert shown["type"] == "Poison" and shown["topic"] == "audit"
    assert "always rejected" in shown["failure_reason"]
    chosen = cli("dlq", "show", *db, poison[0], "--direction", "publish", "--json")
    assert json.loads(chosen.stdout) == shown
    none = cli("dlq", "show", *db, poison[0], "--direction", "consume")
    assert_one_line_error(none, 1, f"no consume dead letter with id '{poison[0]}'")
    assert cli("dlq", "show", *db, poison[0], "--direction", "both").returncode == 2
    consumed = cli("dlq", "list", *db, "--direction", "consume", "--json")
    assert json.loads(consumed.stdout)["items"] == []  # only publish dead letters here
    published = cli("dlq", "list", *db, "--direction", "publish", "--json")
    assert len(json.loads(published.stdout)["items"]) == 3
    nothing = cli("dlq", "purge", *db, "--direction", "consume", "--yes", "--json")
    assert json.loads(nothing.stdout) == {"purged": [], "count": 0, "not_found": []}
    assert cli("dlq", "replay", *db, "--direction", "sideways").returncode == 2
    # An empty filter (an unset variable in a script) is refused, as by the API (a probe).
    empty = cli("dlq", "purge", *db, "--key", "", "--yes")
    assert_one_line_error(empty, 2, "'--key': cannot be empty")
    lost = cli("dlq", "list", *db, "--cursor", "")  # a lost cursor is not the first page
    assert_one_line_error(lost, 2, "invalid cursor ''")
    table = cli("dlq", "list", *db).stdout  # the human table
    assert "DIRECTION" in table and "always rejected" in table
    assert [line.split()[:2] for line in table.splitlines()[1:]] == [[i, "publish"] for i in listed]

    # One unknown id among known ones: refused by name, and nothing replayed or purged (as the
    # API's 404), so a typo never leaves half of a command done.
    for command, done in ((["replay"], "replayed"), (["purge", "--yes"], "purged")):
        refused = cli("dlq", *command, *db, poison[0], "no-such-id")  # no "replayed 0" first
        assert_one_line_error(refused, 1, "no dead letter with id 'no-such-id'")
        assert refused.stdout == ""
        typo = cli("dlq", *command, *db, poison[0], "no-such-id", "--json")
        assert typo.returncode == 1 and "no dead letter with id 'no-such-id'" in typo.stderr
        expected = {done: [], "count": 0, "not_found": ["no-such-id"]}
        assert json.loads(typo.stdout) == expected | (
            {"skipped": []} if command == ["replay"] else {}
        )
    assert json.loads(cli("stats", *db, "--json").stdout)["dead_letters"] == 3

    replayed = json.loads(cli("dlq", "replay", *db, poison[0], "--json").stdout)
    assert replayed == {"replayed": [poison[0]], "count": 1, "not_found": [], "skipped": []}
    stats = json.loads(cli("stats", *db, "--json").stdout)
    assert (stats["pending"], stats["dead_letters"]) == (1, 2)
    # The application writes a dead letter's id anew: replaying it is refused, by name.
    with database.transaction() as conn:
        database.outbox.enqueue(conn, "audit", {"p": "anew"}, id=poison[1])
    again = cli("dlq", "replay", *db, poison[1])
    assert again.returncode == 1 and "in the outbox again" in again.stderr
    assert "no dead letter" not in again.stderr
    # ... also when a consumer gave up on that id too, whose consume dead letter is replayed
    # (found by a probe: the skip went unsaid, exit 0).
    asyncio.run(database.give_up_on(poison[1]))
    both = cli("dlq", "replay", *db, poison[1], "--json")
    assert both.returncode == 1 and "in the outbox again" in both.stderr
    assert json.loads(both.stdout) == {
        "replayed": [poison[1]],
        "count": 1,
        "not_found": [],
        "skipped": [poison[1]],
    }

    purged = cli("dlq", "purge", *db, "--topic", "audit", "--yes")
    assert purged.returncode == 0 and "purged 2" in purged.stdout
    assert json.loads(cli("dlq", "list", *db, "--json").stdout)["items"] == []


def test_messages_list_and_show_where_each_waits(cli: Cli, database: Database) -> None:
    """``outboxer messages``: the outbox before the dead letter, without touching SQL."""
    db = database.args
    assert cli("db", "upgrade", *db).returncode == 0
    ids = database.write(3, poison=1)
    with database.transaction() as conn:
        later = database.outbox.enqueue(
            conn, "orders", {"n": 9}, available_at=dt.timedelta(hours=1)
        )

    page = json.loads(cli("messages", "list", *db, "--json", "--limit", "2").stdout)
    assert [m["id"] for m in page["items"]] == ids[:2] and page["next_cursor"]
    rest = cli("messages", "list", *db, "--json", "--cursor", page["next_cursor"]).stdout
    assert [m["id"] for m in json.loads(rest)["items"]] == [*ids[2:], later]
    scheduled = json.loads(cli("messages", "list", *db, "--json", "--state", "scheduled").stdout)
    assert [(m["id"], m["state"]) for m in scheduled["items"]] == [(later, "scheduled")]
    audit = json.loads(cli("messages", "list", *db, "--json", "--topic", "audit").stdout)
    assert [m["type"] for m in audit["items"]] == ["Poison"]

    shown = json.loads(cli("messages", "show", *db, ids[3], "--json").stdout)
    assert (shown["state"], shown["attempts"], shown["key"]) == ("pending", 0, "p0")
    assert shown["payload"] == {"p": 0} and shown["last_error"] is None
    table = cli("messages", "list", *db).stdout
    assert "pending" in table and "scheduled" in table and ids[0] in table
    missing = cli("messages", "show", *db, "no-such-id")
    assert missing.returncode == 1 and "no message with id 'no-such-id'" in missing.stderr
    bad = cli("messages", "list", *db, "--state", "stuck")
    assert bad.returncode == 2 and "stuck" in bad.stderr


def test_purge_asks_before_deleting(cli: Cli, sqlite_url: str) -> None:
    assert cli("db", "upgrade", "--database-url", sqlite_url).returncode == 0
    result = cli("dlq", "purge", "--database-url", sqlite_url, "--all", input="n\n")
    assert result.returncode == 1 and "nothing deleted" in result.stderr


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["stats", "--database-url", "mongodb://x"], 2, ["unsupported database URL"]),
        (["stats", "--database-url", "postgresql://u:secret@127.0.0.1:1/x"], 1, ["cannot connect"]),
        (
            ["stats", "--database-url", "sqlite:///SQLITE", "--table", "x;drop"],
            2,
            ["invalid table name"],
        ),
        (["stats", "--database-url", "sqlite:///SQLITE"], 1, ["db upgrade"]),
        (["stats"], 2, ["--database-url"]),
        (
            ["relay", "--database-url", "sqlite:///SQLITE", "--broker", "ftp://x"],
            2,
            ["unsupported broker URL"],
        ),
        (
            ["relay", "--database-url", "sqlite:///SQLITE", "--broker", "inprocess://nope.mod:r"],
            2,
            ["cannot import handler module"],
        ),
        (["relay", "--database-url", "sqlite:///SQLITE", "--broker", INPROCESS], 1, ["db upgrade"]),
        (
            ["relay", "--database-url", "sqlite:///SQLITE", "--broker", "x", "--batch-size", "0"],
            2,
            ["batch-size"],
        ),
        (
            ["dlq", "show", "--database-url", "sqlite:///UPGRADED", "missing-id"],
            1,
            ["no dead letter"],
        ),
        (["dlq", "replay", "--database-url", "sqlite:///UPGRADED"], 2, ["--all"]),
        (
            ["dlq", "replay", "--database-url", "sqlite:///UPGRADED", "--all", "--topic", "t"],
            2,
            ["--all"],
        ),
        (
            ["dlq", "list", "--database-url", "sqlite:///UPGRADED", "--cursor", "zzz"],
            2,
            ["invalid cursor"],
        ),
        # Found by a probe: SQLite said "unexpected OverflowError" (exit 1).
        (
            ["dlq", "list", "--database-url", "sqlite:///UPGRADED", "--cursor", "9" * 23],
            2,
            ["invalid cursor"],
        ),
        (
            ["messages", "list", "--database-url", "sqlite:///UPGRADED", "--cursor", "9" * 19],
            2,
            ["invalid cursor"],
        ),
        (["dlq", "replay", "--database-url", "sqlite:///UPGRADED", "nope"], 1, ["no dead letter"]),
        (["dlq", "replay", "--database-url", "sqlite:///UPGRADED", "ok", ""], 2,
         ["IDS", "an id cannot be empty"]),
        (["messages", "show", "--database-url", "sqlite:///UPGRADED", ""], 2,
         ["MESSAGE_ID", "an id cannot be empty"]),
        # Bytes that are not UTF-8 (a pasted id in another encoding): a usage error by name,
        # on every database (SQLite said "unexpected UnicodeEncodeError", PostgreSQL's driver
        # refused them in its own words, MySQL found nothing).
        (["dlq", "show", "--database-url", "sqlite:///UPGRADED", "ab\udcff"], 2,
         ["DEAD_LETTER_ID", "not valid UTF-8", "character 3"]),
        (["dlq", "purge", "--yes", "--database-url", "sqlite:///UPGRADED", "ok", "\udcff"], 2,
         ["IDS", "not valid UTF-8"]),
        (["messages", "list", "--database-url", "sqlite:///UPGRADED", "--key", "\udcfe"], 2,
         ["--key", "not valid UTF-8"]),
        (["messages", "show", "--database-url", "sqlite:///UPGRADED", "\udcfe"], 2,
         ["MESSAGE_ID", "not valid UTF-8"]),
        (["stats", "--database-url", "postgresql://u\udcff:secret@127.0.0.1/db"], 2,
         ["--database-url", "not valid UTF-8"]),
        # Numbers that would break the relay later are refused at start.
        (["relay", *RELAY, "--retry-cap", "nan"], 2, ["--retry-cap", "finite"]),
        (["relay", *RELAY, "--retry-base", "nan"], 2, ["--retry-base", "finite"]),
        (["relay", *RELAY, "--dead-letter-retention", "1e300"], 2, ["--dead-letter-retention"]),
        (["relay", *RELAY, "--dead-letter-retention", "inf"], 2, ["--dead-letter-retention"]),
        (["relay", *RELAY, "--retry-base", "600"], 2, ["--retry-cap", "below base"]),
        (["serve", "--database-url", "sqlite:///UPGRADED", "--host", " "], 2, ["--host"]),
        (["relay", *RELAY, "--metrics-host", "", "--metrics-port", "9"], 2, ["--metrics-host"]),
        (["serve", "--database-url", "sqlite:///UPGRADED", "--ready-max-age", "nan"], 2,
         ["--ready-max-age", "finite"]),
        # Database URLs a driver cannot read: one line, exit 2, no piece of the password.
        (["stats", "--database-url", "postgresql://u:secret@127.0.0.1:abc/db"], 2, ["abc"]),
        (["stats", "--database-url", "postgresql://u:secret@127.0.0.1:99999/db"], 2, ["port"]),
        (["stats", "--database-url", "postgresql://u:secret@[::1/db"], 2, ["IPv6"]),
        (["stats", "--database-url", "postgresql://u:hunter2/secret@127.0.0.1/db"], 2,
         ["invalid database URL", "percent-encode"]),
        (["db", "upgrade", "--database-url", "postgresql://u:hunter2/secret@127.0.0.1/db"], 2,
         ["invalid database URL"]),
        (["consume", *CONSUME, "--database-url", "postgresql://u:hunter2/secret@127.0.0.1/db"],
         2, ["invalid database URL"]),
        (["consume", *CONSUME, "--database-url", "sqlite:///UPGRADED", "--shutdown-timeout",
          "nan"], 2, ["--shutdown-timeout", "finite"]),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_changes_nothing(
    cli: Cli, tmp_path: Path, args: list[str], code: int, words: list[str]
) -> None:
    upgraded = f"sqlite:///{tmp_path / 'upgraded.db'}"
    assert cli("db", "upgrade", "--database-url", upgraded).returncode == 0
    before = (tmp_path / "upgraded.db").read_bytes()
    args = [
        a.replace("sqlite:///SQLITE", f"sqlite:///{tmp_path / 'empty.db'}").replace(
            "sqlite:///UPGRADED", upgraded
        )
        for a in args
    ]
    result = cli(*args)
    assert_one_line_error(result, code, *words)
    assert "secret" not in result.stderr and "hunter2" not in result.stderr
    assert (tmp_path / "upgraded.db").read_bytes() == before


#: Handler modules a careless user might point at, and the one line each must give.
HOSTILE_HANDLERS = {
    "empty": ("registry = __import__('outboxer.inbox').inbox.HandlerRegistry()", "no handlers"),
    "raising": ("raise RuntimeError('boom on import')", "RuntimeError: boom on import"),
    "broken": ("def f(:", "SyntaxError"),
    "exiting": ("import sys; sys.exit(0)", "SystemExit: 0"),
    "recursing": ("def f(): return f()\nf()", "RecursionError"),
}


@pytest.mark.parametrize("module", sorted(HOSTILE_HANDLERS))
@pytest.mark.parametrize("command", ["relay", "consume"])
def test_a_handler_module_that_cannot_serve_is_refused_in_one_line(
    cli: Cli, tmp_path: Path, module: str, command: str
) -> None:
    """Found by a probe: a module raising on import was an 'unexpected' exit 1 (a SyntaxError,
    a RecursionError), sys.exit() in it exited 0 silently, and an empty registry started a
    relay that dead-lettered every message. Handler modules are found in the current
    directory (--app-dir's default) by both commands."""
    source, words = HOSTILE_HANDLERS[module]
    (tmp_path / f"{module}_handlers.py").write_text(source + "\n")
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    assert cli("db", "upgrade", "--database-url", url).returncode == 0
    spec = f"{module}_handlers:registry"
    args = {
        "relay": ["relay", "--broker", f"inprocess://{spec}", "--drain"],
        "consume": ["consume", "--broker", "redis://127.0.0.1:6379/0", "--handlers", spec,
                    "--topic", "t"],
    }[command]  # fmt: skip
    result = subprocess.run(
        [OUTBOXER, *args, "--database-url", url],
        capture_output=True, text=True, env=cli.env, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert_one_line_error(result, 2, *words.split(", "))


@pytest.mark.parametrize("spec", [":registry", "..:x", ".mod:registry", "mod:", "a-b:registry"])
@pytest.mark.parametrize("command", ["relay", "consume"])
def test_a_malformed_handlers_spec_is_named_as_such(cli: Cli, spec: str, command: str) -> None:
    """Not 'invalid consumer name' (made of the spec before it was checked), nor a TypeError
    leaked from importlib for a relative module."""
    args = {
        "relay": ["relay", "--broker", f"inprocess://{spec}"],
        "consume": ["consume", "--broker", "redis://127.0.0.1:6379/0", "--handlers", spec],
    }[command]
    result = cli(*args, "--database-url", "sqlite:///unused.db")
    assert_one_line_error(result, 2, "package.module:registry")


@pytest.mark.parametrize("command", [["stats"], ["db", "upgrade"], ["dlq", "list"]])
def test_a_file_that_is_not_a_database_is_one_line_and_the_command_exits(
    cli: Cli, tmp_path: Path, command: list[str]
) -> None:
    """The failed open must not leave aiosqlite's connection thread behind: it kept the
    process alive after the error was printed, so the command never exited."""
    path = tmp_path / "notes.db"
    path.write_bytes(b"not a database, " * 100)
    result = cli(*command, "--database-url", f"sqlite:///{path}", timeout=20)
    assert_one_line_error(result, 1, "file is not a database")
    assert path.read_bytes() == b"not a database, " * 100


def test_demo_tells_the_whole_story(cli: Cli) -> None:
    result = cli("demo")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "delivered (3)" in out
    assert "never sent (1)" in out and "rolled back" in out
    assert "dead-lettered (1)" in out and "after 3 attempts" in out
    assert "welcome e-mail sent to bob@example.com" in out
    assert result.stderr.strip() == "", "the demo narrates itself: no relay log lines"


def test_the_demo_names_its_database_in_a_command_that_works(cli: Cli, tmp_path: Path) -> None:
    """Found by a probe: the demo printed ``sqlite:///`` and the path as it is, so a database
    whose name holds a space, ``?``, ``#`` or ``%`` (or a quote, for the shell) was named in a
    command that failed ("the URL contains spaces", "unknown option", another file)."""
    path = tmp_path / "it's my demo?x=1#2%41.db"
    result = cli("demo", "--database", str(path))
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if "Inspect or replay it:" in x)
    command = shlex.split(line.partition("Inspect or replay it: ")[2])
    assert command[:3] == ["outboxer", "dlq", "list"]
    listed = cli(*command[1:])
    assert listed.returncode == 0, listed.stderr
    assert "UserRegistered" in listed.stdout and "user-2" in listed.stdout
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".db") == [path.name]


async def test_dlq_list_and_show_escape_terminal_control_sequences(
    cli: Cli, sqlite_url: str
) -> None:
    """Topic, key, type, id, reason and relay id come from producers, errors and options:
    printed raw, an escape sequence would recolour, clear or retitle the operator's terminal."""
    from outboxer.config import TableNames
    from outboxer.inbox import consume
    from outboxer.message import Message
    from outboxer.ports import ConsumeFailure, RelayInfo
    from outboxer.stores.sqlite import SqliteStore

    db = ["--database-url", sqlite_url]
    assert cli("db", "upgrade", *db).returncode == 0
    hostile = Message(
        id="evil\x1b]0;owned\x07",
        topic="orders\x1b[31m",
        payload=b"{}",
        key="k\x1b[2J",
        type="T\r",
    )

    async def failing(message: Message, connection: object, attempt: int) -> None:
        raise RuntimeError("no")

    def give_up(message: Message, attempts: int, error: Exception) -> ConsumeFailure:
        return ConsumeFailure("boom\x1b[0m\u202e", None)

    now = dt.datetime.now(dt.UTC)
    async with SqliteStore(sqlite_url, TableNames()) as store:
        outcomes = await consume(
            store, "mailer", [hostile], failing, on_failure=give_up, retention_seconds=60
        )
        await store.heartbeat(RelayInfo("relay\x1b[2J", "h", 1, now, now))
    assert outcomes == ["dead"]
    stats = cli("stats", *db)
    assert "\x1b" not in stats.stdout and "relay\\x1b[2J" in stats.stdout

    listed = cli("dlq", "list", *db)
    shown = cli("dlq", "show", *db, hostile.id)
    for result in (listed, shown):
        assert result.returncode == 0, result.stderr
        assert "\x1b" not in result.stdout and "\x07" not in result.stdout
        assert "\u202e" not in result.stdout and "\r" not in result.stdout
        assert "orders\\x1b[31m" in result.stdout
    assert "evil\\x1b]0;owned\\x07" in shown.stdout and "k\\x1b[2J" in shown.stdout
    assert "boom\\x1b[0m\\u202e" in shown.stdout and "T\\r" in shown.stdout
    as_json = json.loads(cli("dlq", "show", *db, hostile.id, "--json").stdout)
    assert as_json["topic"] == hostile.topic  # JSON keeps the exact text (escaped by JSON)


def test_relay_drain_publishes_what_is_due_and_exits_0(
    cli: Cli, database: Database, sink: Path
) -> None:
    db = database.args
    assert cli("db", "upgrade", *db).returncode == 0
    ids = database.write(3, poison=1)
    with database.transaction() as conn:
        later = database.outbox.enqueue(
            conn, "orders", {"n": "later"}, available_at=dt.timedelta(hours=1)
        )
    result = cli("relay", *db, "--broker", INPROCESS, "--drain", "--retry-base", "0.05")
    assert result.returncode == 0, result.stderr
    # The poison message's retries were waited for; the scheduled one stays for a later run.
    assert result.stdout == "drained: 3 published, 1 dead-lettered, 1 scheduled for later\n"
    assert sorted(lines(sink)) == sorted(ids[:3])
    stats = json.loads(cli("stats", *db, "--json").stdout)
    assert (stats["pending"], stats["scheduled"], stats["dead_letters"]) == (1, 1, 1)
    [left] = json.loads(cli("messages", "list", *db, "--json").stdout)["items"]
    assert (left["id"], left["state"]) == (later, "scheduled")


def test_relay_drain_leaves_what_a_key_holds_behind_a_scheduled_message(
    cli: Cli, sqlite_db: Database, sink: Path
) -> None:
    """A due message behind a scheduled one of its key cannot be published by an ordered
    relay now: the drain waited for it until its timeout and exited 1 (a probe)."""
    db = sqlite_db.args
    assert cli("db", "upgrade", *db).returncode == 0
    with sqlite_db.transaction() as conn:
        outbox = sqlite_db.outbox
        outbox.enqueue(conn, "orders", {"n": 0}, key="o1", available_at=dt.timedelta(days=1))
        outbox.enqueue(conn, "orders", {"n": 1}, key="o1")
        due = outbox.enqueue(conn, "orders", {"n": 2}, key="o2")
    result = cli("relay", *db, "--broker", INPROCESS, "--drain", "--drain-timeout", "30")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "drained: 1 published, 0 dead-lettered, 2 scheduled for later\n"
    assert lines(sink) == [due]


def test_relay_drain_gives_up_after_its_timeout_with_one_line(
    cli: Cli, sqlite_db: Database
) -> None:
    db = sqlite_db.args
    assert cli("db", "upgrade", *db).returncode == 0
    sqlite_db.write(2)
    down = "http://127.0.0.1:9/hook"  # the discard port: nothing listens there
    result = cli(
        "--log-level", "ERROR", "relay", *db, "--broker", down, "--drain", "--drain-timeout", "1.5"
    )
    assert_one_line_error(
        result,
        1,
        "drain did not finish within 1.5 s: 2 messages still to publish",
        "broker unavailable for 1 rounds",
    )


def test_a_stopping_relay_held_by_a_handler_exits_at_a_second_signal(
    cli: Cli, sqlite_db: Database, sink: Path
) -> None:
    """An ``inprocess://`` handler that swallows its cancellation kept a stopping relay alive
    for good, deaf to every further signal (as the probe found for ``outboxer consume``): a
    second signal ends it at once, status 1, in one line; its message stays in the outbox."""
    db = sqlite_db.args
    assert cli("db", "upgrade", *db).returncode == 0
    with sqlite_db.transaction() as conn:
        stubborn = sqlite_db.outbox.enqueue(conn, "audit", {}, type="Stubborn")
    relay = cli.start(
        "--log-level", "ERROR", "relay", *db, "--broker", INPROCESS, "--shutdown-timeout", "0.5"
    )
    try:
        wait_until(lambda: stubborn in lines(sink), what="the handler to run")
        relay.send_signal(signal.SIGTERM)
        time.sleep(1.5)  # past --shutdown-timeout: cancelled, and swallowing it
        assert relay.poll() is None, relay.communicate()
        relay.send_signal(signal.SIGTERM)
        _, stderr = relay.communicate(timeout=10)
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.communicate()
    assert relay.returncode == 1, stderr
    lines_ = [line for line in stderr.splitlines() if line.strip()]
    assert lines_ == [
        "outboxer: error: the relay got a second signal while stopping; exiting now: what it "
        "had in progress was not acknowledged and will be delivered again"
    ], stderr
    pending = cli("messages", "list", *db, "--json")
    assert [m["id"] for m in json.loads(pending.stdout)["items"]] == [stubborn]


def test_ctrl_c_is_exit_130_interrupted(cli: Cli, pg_url: str, pg_schema: str) -> None:
    """Found by a probe: click turned the KeyboardInterrupt into an Abort, which was exit 1
    "aborted" (docs/operations.md: 130 when interrupted)."""
    db = ["--database-url", pg_url, "--schema", pg_schema]
    assert cli("db", "upgrade", *db).returncode == 0
    with psycopg.connect(pg_url) as holder:  # dlq list waits behind this lock
        holder.execute(f'LOCK TABLE "{pg_schema}".outbox_dead_letters')  # type: ignore[arg-type]
        listing = cli.start("dlq", "list", *db)
        waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass"
        table = f'"{pg_schema}".outbox_dead_letters'
        wait_until(
            lambda: holder.execute(waiting, [table]).fetchone() == (1,),  # type: ignore[arg-type]
            what="dlq list waiting for the lock",
        )
        listing.send_signal(signal.SIGINT)
        out, err = listing.communicate(timeout=30)
    assert listing.returncode == 130, (out, err)
    assert [line for line in err.splitlines() if line.strip()] == ["outboxer: error: interrupted"]


def test_a_drain_timeout_that_is_not_a_number_is_refused(cli: Cli, sqlite_db: Database) -> None:
    """``nan`` passed click's FloatRange: the drain "timed out" at once, exit 1 (a probe)."""
    for value in ("nan", "-1", "0"):
        result = cli("relay", *sqlite_db.args, "--broker", "null://", "--drain-timeout", value)
        assert_one_line_error(result, 2, "--drain-timeout")
