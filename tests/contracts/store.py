"""``StoreContract``: the semantics every store must have, run against each real database.

Subclass it with a ``store`` fixture (migrated, empty) and an ``add`` fixture:
``add(topic, payload, **options) -> id`` that commits one message through the write API.
Each test uses the narrow port (``RelayStore``, ``SweeperStore``, ``AdminStore``) that the
component it stands for uses; the first test checks the store offers every one of them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from outboxer import ports
from outboxer.errors import ConfigurationError, NotFound
from outboxer.inbox import consume, redrive_consume_failures
from outboxer.message import Message
from outboxer.ports import (
    AdminStore,
    Claim,
    ClaimRequest,
    ConsumeFailure,
    DeadLetterFilter,
    DeadLetterStore,
    InboxStore,
    MessageFilter,
    MessageReader,
    RelayStore,
    Retry,
    Settlement,
    StatsStore,
    Store,
    SweeperStore,
)

Add = Callable[..., Awaitable[str]]
RELAY = "relay-under-test"
#: Payloads of this size fill the default page budget (4 MiB) after three rows. Under
#: MariaDB's max_allowed_packet of the test server (16 MiB), as a row must be.
LARGE = 3 * 512 * 1024


async def following(first: Any, page: Callable[[str], Awaitable[Any]]) -> list[Any]:
    """The items of ``first`` and of every page after it (``page(cursor)``), none empty."""
    seen, cursor = list(first.items), first.next_cursor
    while cursor is not None:
        more = await page(cursor)
        assert more.items
        seen += more.items
        cursor = more.next_cursor
    return seen


def large_payload(n: int) -> bytes:
    """A payload of :data:`LARGE` bytes that tells which one it is."""
    return bytes([n]) * LARGE


async def claim(
    store: RelayStore,
    limit: int = 100,
    *,
    ordered: bool = True,
    lease: float = 30.0,
    behind: frozenset[int] = frozenset(),
) -> Claim:
    return await store.claim_batch(
        ClaimRequest(
            limit=limit, lease_seconds=lease, ordered=ordered, relay_id=RELAY, behind=behind
        )
    )


class StoreContract:
    #: Whether the store uses ``ClaimRequest.behind`` (a permission: MySQL does not, yet).
    claims_behind_own_batches = True

    def test_the_store_offers_every_port(self, store: Store) -> None:
        for port in (
            RelayStore,
            SweeperStore,
            StatsStore,
            DeadLetterStore,
            MessageReader,
            AdminStore,
            InboxStore,
            Store,
        ):
            assert isinstance(store, port), port.__name__

    async def test_claim_returns_messages_in_write_order_with_their_fields(
        self, store: Store, add: Add
    ) -> None:
        ids = [
            await add("orders", {"n": n}, key=f"k{n}", type="OrderCreated", headers={"h": "v"})
            for n in range(5)
        ]
        c = await claim(store)
        assert [m.id for m in c.messages] == ids
        first = c.messages[0]
        assert first.topic == "orders" and first.type == "OrderCreated" and first.key == "k0"
        assert first.json() == {"n": 0}
        assert dict(first.headers) == {"h": "v"}
        assert first.content_type == "application/json"
        assert first.attempts == 0
        assert first.created_at.tzinfo is not None

    async def test_claimed_messages_are_not_claimed_again(self, store: Store, add: Add) -> None:
        for n in range(10):
            await add("t", {"n": n})
        first = await claim(store, 6, ordered=False)
        second = await claim(store, 6, ordered=False)
        assert len(first.messages) == 6 and len(second.messages) == 4
        assert not {m.id for m in first.messages} & {m.id for m in second.messages}
        assert (await claim(store)).messages == []

    async def test_ack_removes_and_stats_count(self, store: Store, add: Add) -> None:
        for n in range(4):
            await add("t", {"n": n})
        c = await claim(store, 3)
        stats = await store.stats()
        assert (stats.pending, stats.in_flight) == (1, 3)
        assert stats.oldest_pending_age_seconds is not None
        await store.settle(c, Settlement(published=[m.id for m in c.messages]))
        stats = await store.stats()
        assert (stats.pending, stats.in_flight, stats.dead_letters) == (1, 0, 0)

    async def test_stale_claim_token_changes_nothing(self, store: Store, add: Add) -> None:
        """Fencing: after a lease expired and another relay claimed, the old owner is inert."""
        await add("t", {"n": 1})
        stale = await claim(store, lease=0.2)
        await asyncio.sleep(0.4)
        assert await store.release_expired_leases() == 1
        fresh = await claim(store)
        assert [m.id for m in fresh.messages] == [m.id for m in stale.messages]
        message_id = stale.messages[0].id
        await store.settle(stale, Settlement(published=[message_id]))
        await store.settle(stale, Settlement(dead=[(message_id, "stale")]))
        stats = await store.stats()
        assert (stats.in_flight, stats.dead_letters) == (1, 0)
        await store.settle(fresh, Settlement(published=[message_id]))
        assert (await store.stats()).in_flight == 0

    async def test_retry_counts_an_attempt_and_waits(self, store: Store, add: Add) -> None:
        message_id = await add("t", {"n": 1})
        c = await claim(store)
        await store.settle(c, Settlement(retries=[Retry(message_id, 0.3, "boom")]))
        assert (await claim(store)).messages == []  # not before its delay
        await asyncio.sleep(0.45)
        again = await claim(store)
        assert [m.id for m in again.messages] == [message_id]
        assert again.messages[0].attempts == 1

    async def test_release_counts_no_attempt(self, store: Store, add: Add) -> None:
        message_id = await add("t", {"n": 1})
        c = await claim(store)
        await store.settle(c, Settlement(released=[message_id]))
        again = await claim(store)
        assert [m.attempts for m in again.messages] == [0]

    async def test_delayed_message_waits_for_available_at(self, store: Store, add: Add) -> None:
        # On PostgreSQL an add waits until its row passes the commit-order gate, which other
        # tests' open transactions hold: the delay must outlast the adds and the first claim.
        delay = 3.0
        start = time.monotonic()
        later = await add("t", {"n": 1}, available_at=dt.timedelta(seconds=delay))
        now = await add("t", {"n": 2})
        first = await claim(store)
        took = time.monotonic() - start
        assert took < delay, f"adding and claiming took {took:.1f} s, past the {delay} s delay"
        assert [m.id for m in first.messages] == [now]
        await asyncio.sleep(start + delay + 0.2 - time.monotonic())
        assert [m.id for m in (await claim(store)).messages] == [later]

    async def test_ordered_claim_takes_a_key_only_behind_its_predecessor(
        self, store: Store, add: Add
    ) -> None:
        a1 = await add("t", {"n": 1}, key="a")
        a2 = await add("t", {"n": 2}, key="a")
        b1 = await add("t", {"n": 3}, key="b")
        first = await claim(store, 2)  # a1, a2: a run of one key, in order
        assert [m.id for m in first.messages] == [a1, a2]
        second = await claim(store)
        assert [m.id for m in second.messages] == [b1]
        a3 = await add("t", {"n": 4}, key="a")
        assert (await claim(store)).messages == []  # a1/a2 still in flight: a3 waits
        await store.settle(first, Settlement(published=[a1, a2]))
        assert [m.id for m in (await claim(store)).messages] == [a3]

    async def test_an_ordered_claim_continues_keys_behind_the_batches_it_is_told_of(
        self, store: Store, add: Add
    ) -> None:
        a1 = await add("t", {"n": 1}, key="a")
        a2 = await add("t", {"n": 2}, key="a")
        b1 = await add("t", {"n": 3}, key="b")
        first = await claim(store, 1)
        assert [m.id for m in first.messages] == [a1]
        stranger = frozenset({first.token ^ 1})
        assert [m.id for m in (await claim(store, behind=stranger)).messages] == [b1]
        chained = await claim(store, behind=frozenset({first.token}))
        expected = [a2] if self.claims_behind_own_batches else []
        assert [m.id for m in chained.messages] == expected

    async def test_rows_another_batch_holds_block_their_key_even_behind_free_rows(
        self, store: Store, add: Add
    ) -> None:
        # The state a fence leaves while a later batch still holds the key's next rows: a free
        # row, then rows of a batch in flight, then more. Only the first is claimable, unless
        # the claim is told of that batch.
        a = [await add("t", {"n": n}, key="a") for n in range(3)]
        held = await claim(store, 2)
        await store.settle(held, Settlement(released=[a[0]]))
        assert [
            m.id for m in (await claim(store, behind=frozenset({held.token ^ 1}))).messages
        ] == [a[0]]

    async def test_a_failing_head_blocks_only_its_key(self, store: Store, add: Add) -> None:
        a1 = await add("t", {"n": 1}, key="a")
        await add("t", {"n": 2}, key="a")
        b1 = await add("t", {"n": 3}, key="b")
        c = await claim(store, 1)
        assert [m.id for m in c.messages] == [a1]
        await store.settle(c, Settlement(retries=[Retry(a1, 60, "down")]))
        assert [m.id for m in (await claim(store)).messages] == [b1]

    async def test_with_every_key_blocked_an_ordered_claim_takes_only_the_free_rows_behind(
        self, store: Store, add: Add
    ) -> None:
        # Ten keys of three messages (interleaved); every head is leased by another relay or
        # waits for a retry. Behind them come a free key and an unkeyed message: the claim takes
        # those, in write order, and nothing of the blocked keys (issue 14).
        blocked = [await add("t", {"n": n}, key=f"k{n % 10}") for n in range(30)]
        held = await claim(store, 10)
        assert [m.id for m in held.messages] == blocked[:10]
        later = [Retry(i, 3600, "later") for i in blocked[:5]]
        await store.settle(held, Settlement(retries=later))
        free = [await add("t", {"n": 1}, key="free"), await add("t", {"n": 2}, key="free")]
        unkeyed = await add("t", {"n": 3})
        c = await claim(store, 100, behind=frozenset({held.token ^ 1}))
        assert [m.id for m in c.messages] == [*free, unkeyed]
        assert (await claim(store)).messages == []

    async def test_dead_letter_keeps_every_field_and_frees_the_key(
        self, store: Store, add: Add
    ) -> None:
        a1 = await add("orders", {"order": 1}, key="o1", type="OrderCreated", headers={"x": "y"})
        a2 = await add("orders", {"order": 2}, key="o1", type="OrderCreated")
        c = await claim(store, 1)
        await store.settle(c, Settlement(dead=[(a1, "rejected by broker")]))
        dead = await store.get_dead_letter(a1)
        assert (dead.topic, dead.key, dead.type) == ("orders", "o1", "OrderCreated")
        assert dead.payload == b'{"order":1}' and dict(dead.headers) == {"x": "y"}
        assert dead.failure_reason == "rejected by broker" and dead.attempts == 1
        assert dead.direction == "publish"
        assert dead.dead_lettered_at >= dead.created_at
        assert [m.id for m in (await claim(store)).messages] == [a2]  # the key continues
        shape = dead.to_json()
        assert set(shape) >= {
            "id",
            "topic",
            "key",
            "type",
            "payload",
            "headers",
            "created_at",
            "dead_lettered_at",
            "failure_reason",
            "attempts",
            "direction",
        }
        assert shape["payload"] == {"order": 1}

    async def _dead_letters(
        self, store: Store, add: Add, count: int, topic: str = "t"
    ) -> list[str]:
        ids = [await add(topic, {"n": n}, type="T", key=f"k{n}") for n in range(count)]
        c = await claim(store, count)
        await store.settle(c, Settlement(dead=[(i, f"reason {i}") for i in ids]))
        return ids

    async def test_dead_letters_page_newest_first(self, store: Store, add: Add) -> None:
        ids = await self._dead_letters(store, add, 5)
        seen, cursor = [], None
        while True:
            page = await store.list_dead_letters(DeadLetterFilter(), limit=2, cursor=cursor)
            seen += [d.id for d in page.items]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert sorted(seen) == sorted(ids) and len(seen) == 5
        with pytest.raises(ConfigurationError):
            await store.list_dead_letters(DeadLetterFilter(), limit=0, cursor=None)
        with pytest.raises(ConfigurationError):
            await store.list_dead_letters(DeadLetterFilter(), limit=5, cursor="not-a-cursor")

    async def test_large_dead_letters_page_by_bytes(
        self, store: Store, add: Add, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A page stops once its payloads reach the budget; next_cursor goes on to the rest."""
        ids = [await add("big", large_payload(n), key=f"k{n}") for n in range(5)]
        c = await claim(store, 5)
        await store.settle(c, Settlement(dead=[(i, "too big") for i in ids]))
        first = await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
        assert len(first.items) == 3  # 3 × 1.5 MiB: the sum before the fourth is 4.5 MiB
        assert first.next_cursor is not None
        seen = await following(
            first, lambda c: store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=c)
        )
        assert sorted(d.id for d in seen) == sorted(ids) and len(seen) == 5
        assert all(d.payload == large_payload(ids.index(d.id)) for d in seen)
        monkeypatch.setattr(ports, "PAGE_PAYLOAD_BYTES", 1 << 30)
        whole = await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
        assert [d.id for d in seen] == [d.id for d in whole.items]  # newest first, as one page
        assert whole.next_cursor is None
        # A limit under what the budget allows is kept as before.
        monkeypatch.undo()
        page = await store.list_dead_letters(DeadLetterFilter(), limit=2, cursor=None)
        assert [d.id for d in page.items] == [d.id for d in whole.items[:2]]
        assert page.next_cursor is not None

    async def test_a_dead_letter_over_the_budget_comes_alone(
        self, store: Store, add: Add, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(ports, "PAGE_PAYLOAD_BYTES", 1024 * 1024)
        ids = await self._dead_letters(store, add, 2)  # small ones first: older
        big = await add("big", large_payload(7), key="k7")
        await store.settle(await claim(store), Settlement(dead=[(big, "too big")]))
        first = await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
        assert [d.id for d in first.items] == [big]
        assert first.items[0].payload == large_payload(7)
        assert first.next_cursor is not None
        rest = await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=first.next_cursor)
        assert sorted(d.id for d in rest.items) == sorted(ids) and rest.next_cursor is None
        # Small rows are paged by limit alone.
        small = await store.list_dead_letters(DeadLetterFilter(topic="t"), limit=1, cursor=None)
        assert len(small.items) == 1 and small.next_cursor is not None

    async def test_filters_select_dead_letters(self, store: Store, add: Add) -> None:
        await self._dead_letters(store, add, 2, topic="a")
        b = await self._dead_letters(store, add, 3, topic="b")
        page = await store.list_dead_letters(DeadLetterFilter(topic="b"), limit=10, cursor=None)
        assert sorted(d.id for d in page.items) == sorted(b)
        page = await store.list_dead_letters(DeadLetterFilter(key="k1"), limit=10, cursor=None)
        assert {d.key for d in page.items} == {"k1"} and len(page.items) == 2

    async def test_replay_moves_back_with_same_id_and_attempts_reset(
        self, store: Store, add: Add
    ) -> None:
        ids = await self._dead_letters(store, add, 3)
        assert await store.replay_dead_letters(DeadLetterFilter(ids=[ids[1]])) == [ids[1]]
        with pytest.raises(NotFound):
            await store.get_dead_letter(ids[1])
        # Unordered: an ordered claim waits for the commit-order gate, which any transaction
        # still open in the cluster (a parallel test's) holds back for a while.
        c = await claim(store, ordered=False)
        assert [(m.id, m.attempts) for m in c.messages] == [(ids[1], 0)]
        assert sorted(await store.replay_dead_letters(DeadLetterFilter())) == sorted(
            [ids[0], ids[2]]
        )
        assert (await store.stats()).dead_letters == 0

    async def test_known_dead_letter_ids_are_those_that_name_one(
        self, store: Store, add: Add
    ) -> None:
        ids = await self._dead_letters(store, add, 3)
        pending = await add("t", {"n": 9})  # in the outbox, not a dead letter
        asked = [ids[0], "nope", ids[2], ids[0], pending, "", "é'\\%s"]
        assert await store.known_dead_letter_ids(asked) == {ids[0], ids[2]}
        assert await store.known_dead_letter_ids([]) == set()
        many = [f"x{n}" for n in range(2500)] + [ids[1]]  # more than one query's worth
        assert await store.known_dead_letter_ids(many) == {ids[1]}

    async def test_known_message_ids_are_those_in_the_outbox(self, store: Store, add: Add) -> None:
        dead = await self._dead_letters(store, add, 1)
        pending = [await add("t", {"n": n}) for n in range(2)]
        asked = [pending[0], "nope", dead[0], pending[0], pending[1], "", "é'\\%s"]
        assert await store.known_message_ids(asked) == set(pending)
        assert await store.known_message_ids([]) == set()
        many = [f"x{n}" for n in range(2500)] + [pending[1]]  # more than one query's worth
        assert await store.known_message_ids(many) == {pending[1]}

    async def test_purge_deletes(self, store: Store, add: Add) -> None:
        ids = await self._dead_letters(store, add, 3)
        assert await store.purge_dead_letters(DeadLetterFilter(ids=[ids[0], "nope"])) == [ids[0]]
        assert sorted(await store.purge_dead_letters(DeadLetterFilter())) == sorted(ids[1:])
        assert (await store.stats()).dead_letters == 0

    async def test_relays_register_by_heartbeat(self, store: Store, add: Add) -> None:
        from outboxer.relay import Relay
        from outboxer.testing import RecordingPublisher

        relay = Relay(store, RecordingPublisher())
        await store.heartbeat(relay.info)
        [live] = (await store.stats()).relays
        assert live.relay_id == relay.relay_id and live.pid == relay.info.pid
        await store.unregister(relay.relay_id)
        assert (await store.stats()).relays == []

    async def test_sweep_reports_reaped_leases_and_new_dead_letters(
        self, store: Store, add: Add
    ) -> None:
        first = await add("t", {"n": 1})
        second = await add("t", {"n": 2})
        await claim(store, 1, lease=0.1)
        await asyncio.sleep(0.25)
        assert await store.release_expired_leases() == 1
        c = await claim(store, 2)
        await store.settle(c, Settlement(dead=[(first, "x")], published=[second]))
        report = await store.sweep(sweeper="me", interval=60, retention_seconds=0, batch_size=50)
        assert report is not None
        assert (report.swept_by, report.publish_retries, report.publish_failures) == ("me", 1, 1)
        assert report.completed_at >= report.started_at
        assert (
            await store.sweep(sweeper="other", interval=60, retention_seconds=0, batch_size=50)
            is None
        )  # the last sweep is too recent
        assert await store.last_sweep() == report
        assert (await store.stats()).last_sweep == report

    async def test_sweep_counts_the_relays_own_retries_since_the_previous_sweep(
        self, store: Store, add: Add
    ) -> None:
        # A retry alone (one statement on most stores) and one beside an ack are both counted;
        # a stale claim's retry changes nothing and is not counted.
        a, b, c = [await add("t", {"n": n}) for n in range(3)]
        first = await claim(store, 1)
        await store.settle(first, Settlement(retries=[Retry(a, 0, "boom")]))
        await store.settle(first, Settlement(retries=[Retry(a, 0, "stale")]))
        second = await claim(store, 3)
        assert {m.id for m in second.messages} == {a, b, c}
        await store.settle(
            second, Settlement(retries=[Retry(a, 0, "again"), Retry(b, 0, "boom")], published=[c])
        )
        report = await store.sweep(sweeper="me", interval=0, retention_seconds=0, batch_size=50)
        assert report is not None
        assert (report.publish_retries, report.publish_failures) == (3, 0)
        third = await claim(store, 2)
        await store.settle(third, Settlement(dead=[(a, "x")], published=[b]))
        report = await store.sweep(sweeper="me", interval=0, retention_seconds=0, batch_size=50)
        assert report is not None
        assert (report.publish_retries, report.publish_failures) == (0, 1)  # since the last

    async def test_stats_count_what_waits_for_a_later_time_and_was_never_tried(
        self, store: Store, add: Add
    ) -> None:
        await add("t", {"n": 1}, available_at=dt.timedelta(hours=1))
        failed = await add("t", {"n": 2})
        c = await claim(store)
        await store.settle(c, Settlement(retries=[Retry(failed, 3600, "boom")]))
        stats = await store.stats()
        assert (stats.pending, stats.scheduled) == (2, 1)  # the retry is not "scheduled"
        assert stats.to_json()["scheduled"] == 1

    async def test_stats_count_what_a_key_holds_behind_a_scheduled_message(
        self, store: Store, add: Add
    ) -> None:
        """An ordered relay publishes a key's due message only after the key's scheduled one:
        a drain leaves both for later (it waited for its timeout and exited 1: a probe)."""
        await add("t", {"n": 1}, key="k", available_at=dt.timedelta(hours=1))
        await add("t", {"n": 2}, key="k")
        await add("t", {"n": 3}, key="k", available_at=dt.timedelta(hours=2))
        await add("t", {"n": 4}, key="k")
        await add("t", {"n": 5}, key="other")
        await add("t", {"n": 6})
        stats = await store.stats()
        assert (stats.pending, stats.scheduled, stats.behind_scheduled) == (6, 2, 2)
        assert stats.left_for_later(ordered=True) == 4
        assert stats.left_for_later(ordered=False) == 2
        assert "behind_scheduled" not in stats.to_json()

    async def test_a_failure_without_text_is_stored_with_a_reason(
        self, store: Store, add: Add
    ) -> None:
        retried, dead = await add("t", {"n": 1}), await add("t", {"n": 2})
        c = await claim(store, 2)
        await store.settle(c, Settlement(retries=[Retry(retried, 0, "")], dead=[(dead, " ")]))
        assert (await store.get_dead_letter(dead)).failure_reason.strip()
        shown = await store.get_message(retried)
        assert shown.last_error is not None and shown.last_error.strip()

    async def test_a_failure_quoting_text_no_database_keeps_is_stored(
        self, store: Store, add: Add
    ) -> None:
        """A broker's or webhook's error may quote anything (an HTTP body with NUL, say): it is
        stored with U+FFFD in place of NUL and lone surrogates, not refused by the database
        (which made every settle of the batch fail, as if the database were down)."""
        retried, dead = await add("t", {"n": 1}), await add("t", {"n": 2})
        c = await claim(store, 2)
        reasons = Settlement(
            retries=[Retry(retried, 0, "HTTP 500: a\x00b")], dead=[(dead, "\ud800!")]
        )
        await store.settle(c, reasons)
        assert (await store.get_dead_letter(dead)).failure_reason == "\ufffd!"
        assert (await store.get_message(retried)).last_error == "HTTP 500: a\ufffdb"

    async def test_a_failure_quoting_control_characters_is_stored_escaped(
        self, store: Store, add: Add
    ) -> None:
        """A receiver's escape sequences (``\x1b[2J`` clears a terminal) were stored raw, for
        every reader of the table to print (a probe): they are stored as escapes."""
        retried, dead = await add("t", {"n": 1}), await add("t", {"n": 2})
        c = await claim(store, 2)
        reasons = Settlement(
            retries=[Retry(retried, 0, "HTTP 400 Bad\x1b[31m\tthing")], dead=[(dead, "a\x07\nb")]
        )
        await store.settle(c, reasons)
        assert (await store.get_dead_letter(dead)).failure_reason == "a\\x07\\nb"
        assert (await store.get_message(retried)).last_error == "HTTP 400 Bad\\x1b[31m\\tthing"

    async def test_replay_leaves_a_dead_letter_whose_id_is_back_in_the_outbox(
        self, store: Store, add: Add
    ) -> None:
        [dead_id] = await self._dead_letters(store, add, 1)
        await add("t", {"n": "again"}, id=dead_id)  # the application wrote the id anew
        assert await store.replay_dead_letters(DeadLetterFilter(ids=[dead_id])) == []
        assert (await store.get_dead_letter(dead_id)).id == dead_id

    async def test_a_relay_keeps_the_lease_of_what_it_is_still_publishing(
        self, store: Store, add: Add
    ) -> None:
        first = await add("t", {"n": 1})
        lost = await add("t", {"n": 2})
        c = await claim(store, 1, lease=0.4)
        assert await store.extend_lease(c, 30) == 1
        await asyncio.sleep(0.5)  # past the first lease
        assert await store.release_expired_leases() == 0
        # Fenced by the claim token: another claim's token extends nothing.
        assert await store.extend_lease(Claim(c.token + 1, c.messages), 30) == 0
        other = await claim(store, 1, lease=0.1)
        assert [m.id for m in other.messages] == [lost]
        await asyncio.sleep(0.25)
        assert await store.release_expired_leases() == 1
        assert await store.extend_lease(other, 30) == 0  # a lease taken back stays lost
        await store.settle(c, Settlement(published=[first]))
        assert await store.extend_lease(c, 30) == 0  # settled: nothing held any more

    async def test_a_message_whose_lease_expired_is_claimed_alone_and_counts_solo_deaths(
        self, store: Store, add: Add
    ) -> None:
        a = await add("t", {"n": 1}, key="k")
        b = await add("t", {"n": 2}, key="k")
        c = await add("t", {"n": 3})
        together = await claim(store, lease=0.1)
        assert len(together.messages) == 3 and not together.isolated
        await asyncio.sleep(0.25)  # the relay died holding all three
        assert await store.release_expired_leases() == 3
        alone = await claim(store, lease=0.1)
        assert ([m.id for m in alone.messages], alone.isolated, alone.solo_deaths) == ([a], True, 0)
        await asyncio.sleep(0.25)  # died again, holding it alone: a solo death
        assert await store.release_expired_leases() == 1
        again = await claim(store)
        assert ([m.id for m in again.messages], again.isolated, again.solo_deaths) == ([a], True, 1)
        await store.settle(again, Settlement(published=[a]))
        # The other suspects go alone too, in write order, each counting no death.
        for expected in (b, c):
            one = await claim(store)
            assert ([m.id for m in one.messages], one.isolated, one.solo_deaths) == (
                [expected],
                True,
                0,
            )
            await store.settle(one, Settlement(published=[expected]))
        d = await add("t", {"n": 4})
        e = await add("t", {"n": 5})
        batch = await claim(store)  # no suspect left: batches again
        assert [m.id for m in batch.messages] == [d, e] and not batch.isolated

    async def test_a_reused_id_that_fails_again_replaces_its_dead_letter_and_the_batch_settles(
        self, store: Store, add: Add
    ) -> None:
        [reused] = await self._dead_letters(store, add, 1)
        older = await self._dead_letters(store, add, 1)
        await add("t", {"n": "anew"}, id=reused)  # ids may be reused: the application did
        other = await add("t", {"n": "other"})
        c = await claim(store)
        assert sorted(m.id for m in c.messages) == sorted([reused, other])
        await store.settle(c, Settlement(dead=[(reused, "failed again")], published=[other]))
        stats = await store.stats()
        assert (stats.pending, stats.in_flight, stats.dead_letters) == (0, 0, 2)
        page = await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
        assert [d.id for d in page.items] == [reused, *older]  # the newest, replaced
        replaced = page.items[0]
        assert replaced.failure_reason == "failed again" and replaced.attempts == 1
        assert json.loads(replaced.payload) == {"n": "anew"}

    async def test_a_publish_and_a_consume_dead_letter_of_one_id_are_both_kept(
        self, store: Store, add: Add
    ) -> None:
        """A service that consumes what it publishes can fail on one id both ways (ids may be
        reused; a publish whose acknowledgement was lost still reached the broker). Before,
        the dead-letter table held one row per id: the second dead letter was dropped or
        replaced the first, and a consume failure without its dead letter was forgotten by
        the sweep, so no operator ever saw it or could replay it."""
        [reused] = await self._dead_letters(store, add, 1)  # publish dead letter
        received = Message(id=reused, topic="t", payload=b'{"n": "received"}', key="k0")
        broken = {"yes": True}
        handled: list[str] = []

        async def handler(message: Message, connection: Any, attempt: int) -> None:
            if broken["yes"]:
                raise ValueError("cannot handle")
            handled.append(message.id)

        def judge(message: Message, attempts: int, error: Exception) -> ConsumeFailure:
            return ConsumeFailure(f"gave up: {error}", None)

        options: dict[str, Any] = {"on_failure": judge, "retention_seconds": 60}
        assert await consume(store, "c", [received], handler, **options) == ["dead"]
        page = await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
        assert [(d.id, d.direction) for d in page.items] == [
            (reused, "consume"),
            (reused, "publish"),
        ]
        assert (await store.stats()).dead_letters == 2
        assert (await store.get_dead_letter(reused)).direction == "consume"  # the newest
        publish = await store.get_dead_letter(reused, "publish")
        assert (publish.direction, publish.failure_reason) == ("publish", f"reason {reused}")
        consumed = await store.get_dead_letter(reused, "consume")
        assert (consumed.direction, consumed.payload) == ("consume", received.payload)
        with pytest.raises(NotFound, match="no consume dead letter with id 'nope'"):
            await store.get_dead_letter("nope", "consume")
        assert await store.known_dead_letter_ids([reused, "nope"]) == {reused}
        # The id is written anew and fails again: it replaces the publish dead letter only.
        await add("t", {"n": "anew"}, id=reused)
        c = await claim(store)
        await store.settle(c, Settlement(dead=[(reused, "failed again")]))
        page = await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
        assert [(d.id, d.direction, d.failure_reason) for d in page.items] == [
            (reused, "publish", "failed again"),
            (reused, "consume", "gave up: cannot handle"),
        ]
        assert (await store.get_dead_letter(reused)).direction == "publish"
        # The sweep keeps the consume failure: its dead letter is there.
        await store.sweep(sweeper="s", interval=0, retention_seconds=0, batch_size=50)
        # Replaying the id replays both, each its own way.
        broken["yes"] = False
        assert await store.replay_dead_letters(DeadLetterFilter(ids=[reused])) == [reused]
        assert (
            await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
        ).items == []
        # (unordered: an ordered claim waits for the commit-order gate, see above)
        c = await claim(store, ordered=False)
        assert [m.id for m in c.messages] == [reused]  # published again
        assert json.loads(c.messages[0].payload) == {"n": "anew"}
        assert await redrive_consume_failures(store, "c", handler, limit=10, **options) == [
            "handled"
        ]
        assert handled == [reused]

    async def test_dead_letters_are_listed_replayed_and_purged_by_direction(
        self, store: Store, add: Add
    ) -> None:
        # publish dead letters, one settle each: b is the newer (one settle numbers its rows
        # in no set order)
        [a] = await self._dead_letters(store, add, 1)
        [b] = await self._dead_letters(store, add, 1)

        async def failing(message: Message, connection: Any, attempt: int) -> None:
            raise ValueError("cannot handle")

        def judge(message: Message, attempts: int, error: Exception) -> ConsumeFailure:
            return ConsumeFailure(f"gave up: {error}", None)

        received = [Message(id=i, topic="t", payload=b"{}") for i in (b, "consumed-only")]
        options: dict[str, Any] = {"on_failure": judge, "retention_seconds": 60}
        assert await consume(store, "c", received, failing, **options) == ["dead", "dead"]

        async def listed(flt: DeadLetterFilter) -> list[tuple[str, str]]:
            page = await store.list_dead_letters(flt, limit=10, cursor=None)
            return [(d.id, d.direction) for d in page.items]

        assert await listed(DeadLetterFilter(direction="consume")) == [
            ("consumed-only", "consume"),
            (b, "consume"),
        ]
        assert await listed(DeadLetterFilter(direction="publish")) == [
            (b, "publish"),
            (a, "publish"),
        ]
        assert await store.purge_dead_letters(DeadLetterFilter(ids=[b], direction="publish")) == [b]
        assert await listed(DeadLetterFilter()) == [
            ("consumed-only", "consume"),
            (b, "consume"),
            (a, "publish"),
        ]
        assert await store.replay_dead_letters(DeadLetterFilter(direction="publish")) == [a]
        assert [m.id for m in (await claim(store, ordered=False)).messages] == [a]
        assert await listed(DeadLetterFilter(ids=[a, b])) == [(b, "consume")]
        assert await store.replay_dead_letters(DeadLetterFilter(direction="consume")) == [
            b,
            "consumed-only",
        ]
        assert await listed(DeadLetterFilter()) == []

    async def test_a_replay_names_only_what_it_left_because_the_id_is_back_in_the_outbox(
        self, store: Store, add: Add
    ) -> None:
        """``replay_skipped``: before, what a replay left was "what the filter still selects",
        so a dead letter written after the replay was reported as skipped, for a reason it did
        not have."""
        [back] = await self._dead_letters(store, add, 1)
        await add("t", {"n": "anew"}, id=back)
        assert await store.replay_dead_letters(DeadLetterFilter()) == []
        later = await add("t", {"n": "later"})  # dead-lettered after the replay
        c = await claim(store, 10, ordered=False)
        assert sorted(m.id for m in c.messages) == sorted([back, later])
        await store.settle(c, Settlement(dead=[(later, "rejected")], released=[back]))
        assert (await store.get_dead_letter(later)).direction == "publish"
        assert await ports.replay_skipped(store, DeadLetterFilter()) == [back]
        assert await ports.replay_skipped(store, DeadLetterFilter(direction="consume")) == []

    async def test_a_dead_lettered_key_can_be_held_until_an_operator_acts(
        self, store: Store, add: Add
    ) -> None:
        first = await add("t", {"n": 1}, key="held")
        second = await add("t", {"n": 2}, key="held")
        other = await add("t", {"n": 3}, key="free")
        c = await claim(store, 1)
        await store.settle(c, Settlement(dead=[(first, "rejected")]))
        held = await store.claim_batch(
            ClaimRequest(
                limit=10, lease_seconds=30, ordered=True, relay_id=RELAY, hold_dead_keys=True
            )
        )
        assert [m.id for m in held.messages] == [other]  # "held" waits, others flow
        await store.purge_dead_letters(DeadLetterFilter(ids=[first]))
        released = await store.claim_batch(
            ClaimRequest(
                limit=10, lease_seconds=30, ordered=True, relay_id=RELAY, hold_dead_keys=True
            )
        )
        assert [m.id for m in released.messages] == [second]

    # -- messages not yet published (operators' read-only view) -------------------------------

    async def test_messages_scheduled_at_the_ends_of_the_calendar_are_read_back(
        self, store: Store, add: Add
    ) -> None:
        """Found by a probe: ``available_at=datetime.max`` is accepted (years 1-9999), but
        SQLite's Unix seconds round it up to year 10000, and every read of the outbox's
        messages (``messages list``, ``/api/messages``) failed with "year 10000 is out of
        range"."""
        latest = await add("t", {"n": 1}, key="late", available_at=dt.datetime.max)
        earliest = await add("t", {"n": 2}, key="early", available_at=dt.datetime.min)
        page = await store.list_messages(MessageFilter(), limit=10, cursor=None)
        assert {m.id: m.state for m in page.items} == {latest: "scheduled", earliest: "pending"}
        shown = await store.get_message(latest)
        assert shown.next_attempt_at == dt.datetime.max.replace(tzinfo=dt.UTC)
        shown = await store.get_message(earliest)
        assert shown.next_attempt_at == dt.datetime.min.replace(tzinfo=dt.UTC)
        assert [m.id for m in (await claim(store, 10)).messages] == [earliest]

    async def test_messages_show_where_each_one_stands(self, store: Store, add: Add) -> None:
        dead = await add("t", {"n": 1}, key="h")
        retrying = await add("t", {"n": 2}, key="r")
        leased = await add("t", {"n": 3}, key="f")
        c = await claim(store, 3, ordered=False)
        await store.settle(
            c,
            Settlement(dead=[(dead, "rejected")], retries=[Retry(retrying, 60, "broker said no")]),
        )
        held = await add("t", {"n": 4}, key="h")
        pending = await add("t", {"n": 5}, type="T")
        scheduled = await add("t", {"n": 6}, available_at=dt.timedelta(hours=1))
        before = dt.datetime.now(dt.UTC)

        page = await store.list_messages(MessageFilter(), limit=10, cursor=None)
        assert page.next_cursor is None
        states = {m.id: m.state for m in page.items}
        assert [m.id for m in page.items] == [retrying, leased, held, pending, scheduled]
        assert states == {
            retrying: "retrying",
            leased: "in_flight",
            held: "held",
            pending: "pending",
            scheduled: "scheduled",
        }
        for state, message_id in [
            ("retrying", retrying),
            ("in_flight", leased),
            ("held", held),
            ("pending", pending),
            ("scheduled", scheduled),
        ]:
            only = await store.list_messages(MessageFilter(state=state), limit=10, cursor=None)
            assert [m.id for m in only.items] == [message_id], state

        retry = await store.get_message(retrying)
        assert (retry.attempts, retry.last_error, retry.relay) == (1, "broker said no", None)
        assert retry.next_attempt_at > before + dt.timedelta(seconds=50)
        lease = await store.get_message(leased)
        assert lease.relay == RELAY and lease.lease_expires_at is not None
        assert lease.lease_expires_at > before and lease.attempts == 0
        fresh = await store.get_message(pending)
        assert (fresh.type, fresh.last_error, fresh.relay, fresh.lease_expires_at) == (
            "T",
            None,
            None,
            None,
        )
        assert fresh.next_attempt_at <= dt.datetime.now(dt.UTC) and fresh.created_at <= before
        shape = fresh.to_json()
        assert shape["payload"] == {"n": 5} and shape["state"] == "pending"
        assert set(shape) == {
            "id",
            "topic",
            "key",
            "type",
            "state",
            "attempts",
            "last_error",
            "next_attempt_at",
            "relay",
            "lease_expires_at",
            "created_at",
            "payload",
            "content_type",
            "headers",
        }
        with pytest.raises(NotFound):
            await store.get_message(dead)  # a dead letter now, not an outbox message
        with pytest.raises(NotFound):
            await store.get_message("no-such-id")

    async def test_large_messages_page_by_bytes(
        self, store: Store, add: Add, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A page stops once its payloads reach the budget; next_cursor goes on to the rest."""
        ids = [await add("big", large_payload(n), key=f"k{n}") for n in range(5)]
        first = await store.list_messages(MessageFilter(), limit=10, cursor=None)
        assert [m.id for m in first.items] == ids[:3]  # the sum before the fourth is 4.5 MiB
        assert first.next_cursor is not None
        seen = await following(
            first, lambda c: store.list_messages(MessageFilter(), limit=10, cursor=c)
        )
        assert [m.id for m in seen] == ids  # oldest first, each once
        assert [m.payload for m in seen] == [large_payload(n) for n in range(5)]
        # The budget counts only the rows that match the filters.
        keyed = await store.list_messages(MessageFilter(key="k4"), limit=10, cursor=None)
        assert [m.id for m in keyed.items] == [ids[4]] and keyed.next_cursor is None
        # A limit under what the budget allows is kept as before.
        page = await store.list_messages(MessageFilter(), limit=2, cursor=None)
        assert [m.id for m in page.items] == ids[:2] and page.next_cursor is not None
        # A message over the budget comes alone, with its cursor; one message is shown whole.
        monkeypatch.setattr(ports, "PAGE_PAYLOAD_BYTES", 1024 * 1024)
        small = await add("small", {"n": 1})
        pages: list[list[str]] = []
        cursor = None
        while True:
            page = await store.list_messages(MessageFilter(), limit=10, cursor=cursor)
            pages.append([m.id for m in page.items])
            cursor = page.next_cursor
            if cursor is None:
                break
        assert pages == [[i] for i in ids] + [[small]]
        assert (await store.get_message(ids[2])).payload == large_payload(2)

    async def test_messages_page_oldest_first_and_filter(self, store: Store, add: Add) -> None:
        ids = [
            await add(("a", "b")[n % 2], {"n": n}, key=f"k{n % 3}", type=("X", "Y")[n % 2])
            for n in range(7)
        ]
        seen: list[str] = []
        cursor = None
        while True:
            page = await store.list_messages(MessageFilter(), limit=3, cursor=cursor)
            assert len(page.items) <= 3
            seen += [m.id for m in page.items]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == ids

        async def listed(flt: MessageFilter) -> list[str]:
            return [m.id for m in (await store.list_messages(flt, limit=100, cursor=None)).items]

        assert await listed(MessageFilter(topic="b")) == ids[1::2]
        assert await listed(MessageFilter(key="k1")) == ids[1::3]
        assert await listed(MessageFilter(type="X", key="k0")) == [ids[0], ids[6]]
        assert await listed(MessageFilter(topic="a", state="pending")) == ids[0::2]
        assert await listed(MessageFilter(topic="nope")) == []
        assert await listed(MessageFilter(state="in_flight")) == []
        with pytest.raises(ConfigurationError):
            await store.list_messages(MessageFilter(), limit=0, cursor=None)
        with pytest.raises(ConfigurationError):
            await store.list_messages(MessageFilter(), limit=5, cursor="not-a-cursor")
