"""Dead letters in the Django admin: list, filter, read, replay, delete.

The list reads the table through the unmanaged :class:`~.models.DeadLetter`; replay and delete
go through outboxer's dead-letter port (``replay_dead_letters``/``purge_dead_letters``), the
code ``outboxer dlq replay|purge`` runs: a replay moves the row back to the outbox in one
statement and skips a message whose id is in the outbox again.

Replaying needs the ``change`` permission on dead letters, deleting the ``delete`` one; nothing
is edited or added by hand.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from django.contrib import admin, messages

from outboxer.cli._common import with_store
from outboxer.errors import OutboxerError
from outboxer.integrations.django.conf import database_url, outbox, tool_names
from outboxer.integrations.django.models import DeadLetter
from outboxer.ports import AdminStore, DeadLetterFilter, Direction


def _on_store(
    queryset: Any, action: Callable[[AdminStore, DeadLetterFilter], Awaitable[list[str]]]
) -> tuple[int, int]:
    """Run ``action`` on the store for the selected dead letters: (selected, done). Each is
    chosen by its id and direction (an id may have a publish and a consume dead letter)."""
    chosen: dict[Direction, list[str]] = defaultdict(list)
    for message_id, direction in queryset.values_list("message_id", "direction"):
        chosen[direction].append(str(message_id))

    async def act(store: AdminStore) -> int:
        done = 0
        for direction, ids in chosen.items():
            done += len(await action(store, DeadLetterFilter(ids=ids, direction=direction)))
        return done

    done = with_store(act, database_url(queryset.db), tool_names(queryset.db))
    return sum(len(ids) for ids in chosen.values()), done


@admin.register(DeadLetter)
class DeadLetterAdmin(admin.ModelAdmin):
    list_display = (
        "message_id",
        "topic",
        "type",
        "key",
        "attempts",
        "direction",
        "dead_lettered_at",
        "reason",
    )
    list_filter = ("direction", "topic", "type")
    search_fields = ("=message_id", "=key", "topic")
    exclude = ("payload",)
    actions = ("replay", "purge")

    @admin.display(description="failure reason")
    def reason(self, obj: DeadLetter) -> str:
        text = str(obj.failure_reason)
        return text if len(text) <= 80 else f"{text[:79]}…"

    readonly_fields = (
        *("dl_seq", "message_id", "topic", "type", "key", "content_type", "payload_text"),
        *("headers", "created_at", "dead_lettered_at", "attempts", "direction", "failure_reason"),
    )

    def get_queryset(self, request: Any) -> Any:
        # the dead letters of the outbox the commands use (OUTBOXER["DATABASE"])
        return super().get_queryset(request).using(outbox().database)

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False  # read-only: dead letters change through the store (the actions)

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False  # the ORM's delete is replaced by the purge action

    def has_replay_permission(self, request: Any) -> bool:
        return bool(request.user.has_perm("outboxer.change_deadletter"))

    def has_purge_permission(self, request: Any) -> bool:
        return bool(request.user.has_perm("outboxer.delete_deadletter"))

    @admin.action(description="Replay: put back in the outbox", permissions=["replay"])
    def replay(self, request: Any, queryset: Any) -> None:
        try:
            selected, done = _on_store(queryset, lambda store, flt: store.replay_dead_letters(flt))
        except OutboxerError as exc:  # the database down, the schema missing: said, not a 500
            self.message_user(request, f"nothing replayed: {exc}", messages.ERROR)
            return
        self.message_user(request, f"replayed {done} dead letter(s)", messages.SUCCESS)
        if selected > done:
            self.message_user(
                request,
                f"{selected - done} not replayed: a message with the same id is in the outbox "
                "again; replay once it is published, or delete the dead letter",
                messages.WARNING,
            )

    @admin.action(description="Delete for good", permissions=["purge"])
    def purge(self, request: Any, queryset: Any) -> None:
        try:
            _, done = _on_store(queryset, lambda store, flt: store.purge_dead_letters(flt))
        except OutboxerError as exc:
            self.message_user(request, f"nothing deleted: {exc}", messages.ERROR)
            return
        self.message_user(request, f"deleted {done} dead letter(s)", messages.SUCCESS)
