"""Structured logs: one JSON object per line, extra fields kept, secrets never written."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from outboxer.observability.logging import (
    JsonFormatter,
    TextFormatter,
    configure_logging,
    redact,
)
from outboxer.relay import Relay
from outboxer.relay.observer import current_relay_id
from outboxer.testing import InMemoryStore, RecordingPublisher

OUTBOXER = str(Path(sys.executable).parent / "outboxer")
ROOT = Path(__file__).resolve().parents[2]


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    logger = logging.getLogger("outboxer.test")
    return logger.makeRecord(
        "outboxer.test", logging.WARNING, __file__, 1, message, args, None, extra=extra
    )


def test_json_line_has_time_level_logger_message_and_extra_fields() -> None:
    line = JsonFormatter().format(
        record("dead-lettered %d message(s)", 2, message_ids=["a", "b"], attempts=3)
    )
    assert "\n" not in line
    body = json.loads(line)
    assert list(body)[:4] == ["time", "level", "logger", "message"]
    assert body["level"] == "WARNING"
    assert body["logger"] == "outboxer.test"
    assert body["message"] == "dead-lettered 2 message(s)"
    assert body["message_ids"] == ["a", "b"]
    assert body["attempts"] == 3
    assert body["time"].endswith("Z") and len(body["time"]) == len("2025-01-31T12:00:00.123Z")
    assert "relay_id" not in body


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1", "ascii"])
def test_a_json_line_stays_one_valid_line_whatever_the_ids_and_the_stream_encoding(
    encoding: str,
) -> None:
    """An id with U+2028, NEL (``\\x85``) or an emoji was written raw: ``splitlines()`` (as
    a Python log reader does) cut the line in two, and on a stderr that is not UTF-8 (as
    Python's stderr does, ``backslashreplace``) it became ``\\U0001f600`` and ``\\x85``, escapes
    JSON has not (a probe)."""
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding=encoding, errors="backslashreplace")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    hostile = "id\u2028WARNING forged\x85\u2029\U0001f600\u202e é\udc80"
    logger = logging.getLogger("outboxer.test.encoding")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("dead-lettered: %s", hostile, extra={"message_ids": [hostile]})
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    stream.flush()
    [line] = raw.getvalue().decode(encoding).splitlines()
    body = json.loads(line)
    assert body["message"] == f"dead-lettered: {hostile}"
    assert body["message_ids"] == [hostile]


def test_a_text_line_escapes_the_control_characters_of_its_message() -> None:
    """A broker's failure reason (or an id) holding an escape sequence or a newline was
    written raw: it recoloured the terminal or forged a line of its own (a probe)."""
    line = TextFormatter().format(
        record("message %s failed: %s", "id\nWARNING forged", "\x1b[31mred\x85 é\tok")
    )
    assert line.endswith("message id\\nWARNING forged failed: \\x1b[31mred\\x85 é\\tok"), line
    assert "\n" not in line and "\x1b" not in line
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        failed = logging.getLogger("outboxer.test").makeRecord(
            "outboxer.test", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    assert "\nTraceback (most recent call last):\n" in TextFormatter().format(failed)


def test_relay_id_comes_from_the_running_relay_task() -> None:
    token = current_relay_id.set("host:42:abc")
    try:
        body = json.loads(JsonFormatter().format(record("claimed")))
    finally:
        current_relay_id.reset(token)
    assert body["relay_id"] == "host:42:abc"


def test_exceptions_are_one_field_and_redacted() -> None:
    try:
        raise ConnectionError("cannot reach postgresql://app:s3cret@db:5432/app")
    except ConnectionError:
        rec = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    body = json.loads(JsonFormatter().format(rec))
    assert "ConnectionError" in body["exception"] and "Traceback" in body["exception"]
    assert "s3cret" not in json.dumps(body)
    assert "postgresql://app:***@db:5432/app" in body["exception"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("amqp://guest:guest@rabbit:5672/", "amqp://guest:***@rabbit:5672/"),
        ("kafka://svc:p%40ss@k1:9092,k2:9092", "kafka://svc:***@k1:9092,k2:9092"),
        (
            "url postgresql://u:pw@h/db and redis://:pw2@h:6379/0",
            "url postgresql://u:***@h/db and redis://:***@h:6379/0",
        ),
        ("https://hooks.example/x?token=abc123&x=1", "https://hooks.example/x?token=***&x=1"),
        ("password=hunter2 user=app", "password=*** user=app"),
        ("Authorization: Bearer abc.def-ghi", "Authorization: Bearer ***"),
        ("no secret in postgresql://app@db/app", "no secret in postgresql://app@db/app"),
    ],
)
def test_redact(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_secret_named_extra_fields_are_masked_and_values_redacted() -> None:
    body = json.loads(
        JsonFormatter().format(
            record(
                "connecting",
                admin_token="t0ps3cret",
                password="hunter2",
                broker="amqp://guest:guest@h/",
                settings={"url": "redis://:pw@h:6379", "api_key": "k"},
                token_count=3,
            )
        )
    )
    assert body["admin_token"] == "***"
    assert body["password"] == "***"
    assert body["broker"] == "amqp://guest:***@h/"
    assert body["settings"] == {"url": "redis://:***@h:6379", "api_key": "***"}
    assert body["token_count"] == "***"  # named like a secret: masked, whatever it holds


def test_text_format_is_redacted_too() -> None:
    line = TextFormatter().format(record("broker %s down", "amqp://guest:guest@h/"))
    assert line.endswith("WARNING outboxer.test: broker amqp://guest:***@h/ down")


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.mark.usefixtures("restore_root_logger")
async def test_relay_logs_in_json_with_relay_id_and_dead_lettered_ids() -> None:
    stream = io.StringIO()
    configure_logging("INFO", "json", stream)
    configure_logging("INFO", "json", stream)  # again: replaced, not doubled
    store = InMemoryStore()
    bad = store.enqueue("t", {"n": 1}, type="Bad")
    store.enqueue("t", {"n": 2})
    from outboxer.errors import PermanentPublishError

    publisher = RecordingPublisher(
        fail=lambda m: PermanentPublishError("refused") if m.type == "Bad" else None
    )
    relay = Relay(store, publisher)
    await relay.drain(timeout=10)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    relay_lines = [line for line in lines if line["logger"] == "outboxer.relay"]
    assert relay_lines and all(line["relay_id"] == relay.relay_id for line in relay_lines)
    [dead] = [line for line in relay_lines if "moved to dead letter" in line["message"]]
    assert dead["message_ids"] == [bad] and dead["level"] == "ERROR"
    assert dead["message"].startswith(f"message {bad} (key None, type 'Bad')")
    assert dead["message"].endswith("after 1 attempts: refused")
    assert len([line for line in lines if line["message"].startswith("relay ")]) == 2


def test_cli_log_format_json(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXER_")}
    env["OUTBOXER_LOG_FORMAT"] = "json"
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    subprocess.run(
        [OUTBOXER, "db", "upgrade", "--database-url", url], env=env, check=True, timeout=60
    )
    broker = "http://hook:s3cret@127.0.0.1:9/hook"
    proc = subprocess.Popen(
        [OUTBOXER, "relay", "--database-url", url, "--broker", broker],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert proc.stderr is not None
    first = [proc.stderr.readline() for _ in range(2)]  # "relay … starting", "last sweep: …"
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=30)
    err = "".join(first) + rest
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in err.splitlines()]  # every line is one JSON object
    messages = [line["message"] for line in lines]
    assert any(m.startswith("relay ") and "starting" in m for m in messages), messages
    assert any("stopped" in m for m in messages), messages
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert "s3cret" not in err


def test_asyncpg_pool_outage_warnings_are_one_line() -> None:
    """Found by a probe: every failed attempt of asyncpg's pool to restore its connection during
    an outage logged a ~40-line traceback."""
    import outboxer.stores.postgres.connection  # noqa: F401 - installs the filter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    pool_log = logging.getLogger("asyncpg.pool")
    pool_log.addHandler(handler)
    try:
        try:
            raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)")
        except ConnectionRefusedError:
            pool_log.warning("Failed to restore the pool connection floor; retrying", exc_info=True)
    finally:
        pool_log.removeHandler(handler)
    [line] = stream.getvalue().splitlines()
    assert line.endswith("retrying: ConnectionRefusedError: [Errno 111] Connect call failed "
                         "('127.0.0.1', 5432)")  # fmt: skip
