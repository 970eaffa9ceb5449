"""The inbox steps both SQL stores share once a delivery is recorded.

The stores differ in how they talk to their database (parameter styles, savepoint syntax); what
happens to a delivery after its inbox row is written does not. Each store supplies the four
primitives declared here, on its own connection type.
"""

from __future__ import annotations

from typing import Any

from outboxer.message import Message
from outboxer.ports import ConsumeFailure, ConsumeOutcome, FailurePolicy, InboxHandler


class InboxSteps:
    """Mixin: the fate of a fresh delivery, given the store's primitives."""

    async def _run_handler_in_savepoint(
        self, conn: Any, handler: InboxHandler, message: Message, attempt: int
    ) -> Exception | None:
        raise NotImplementedError

    async def _insert_consume_failure(
        self, conn: Any, consumer: str, message: Message, attempts: int, failure: ConsumeFailure
    ) -> None:
        raise NotImplementedError

    async def _dead_letter_consumed(
        self, conn: Any, message: Message, attempts: int, reason: str
    ) -> None:
        raise NotImplementedError

    async def _set_retrying(self, conn: Any, consumer: str, message_id: str) -> None:
        raise NotImplementedError

    async def _handle_fresh_delivery(
        self,
        conn: Any,
        consumer: str,
        message: Message,
        *,
        blocked: bool,
        handler: InboxHandler,
        on_failure: FailurePolicy,
    ) -> ConsumeOutcome:
        """Run a first delivery whose inbox row was just written, in the caller's transaction.

        A message whose key is still failing for this consumer waits behind it; a failing
        handler's writes are undone and the failure is recorded (retry later, or dead letter).
        """
        if blocked:
            reason = f"waiting behind an earlier failed message of key {message.key!r}"
            await self._insert_consume_failure(
                conn, consumer, message, 0, ConsumeFailure(reason, 0.0)
            )
            return "waiting"
        error = await self._run_handler_in_savepoint(conn, handler, message, 1)
        if error is None:
            return "handled"
        failure = on_failure(message, 1, error)
        await self._insert_consume_failure(conn, consumer, message, 1, failure)
        if failure.retry_in is None:
            await self._dead_letter_consumed(conn, message, 1, failure.reason)
            return "dead"
        await self._set_retrying(conn, consumer, message.id)
        return "retrying"
