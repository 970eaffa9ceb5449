"""The write side: ``register_user`` inserts the user and ``UserRegistered`` in one transaction.

Run it from the repository root (PostgreSQL; ``DATABASE_URL`` and ``EXAMPLE_SCHEMA`` say where)::

    python -m examples.user_registration.app init
    python -m examples.user_registration.app register alice@example.com Alice
"""

from __future__ import annotations

import asyncio
import os
import sys

import asyncpg
from examples.user_registration.events import UserRegistered

import outboxer

DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
SCHEMA = os.environ.get("EXAMPLE_SCHEMA", "public")
#: The topic (RabbitMQ routing key) of the example's events.
TOPIC = "users"


def users_table(schema: str = SCHEMA) -> str:
    return f'"{schema}".users'


async def create_tables(conn: asyncpg.Connection, schema: str = SCHEMA) -> None:
    """The application's own table (the outbox tables come from ``outboxer db upgrade``)."""
    await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    await conn.execute(
        f"CREATE TABLE IF NOT EXISTS {users_table(schema)} ("
        " id bigserial PRIMARY KEY, email text NOT NULL UNIQUE, name text NOT NULL,"
        " registered_at timestamptz NOT NULL DEFAULT now(),"
        # Set by the welcome handler in its inbox transaction: the e-mail went out.
        " welcomed_at timestamptz)"
    )


async def register_user(
    conn: asyncpg.Connection, email: str, name: str, *, schema: str = SCHEMA
) -> tuple[int, str]:
    """Insert the user and announce it, atomically: both or neither.

    Returns the user id and the id of the ``UserRegistered`` message.
    """
    async with conn.transaction():
        user_id: int = await conn.fetchval(
            f"INSERT INTO {users_table(schema)} (email, name) VALUES ($1, $2) RETURNING id",
            email,
            name,
        )
        message_id = await outboxer.Outbox(schema=schema).enqueue_async(
            conn,
            TOPIC,
            UserRegistered(user_id=user_id, email=email, name=name),
            key=str(user_id),  # one user's events stay in order
            type="UserRegistered",
        )
    return user_id, message_id


async def main(argv: list[str]) -> None:
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        if argv[:1] == ["init"]:
            await create_tables(conn)
            print(f"created {users_table()}")
        elif argv[:1] == ["register"] and len(argv) == 3:
            user_id, message_id = await register_user(conn, argv[1], argv[2])
            print(f"registered user {user_id}; UserRegistered {message_id} is in the outbox")
        else:
            sys.exit("usage: python -m examples.user_registration.app init | register EMAIL NAME")
    finally:
        await conn.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
