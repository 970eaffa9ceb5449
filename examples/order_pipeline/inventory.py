"""The inventory consumer: every ``OrderCreated`` event reduces stock, exactly once.

``outboxer consume`` runs :data:`registry` for the events on Kafka. Each event is handled in
one database transaction that holds both the inbox row (consumer ``inventory``, message id) and
the stock update, so a redelivered event (a consumer crash before its Kafka offset commit, a
rebalance, offsets reset by an operator) finds its inbox row and changes nothing::

    outboxer consume --database-url "$ORDERS_DATABASE_URL" --broker "kafka://$KAFKA" \\
        --app-dir examples/order_pipeline --handlers inventory:registry \\
        --consumer-name inventory --topic orders.eu --max-attempts 3

An order line for a SKU the warehouse does not stock fails the handler (:class:`UnknownSku`):
the inbox rolls its writes back, retries it (``--retry-base``, doubling), and after
``--max-attempts`` turns it into a dead letter with direction ``consume`` that operators see at
``GET /api/deadletters``. Once the SKU is stocked, replaying the dead letter runs the handler
again. Other orders go on meanwhile: a failure holds back only the events of its own key.

The stock tables live next to the orders (``ORDERS_SCHEMA``, as for the service). Set stock with
``python examples/order_pipeline/inventory.py --stock BOOK-1=100 [--stock SKU=N ...]``, which
also creates the tables.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

import asyncpg

from outboxer.inbox import HandlerContext, HandlerRegistry

SCHEMA = os.environ.get("ORDERS_SCHEMA") or None
STOCK = f'"{SCHEMA}"."stock"' if SCHEMA else '"stock"'
MOVEMENTS = f'"{SCHEMA}"."stock_movements"' if SCHEMA else '"stock_movements"'

DDL = f"""
CREATE TABLE IF NOT EXISTS {STOCK} (
    sku      text PRIMARY KEY,
    quantity integer NOT NULL
);
CREATE TABLE IF NOT EXISTS {MOVEMENTS} (
    order_id uuid NOT NULL,
    sku      text NOT NULL,
    quantity integer NOT NULL,
    event_id text NOT NULL,
    PRIMARY KEY (order_id, sku)
)
"""

registry = HandlerRegistry()


class UnknownSku(Exception):
    """An order line names a SKU the warehouse has no stock row for (yet)."""


@registry.handler("OrderCreated")
async def reduce_stock(order: dict[str, Any], ctx: HandlerContext) -> None:
    """Take each line's quantity out of stock, in the inbox's transaction.

    ``ctx.connection`` is the asyncpg connection of the transaction that also records the
    inbox row: the UPDATEs commit with it or not at all. The movement rows make the effect
    visible; their primary key would refuse a second run for the same order, but the inbox
    never lets one happen.
    """
    conn = ctx.connection
    for line in order["lines"]:
        updated = await conn.fetchval(
            f"UPDATE {STOCK} SET quantity = quantity - $2 WHERE sku = $1 RETURNING quantity",
            line["sku"],
            line["quantity"],
        )
        if updated is None:
            raise UnknownSku(f"no stock row for SKU {line['sku']!r} (order {order['order_id']})")
        await conn.execute(
            f"INSERT INTO {MOVEMENTS} (order_id, sku, quantity, event_id) VALUES ($1, $2, $3, $4)",
            order["order_id"],
            line["sku"],
            -line["quantity"],
            ctx.message.id,
        )


async def set_stock(database_url: str, levels: dict[str, int]) -> None:
    """Create the stock tables if needed and set the given SKUs' quantities."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(DDL)
        await conn.executemany(
            f"INSERT INTO {STOCK} (sku, quantity) VALUES ($1, $2) "
            "ON CONFLICT (sku) DO UPDATE SET quantity = excluded.quantity",
            list(levels.items()),
        )
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Set stock levels (creates the tables).")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("ORDERS_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--stock", action="append", default=[], metavar="SKU=QUANTITY")
    args = parser.parse_args(argv)
    levels = {}
    for item in args.stock:
        sku, _, quantity = item.partition("=")
        if not sku or not quantity.isdigit():
            parser.error(f"--stock {item!r}: use SKU=QUANTITY")
        levels[sku] = int(quantity)
    asyncio.run(set_stock(args.database_url, levels))
    for sku, quantity in levels.items():
        print(f"stock {sku} = {quantity}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
