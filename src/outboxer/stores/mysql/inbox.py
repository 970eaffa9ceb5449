"""The inbox on MySQL: its tables exist (schema version 3); its SQL primitives land with the
consume state machine shared by every store (issue 10), so until then consuming refuses loudly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from outboxer.errors import ConfigurationError
from outboxer.message import Message
from outboxer.ports import ConsumeOutcome, FailurePolicy, InboxHandler

__all__ = ["MysqlInbox"]


def _not_ready() -> NoReturn:
    raise ConfigurationError("the inbox (outboxer consume) is not available on MySQL/MariaDB yet")


class MysqlInbox:
    """``consume`` and ``redrive_consume_failures``: not available yet (see the module)."""

    async def consume(
        self,
        consumer: str,
        messages: Sequence[Message],
        handler: InboxHandler,
        *,
        on_failure: FailurePolicy,
        retention_seconds: float,
        single_transaction: bool = False,
    ) -> list[ConsumeOutcome]:
        _not_ready()

    async def redrive_consume_failures(
        self,
        consumer: str,
        handler: InboxHandler,
        *,
        on_failure: FailurePolicy,
        retention_seconds: float,
        limit: int,
    ) -> list[ConsumeOutcome]:
        _not_ready()
