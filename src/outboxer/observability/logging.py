"""Log lines for people (text) and for log pipelines (JSON), never carrying a secret.

``outboxer --log-format json`` writes one JSON object per line::

    {"time": "2025-01-31T12:00:00.123Z", "level": "WARNING", "logger": "outboxer.relay",
     "message": "dead-lettered 1 message(s): 0194…", "relay_id": "host:42:ab12cd",
     "message_ids": ["0194…"]}

``time`` (UTC, milliseconds), ``level``, ``logger`` and ``message`` are always there; every
``extra=`` field of the call follows (``message_ids``, …), ``relay_id`` when the record comes
from a relay's task (:data:`outboxer.relay.observer.current_relay_id`), and ``exception`` with
the formatted traceback when there is one.

Redaction applies to both formats, to the message, the traceback and every string field:
passwords in URLs (``scheme://user:***@host``), ``password=``/``token=``/``secret=``-like query
parameters and ``Bearer`` tokens are masked, and an ``extra`` field whose name says it is a
secret (``password``, ``token``, ``secret``, ``authorization``, ``api_key``) is replaced by
``***``. Components are expected not to log secrets in the first place (the publishers keep
passwords out of their messages); this is the second line of defence. The masking is
:func:`outboxer.urls.redact`, the one redaction routine.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from outboxer.message import printable
from outboxer.relay.observer import current_relay_id
from outboxer.urls import MASK, redact

__all__ = ["LOG_FORMATS", "JsonFormatter", "TextFormatter", "configure_logging", "redact"]

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_SECRET_FIELD = re.compile(
    r"(^|_)(pass(word|wd)?|secret|token|authorization|api_?key|credentials?)($|_)", re.IGNORECASE
)
_HANDLER_NAME = "outboxer"

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_RESERVED = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys() | {"message", "asctime"}
)


def _clean(name: str, value: Any) -> Any:
    """A JSON-ready, redacted version of an ``extra`` value."""
    if _SECRET_FIELD.search(name):
        return MASK
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {str(k): _clean(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_clean(name, v) for v in value]
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return redact(str(value))


class TextFormatter(logging.Formatter):
    """The classic ``time LEVEL logger: message`` line, redacted. Control characters of the
    message are escaped: a broker's error or a message id holding an escape sequence or a
    newline would otherwise recolour the operator's terminal or forge a log line (a probe);
    a traceback keeps its lines."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring for the fields)."""

    def format(self, record: logging.LogRecord) -> str:
        moment = dt.datetime.fromtimestamp(record.created, dt.UTC)
        body: dict[str, Any] = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        relay_id = current_relay_id.get()
        if relay_id is not None:
            body["relay_id"] = relay_id
        for name, value in vars(record).items():
            if name not in _RESERVED and not name.startswith("_"):
                body[name] = _clean(name, value)
        if record.exc_info:
            body["exception"] = redact(self.formatException(record.exc_info))
        if record.stack_info:
            body["stack"] = redact(self.formatStack(record.stack_info))
        # ASCII only: a line stays one valid JSON line on a stderr that is not UTF-8 (whose
        # backslashreplace would write ``\U0001f600``, no JSON escape) and for readers that
        # also split lines at U+2028 or NEL (``str.splitlines``); the text decodes unchanged.
        return json.dumps(body, ensure_ascii=True, default=str)


def configure_logging(level: str = "INFO", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Send every log record of the process to ``stream`` (stderr) in ``fmt``.

    A handler installed by an earlier call is replaced (calling it again switches format);
    handlers installed by others (a test runner's) are left alone.
    """
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, not {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.set_name(_HANDLER_NAME)
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == _HANDLER_NAME:
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
