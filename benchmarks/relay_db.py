"""Relay throughput on PostgreSQL without a broker, and the cost of the claim statement.

- ``null``: a publisher that acknowledges at once: the database-side ceiling of the relay
  (claim + settle per batch), i.e. the "raw database claim+ack ceiling" other figures divide by;
- ``inprocess``: the in-process publisher running a no-op handler (``inprocess://``);
- batch sizes 100/500/1000, ordered (default) and unordered;
- claim cost: one ``claim_batch`` on a 20k backlog, per message, ordered and unordered.

Run: ``.venv/bin/python -m benchmarks.relay_db``
"""

from __future__ import annotations

import asyncio
from typing import Any

from benchmarks.common import (
    PG_URL,
    NullPublisher,
    claim_cost,
    drain_rate,
    fill,
    fresh_schema,
    save,
)
from outboxer.brokers.inprocess.publisher import InProcessPublisher
from outboxer.config import RelaySettings, TableNames
from outboxer.inbox.registry import HandlerRegistry
from outboxer.message import Message
from outboxer.stores.postgres import PostgresStore

COUNT = 20_000


def noop_handlers() -> InProcessPublisher:
    registry = HandlerRegistry()

    async def noop(message: Message) -> None:
        return None

    registry.register(noop, "OrderCreated")
    return InProcessPublisher(registry)


async def relay_rates() -> list[dict[str, Any]]:
    rows = []
    for publisher_name in ("null", "inprocess"):
        for batch in (100, 500, 1000):
            for ordered in (True, False):
                async with fresh_schema("bench_relay") as schema:
                    async with PostgresStore(PG_URL, TableNames(schema=schema)) as store:
                        await store.migrate()
                    await fill(schema, COUNT, keys=1000)
                    publisher = NullPublisher() if publisher_name == "null" else noop_handlers()
                    settings = RelaySettings(batch_size=batch, ordered=ordered)
                    rate = await drain_rate(schema, publisher, settings, COUNT)
                rows.append(
                    {
                        "publisher": publisher_name,
                        "batch": batch,
                        "ordered": ordered,
                        "msg_per_s": round(rate),
                    }
                )
                print(
                    f"{publisher_name:9} batch {batch:5} {'ordered' if ordered else 'unordered':9}"
                    f" {rate:9.0f} msg/s"
                )
    return rows


async def claim_costs() -> list[dict[str, Any]]:
    rows = []
    for ordered in (True, False):
        async with (
            fresh_schema("bench_claim") as schema,
            PostgresStore(PG_URL, TableNames(schema=schema)) as store,
        ):
            await store.migrate()
            await fill(schema, COUNT, keys=1000)
            claim_us, ack_us = await claim_cost(store, ordered=ordered)
        rows.append(
            {
                "ordered": ordered,
                "claim_us_per_msg": round(claim_us, 2),
                "ack_us_per_msg": round(ack_us, 2),
            }
        )
        print(
            f"claim ({'ordered' if ordered else 'unordered'}) {claim_us:.2f} µs/msg, "
            f"ack {ack_us:.2f} µs/msg (batches of 500 on a {COUNT} backlog)"
        )
    return rows


async def main() -> dict[str, Any]:
    result = {"count": COUNT, "relay": await relay_rates(), "claim": await claim_costs()}
    save("relay_db", result)
    return result


if __name__ == "__main__":
    asyncio.run(main())
