"""The events the shop publishes, as the handlers decode them: a dataclass and a pydantic
model (``outboxer.enqueue`` takes either, a dict, or a model instance's fields as a dict)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel


class CustomerRegistered(BaseModel):
    customer_id: int
    email: str
    name: str


@dataclass(frozen=True)
class OrderPlaced:
    order_id: int
    email: str
    item: str
    quantity: int
    total_cents: int
