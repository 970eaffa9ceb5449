"""Exceptions raised by outboxer.

Every exception derives from :class:`OutboxerError`. Driver exceptions are translated where
they enter outboxer (``raise StoreUnavailable(...) from exc``), so callers never need to import
a driver to handle a failure.

::

    OutboxerError
    ├── ConfigurationError         invalid settings, URL or identifier; nothing was changed
    │   └── PermissionDenied       the database role lacks a privilege: retrying cannot help
    ├── StoreError
    │   ├── StoreUnavailable       the database cannot be reached right now (retry later)
    │   └── SchemaError            the outbox tables are missing or at an unknown version
    ├── NotFound                   a dead letter or other named object does not exist
    ├── RelayFailed                the relay stopped because a background task kept dying
    ├── PermanentHandlerError      a handler says retrying can never help: dead-letter at once
    │   └── UndecodablePayload     the payload does not decode into the handler's type
    ├── HandlerEndedTransaction    a handler committed, rolled back or closed the inbox's
    │                              connection: a bug in the handler; the consumer stops
    └── PublishError               one message could not be published
        ├── RetryablePublishError  transient, message-specific: counts an attempt, retried later
        ├── PermanentPublishError  can never succeed (rejected/undecodable): dead-lettered at once
        └── BrokerUnavailable      the broker/connection is down: counts no attempt, the relay
                                   backs off as a whole
"""

from __future__ import annotations

__all__ = [
    "BrokerUnavailable",
    "ConfigurationError",
    "HandlerEndedTransaction",
    "NotFound",
    "OutboxerError",
    "PermissionDenied",
    "PermanentHandlerError",
    "PermanentPublishError",
    "PublishError",
    "RelayFailed",
    "RetryablePublishError",
    "SchemaError",
    "StoreError",
    "StoreUnavailable",
    "UndecodablePayload",
]


class OutboxerError(Exception):
    """Root of every error outboxer raises."""


class ConfigurationError(OutboxerError, ValueError):
    """Settings, a URL or an identifier are invalid. Raised before anything is changed."""


class PermissionDenied(ConfigurationError):
    """The database refused a statement: its role lacks a privilege on the outbox's tables
    (docs/operations.md names those each command needs). Not a ``StoreError``, which the relay
    and the consumers wait out as an outage: they stop with it (the CLI exits 2, one line).

    Args:
        refusal: The database's words; the message adds where the needed privileges are listed.
    """

    def __init__(self, refusal: str) -> None:
        super().__init__(f"{refusal} (docs/operations.md, 'Privileges', lists what is needed)")


class StoreError(OutboxerError):
    """The outbox database failed."""


class StoreUnavailable(StoreError):
    """The database cannot be reached; the operation may succeed later."""


class SchemaError(StoreError):
    """The outbox schema is missing or newer than this version of outboxer understands."""


class NotFound(OutboxerError, LookupError):
    """A named object (a dead letter, a handler registry) does not exist."""


class RelayFailed(OutboxerError):
    """The relay stopped itself: a background task (heartbeat, sweeper) died
    ``max_task_restarts`` times in a row, a bug that restarting does not cure. The cause is
    chained; the CLI exits non-zero."""


class PermanentHandlerError(OutboxerError):
    """Raised by (or for) a handler when retrying can never help: the message is
    dead-lettered at once (the in-process publisher reports a ``PermanentPublishError``)."""


class HandlerEndedTransaction(OutboxerError):
    """A handler committed, rolled back or closed ``ctx.connection``, the connection of the
    inbox's transaction, which only the inbox may end. Not a ``StoreError`` (an outage,
    retried in place): retrying would end the transaction again. The consumer stops with it.

    Attributes:
        message_id: The message whose handler did it.
        closed: The handler closed the connection (else it committed or rolled back).
    """

    def __init__(self, message_id: str, message_type: str | None, topic: str, *, closed: bool):
        what = "closed" if closed else "committed or rolled back"
        super().__init__(
            f"the handler of message {message_id!r} (type {message_type!r}, topic {topic!r}) "
            f"{what} ctx.connection, which belongs to the inbox's transaction: the inbox "
            "alone may end it (fix the handler; messages of the batch after it are "
            "delivered again)"
            + (
                ""
                if closed
                else "; or it went on after an error with which the database rolled the "
                "transaction back (a deadlock): let such an error propagate"
            )
        )
        self.message_id = message_id
        self.closed = closed


class UndecodablePayload(PermanentHandlerError):
    """The payload does not decode into the type the handler's first parameter asks for."""


class PublishError(OutboxerError):
    """Publishing one message failed. Subclasses say what the relay should do about it."""


class RetryablePublishError(PublishError):
    """A transient failure specific to this message: counts an attempt and is retried later.

    Attributes:
        retry_after: Seconds the broker asked to wait before the next attempt (a webhook's
            ``Retry-After``), or ``None``; the relay waits at least that long (at most an hour).
    """

    def __init__(self, *args: object, retry_after: float | None = None) -> None:
        super().__init__(*args)
        self.retry_after = retry_after


class PermanentPublishError(PublishError):
    """The message can never be published (rejected or undecodable): it is dead-lettered."""


class BrokerUnavailable(PublishError):
    """The broker or the connection to it is down.

    Counts no attempt against the message; the relay releases its batch and backs off as a whole
    (5 s, 10 s, 20 s, 40 s, capped at 60 s by default) until a publish succeeds again.
    """


def error_text(error: BaseException) -> str:
    """``str(error)``, or ``""`` when that fails too (an exception class whose ``__str__`` has
    a bug of its own): the failure of one message must not become the relay's or the
    consumer's (a handler's such exception stalled the relay and crash-looped ``consume``)."""
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - any bug of the error's own __str__
        return ""


def error_summary(error: BaseException) -> str:
    """``Type: text`` of ``error``, or ``Type`` alone when it has no text (or cannot say it)."""
    text = error_text(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
