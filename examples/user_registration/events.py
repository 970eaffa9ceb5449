"""The event this example publishes: one per registered user."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UserRegistered:
    """A user signed up. Written to the outbox in the transaction that inserts the user."""

    user_id: int
    email: str
    name: str
