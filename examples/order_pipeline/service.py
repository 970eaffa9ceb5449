"""The order service: an order and its ``OrderCreated`` event are written in one transaction.

``POST /api/orders`` inserts the order row and, on the same asyncpg connection and inside the
same transaction, the outbox message announcing it. Either both commit or neither does: there
is no moment where an order exists whose event is lost, or an event announces an order that was
rolled back. ``outboxer relay`` publishes the message to Kafka afterwards (topic
``<prefix>.<region>``, Kafka key = the order id, ``ce_id`` header = the message id).

Everything else an operator needs comes from outboxer's admin app, mounted at the root *after*
the service's own routes: ``GET /api/deadletters`` (and replay/delete), ``GET /api/stats``,
``/healthz``, ``/readyz``, ``/metrics`` and the dashboard at ``/``. Replay and delete need
``Authorization: Bearer $OUTBOXER_ADMIN_TOKEN``; with a token set, so do the admin reads.
The service's own ``/api/orders`` routes are not behind that token (they would have the
application's own authentication).

Configuration (environment):

- ``ORDERS_DATABASE_URL``: PostgreSQL URL (default ``postgresql://postgres@127.0.0.1:5432/test``)
- ``ORDERS_SCHEMA``: schema of the orders and outbox tables (default: the connection's)
- ``ORDERS_TOPIC_PREFIX``: Kafka topic prefix (default ``orders``): topic ``orders.eu`` …
- ``OUTBOXER_ADMIN_TOKEN``: bearer token of the dead-letter API

Run: ``uvicorn --app-dir examples/order_pipeline service:app`` (see README.md).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import os
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

import asyncpg
from fastapi import FastAPI, HTTPException, Response
from pydantic import BaseModel, Field

import outboxer
from outboxer.admin import create_app
from outboxer.config import TableNames
from outboxer.stores import open_store

ORDERS_DDL = """
CREATE TABLE IF NOT EXISTS {orders} (
    id          uuid PRIMARY KEY,
    customer_id text NOT NULL,
    region      text NOT NULL,
    lines       jsonb NOT NULL,
    total       numeric(12, 2) NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
)
"""


class OrderLine(BaseModel):
    sku: Annotated[str, Field(min_length=1, max_length=64)]
    quantity: Annotated[int, Field(ge=1, le=1000)]
    unit_price: Annotated[decimal.Decimal, Field(ge=0, max_digits=10, decimal_places=2)]


class NewOrder(BaseModel):
    customer_id: Annotated[str, Field(min_length=1, max_length=64)]
    # The region chooses the topic (orders.eu, orders.us, ...): one topic per data region.
    region: Annotated[str, Field(pattern=r"^[a-z]{2,12}$")] = "eu"
    lines: Annotated[list[OrderLine], Field(min_length=1, max_length=100)]


class Order(BaseModel):
    id: uuid.UUID
    customer_id: str
    region: str
    lines: list[OrderLine]
    total: decimal.Decimal
    created_at: dt.datetime


class CreatedOrder(Order):
    event_id: str  # the outbox message id: the ce_id header consumers deduplicate on


def create_service(
    database_url: str,
    *,
    schema: str | None = None,
    topic_prefix: str = "orders",
    admin_token: str | None = None,
) -> FastAPI:
    """The order service over ``database_url`` (orders and outbox in ``schema``)."""
    names = TableNames(schema=schema)  # validates the schema name
    outbox = outboxer.Outbox(schema=schema)
    orders = f'"{schema}"."orders"' if schema else '"orders"'
    # The admin app reads dead letters and stats through a store; the service owns it (opened
    # and closed in the lifespan below: Starlette does not run a mounted app's lifespan).
    store = open_store(database_url, names)
    state: dict[str, asyncpg.Pool] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with store:
            await store.check_schema()  # 'outboxer db upgrade' must have run
            pool = await asyncpg.create_pool(database_url, min_size=1, max_size=10)
            try:
                async with pool.acquire() as conn:
                    await conn.execute(ORDERS_DDL.format(orders=orders))
                state["pool"] = pool
                yield
            finally:
                await pool.close()

    app = FastAPI(title="orders", lifespan=lifespan)

    @app.post("/api/orders", status_code=201, response_model=CreatedOrder)
    async def create_order(order: NewOrder, response: Response) -> dict[str, Any]:
        order_id = uuid.uuid4()
        total = sum((line.quantity * line.unit_price for line in order.lines), decimal.Decimal(0))
        lines = [line.model_dump(mode="json") for line in order.lines]
        async with state["pool"].acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"INSERT INTO {orders} (id, customer_id, region, lines, total) "
                "VALUES ($1, $2, $3, $4::jsonb, $5) RETURNING *",
                order_id,
                order.customer_id,
                order.region,
                json.dumps(lines),
                total,
            )
            # Same connection, same transaction: the event commits with the order or not at all.
            event_id = await outbox.enqueue_async(
                conn,
                f"{topic_prefix}.{order.region}",
                {
                    "order_id": str(order_id),
                    "customer_id": order.customer_id,
                    "region": order.region,
                    "lines": lines,
                    "total": str(total),
                    "created_at": row["created_at"].isoformat(),
                },
                key=str(order_id),  # Kafka key: every event of one order in one partition
                type="OrderCreated",
            )
        response.headers["Location"] = f"/api/orders/{order_id}"
        return {**_order(row), "event_id": event_id}

    @app.get("/api/orders/{order_id}", response_model=Order)
    async def get_order(order_id: uuid.UUID) -> dict[str, Any]:
        async with state["pool"].acquire() as conn:
            row = await conn.fetchrow(f"SELECT * FROM {orders} WHERE id = $1", order_id)
        if row is None:
            raise HTTPException(404, f"no order {order_id}")
        return _order(row)

    # Last, so /api/orders above wins; everything else is outboxer's admin app.
    app.mount("/", create_app(store, token=admin_token))
    return app


def _order(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "id": row["id"],
        "customer_id": row["customer_id"],
        "region": row["region"],
        "lines": json.loads(row["lines"]),
        "total": row["total"],
        "created_at": row["created_at"],
    }


app = create_service(
    os.environ.get("ORDERS_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    schema=os.environ.get("ORDERS_SCHEMA") or None,
    topic_prefix=os.environ.get("ORDERS_TOPIC_PREFIX", "orders"),
    admin_token=os.environ.get("OUTBOXER_ADMIN_TOKEN") or None,
)
