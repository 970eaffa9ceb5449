"""pika helpers shared by the RabbitMQ publisher and consumer."""

from __future__ import annotations

import asyncio
from typing import Any

import pika  # type: ignore[import-untyped]
import pika.exceptions  # type: ignore[import-untyped]
from pika.adapters.utils import connection_workflow  # type: ignore[import-untyped]

__all__ = ["describe", "resolve"]


def describe(exc: BaseException | None) -> str:
    """A short reason from a pika exception (pika never puts the password in them)."""
    if exc is None:
        return "closed"
    if isinstance(exc, connection_workflow.AMQPConnectionWorkflowFailed) and exc.exceptions:
        return describe(exc.exceptions[-1])
    if isinstance(exc, connection_workflow.AMQPConnectorPhaseErrorBase):
        return describe(exc.exception)
    if isinstance(exc, connection_workflow.AMQPConnectorStackTimeout):
        return "connect timed out"
    if isinstance(
        exc, pika.exceptions.ChannelClosedByBroker | pika.exceptions.ConnectionClosedByBroker
    ):
        return f"RabbitMQ said {exc.reply_code} {exc.reply_text}"
    if isinstance(exc, pika.exceptions.ProbableAuthenticationError):
        return "login refused (wrong user or password)"
    if isinstance(exc, pika.exceptions.ProbableAccessDeniedError):
        return "access refused (vhost missing or not permitted for this user)"
    if exc.args and isinstance(exc.args[0], BaseException):  # pika wraps the real cause
        return describe(exc.args[0])
    name = type(exc).__name__
    text = str(exc)
    return f"{name}: {text}" if text else name


def resolve(future: asyncio.Future[Any], value: Any) -> None:
    """Complete what a pika callback was awaited for, unless it already failed or was
    cancelled (a late callback after a connection loss)."""
    if not future.done():
        future.set_result(value)
