"""The inbox's SQL on MySQL: the primitives :mod:`outboxer.inbox.consume` runs.

Handlers get the asyncmy connection of the inbox transaction, so their writes commit with the
inbox row. The transaction and the handler savepoints are ``stores._common.SqlInboxSession``'s.

A batch of deliveries is recorded in one round trip: MySQL has no ``RETURNING`` and a
multi-row insert reports only how many rows it inserted, so ``inbox_receive`` (three statements
for one message) is repeated for every message of the batch, in id order, each appending the
message's answer to a session variable that the last statement returns.

Unlike PostgreSQL, MySQL does not abort a transaction in which a statement failed, so a handler
that swallowed a database error leaves a usable transaction; its savepoint is still released
explicitly. A handler that ended the transaction (a COMMIT, a ROLLBACK, DDL, which commits) or
closed the connection is found out before that, from the server status of the last answer
(``SERVER_STATUS_IN_TRANS``, which asyncmy keeps): ``HandlerEndedTransaction``.

A failed message is stored with its payload (a failure row, a dead letter), in a statement the
server refuses if it is over ``max_allowed_packet`` (16 MiB by default on MariaDB; asyncmy
escapes bytes to up to twice their size); a refusal failed the whole batch, which the broker
delivered again, forever. Such a message is stored without its payload, the reason saying
so; as it can never be handled again without it, it is dead at once, in the dead letters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, cast

from asyncmy.constants.SERVER_STATUS import SERVER_STATUS_IN_TRANS
from asyncmy.errors import OperationalError

from outboxer.message import Message, encode_headers
from outboxer.ports import ConsumeFailure, InboxReceipt, PendingFailure, failure_reason
from outboxer.stores._common import (
    Row,
    SqlInbox,
    SqlInboxSession,
    envelope_of,
    pending_failure_from_row,
)
from outboxer.stores.mysql.connection import (
    MysqlPart,
    error_code,
    execute,
    fetch_all,
    transaction_on,
)
from outboxer.stores.mysql.relay import micros, text_row, utc
from outboxer.writers.mysql import PACKET_MARGIN

__all__ = ["MysqlInbox"]

#: What ``inbox_receive`` appends for one message: inserted, inserted but blocked, or there.
_FRESH, _BLOCKED, _DUPLICATE = "f", "b", "d"
#: A statement that may be larger than this is checked against the server's
#: ``max_allowed_packet`` (one round trip, only then; no default has been smaller since MySQL 5.6).
_LARGE_STATEMENT = 1 << 20
#: ER_SP_DOES_NOT_EXIST: "SAVEPOINT … does not exist".
_NO_SUCH_SAVEPOINT = 1305
#: A deadlock victim (and a lock wait timeout with ``innodb_rollback_on_timeout``): InnoDB
#: rolled the whole transaction back.
_ROLLED_BACK = frozenset({1213, 1205})


#: The bytes asyncmy escapes as two (a backslash before them), in a session without
#: ``NO_BACKSLASH_ESCAPES`` (the store's, see connection.py).
_ESCAPED = (b"\0", b"\n", b"\r", b"\\", b"'", b'"', b"\x1a")


def _statement_size(sql: str, args: Mapping[str, Any]) -> int:
    """How many bytes asyncmy sends for ``sql`` with ``args``: every value with its escaped
    bytes doubled, quoted and marked (``_binary``), as often as the statement names it. Counted
    exactly: a bound of twice every byte dropped payloads of 8-16 MiB the server would take."""
    size = len(sql.encode())
    for name, value in args.items():
        data = value if isinstance(value, bytes) else str(value).encode()
        length = len(data) + sum(data.count(byte) for byte in _ESCAPED) + 16
        size += sql.count(f"%({name})s") * length
    return size


class _Session(SqlInboxSession):
    """A pooled asyncmy connection, held for a chunk of deliveries or a round of re-drives."""

    def _begin(self) -> contextlib.AbstractAsyncContextManager[object]:
        return transaction_on(self.connection)

    async def _run(self, sql: str, args: Any) -> None:
        await execute(self.connection, sql, args)

    async def _rows(self, sql: str, args: Any) -> Sequence[Row]:
        return await fetch_all(self.connection, sql, args)

    def _in_transaction(self) -> bool | None:
        # asyncmy keeps the status flags of the server's last OK/EOF packet; a closed
        # connection keeps its last flags, hence the second test. asyncmy closes a connection
        # whose statement failed on a dropped server too: see _connection_closed.
        conn = self.connection
        return bool(conn.server_status & SERVER_STATUS_IN_TRANS) and bool(conn.connected)

    def _connection_closed(self) -> bool:
        return not self.connection.connected

    def _rolled_back_by_server(self, error: BaseException) -> bool:
        seen: set[int] = set()
        cause: BaseException | None = error
        while cause is not None and id(cause) not in seen:
            seen.add(id(cause))
            if error_code(cause) in _ROLLED_BACK:
                return True
            cause = cause.__cause__ or cause.__context__
        return False

    def _savepoint_missing(self, error: Exception) -> bool:
        return isinstance(error, OperationalError) and error.args[:1] == (_NO_SUCH_SAVEPOINT,)

    def _forget_args(self, consumer: str, message_ids: Sequence[str]) -> Any:
        return {"consumer": consumer, "ids": tuple(message_ids)}

    async def due_failures(self, consumer: str, limit: int) -> list[str]:
        rows = await self.fetch(self.q["inbox_due"], {"consumer": consumer, "limit": limit})
        return [bytes(row["message_id"]).decode() for row in rows]

    async def count_retries(self, count: int) -> None:
        await self.execute(self.q["inbox_count_retries"], {"count": count})

    async def receive(
        self, consumer: str, messages: Sequence[Message], retention: float
    ) -> list[InboxReceipt]:
        one = "\n".join(
            line for line in self.q["inbox_receive"].splitlines() if not line.startswith("--")
        )
        order = sorted(range(len(messages)), key=lambda i: messages[i].id)
        args: dict[str, Any] = {"consumer": consumer, "retention_us": micros(retention)}
        statements = ["SET @outboxer_received = ''"]
        for n, i in enumerate(order):
            statements.append(one.replace("%(id)s", f"%(id{n})s").replace("%(key)s", f"%(key{n})s"))
            args[f"id{n}"], args[f"key{n}"] = messages[i].id, messages[i].key
        statements.append("SELECT @outboxer_received AS received")
        rows = await self.fetch(";\n".join(statements), args)
        answers = rows[0]["received"]
        answers = answers.decode() if isinstance(answers, bytes | bytearray) else str(answers)
        receipts = [InboxReceipt(fresh=False, blocked=False)] * len(messages)
        for answer, i in zip(answers, order, strict=True):
            receipts[i] = InboxReceipt(fresh=answer != _DUPLICATE, blocked=answer == _BLOCKED)
        return receipts

    async def record_failure(
        self, consumer: str, message: Message, attempts: int, failure: ConsumeFailure
    ) -> ConsumeFailure:
        sql = self.q["inbox_failure_insert"]
        args = {
            **_message_args(message),
            "consumer": consumer,
            "attempts": attempts,
            "retry_us": micros(failure.retry_in or 0.0),
            "reason": failure.reason,
            "state": "dead" if failure.retry_in is None else "retrying",
        }
        stored, unstored = await self._storable(sql, args)
        if unstored is None:
            await self.execute(sql, args)
            return failure
        # Without its payload the message cannot be handled again: dead at once (the core
        # dead-letters it next, through dead_letter, which says why there too).
        reason = f"{failure.reason}; {unstored}"
        await self.execute(sql, {**stored, "reason": reason, "state": "dead"})
        return ConsumeFailure(failure.reason, None)

    async def dead_letter(self, message: Message, attempts: int, reason: str) -> None:
        sql = self.q["inbox_dead_letter"]
        reason = failure_reason(reason)
        args = {**_message_args(message), "attempts": attempts, "reason": reason}
        stored, unstored = await self._storable(sql, args)
        if unstored is not None:
            stored["reason"] = f"{reason}; {unstored}"
        await self.execute(sql, stored)

    async def _storable(self, sql: str, args: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """``args`` as ``sql`` can store them: as they are (and ``None``), or, where the server
        would refuse the statement (over ``max_allowed_packet``), without the payload, and then
        the headers too if still over, with what was left out."""
        size = _statement_size(sql, args)
        if size <= _LARGE_STATEMENT:
            return args, None
        [row] = await self.fetch("SELECT @@max_allowed_packet AS packet", None)
        limit = int(row["packet"]) - PACKET_MARGIN
        if size <= limit:
            return args, None
        stored = {**args, "payload": b""}
        left_out = f"payload of {len(args['payload']):,} bytes"
        if _statement_size(sql, stored) > limit:
            stored["headers"] = "{}"
            left_out += f" and headers of {len(args['headers'].encode()):,} bytes"
        return (
            stored,
            f"{left_out} over max_allowed_packet ({limit + PACKET_MARGIN:,}); not stored",
        )

    async def lock_failure(self, consumer: str, message_id: str) -> PendingFailure | None:
        args = {"consumer": consumer, "id": message_id}
        rows = await self.fetch(self.q["inbox_failure_lock"], args)
        if not rows:
            return None
        [handled] = await self.fetch(self.q["inbox_handled"], args)
        if handled["waiting"]:
            return None  # an earlier failure of its key first
        row = text_row(cast("dict[str, Any]", rows[0]))
        return pending_failure_from_row({**row, "handled": handled["handled"]})

    async def delete_failure(self, seq: int) -> None:
        await self.execute(self.q["inbox_failure_delete"], {"seq": seq})

    async def update_failure(self, seq: int, attempts: int, failure: ConsumeFailure) -> None:
        args: dict[str, Any] = {"seq": seq, "attempts": attempts, "reason": failure.reason}
        if failure.retry_in is None:
            await self.execute(self.q["inbox_failure_dead"], args)
            return
        args["retry_us"] = micros(failure.retry_in)
        await self.execute(self.q["inbox_failure_retry"], args)

    async def set_done(self, consumer: str, message_id: str, retention: float) -> None:
        args = {"consumer": consumer, "id": message_id, "retention_us": micros(retention)}
        await self.execute(self.q["inbox_set_done"], args)


class MysqlInbox(MysqlPart, SqlInbox):
    """The inbox port (:class:`~outboxer.ports.InboxStore`) on MySQL."""

    Session = _Session


def _message_args(message: Message) -> dict[str, Any]:
    return {
        **envelope_of(message),
        "headers": encode_headers(message.headers),
        "created_at": utc(message.created_at),
    }
