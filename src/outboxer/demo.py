"""``outboxer demo``: the two systems outboxer comes from, on SQLite, with no services.

1. The order pipeline: ``place_order`` writes the order row and an ``OrderCreated`` message in
   one transaction; a handler "ships" it.
2. User registration: ``register_user`` writes the user and ``UserRegistered``; the
   ``send_welcome_email`` handler "sends" the mail and rejects an invalid address every time, so
   that message ends as a dead letter after three attempts.

One order is rolled back (payment declined) to show that its message never exists.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path
from urllib.parse import quote

import click

import outboxer
from outboxer.brokers.inprocess.publisher import InProcessPublisher
from outboxer.config import Backoff, RelaySettings
from outboxer.inbox.registry import HandlerRegistry
from outboxer.message import Message
from outboxer.ports import DeadLetterFilter
from outboxer.relay import Relay
from outboxer.stores.sqlite import SqliteStore

DEMO_MAX_ATTEMPTS = 3

handlers = HandlerRegistry()
delivered: list[str] = []


class PaymentDeclined(Exception):
    """The business rule that makes one demo transaction roll back."""


@handlers.handler("OrderCreated")
def ship_order(message: Message) -> None:
    order = message.json()
    delivered.append(f"OrderCreated  order #{order['order_id']} → shipping {order['item']}")
    click.echo(f"   [handler] ship order #{order['order_id']} ({order['item']})")


@handlers.handler("UserRegistered")
def send_welcome_email(message: Message) -> None:
    user = message.json()
    if "@" not in user["email"]:
        attempt = message.attempts + 1
        then = "retried later" if attempt < DEMO_MAX_ATTEMPTS else "gives up: dead letter"
        click.echo(f"   [handler] cannot e-mail {user['email']!r} (attempt {attempt}) → {then}")
        raise ValueError(f"invalid e-mail address {user['email']!r}")
    delivered.append(f"UserRegistered  welcome e-mail → {user['email']}")
    click.echo(f"   [handler] welcome e-mail sent to {user['email']}")


def create_business_tables(conn: sqlite3.Connection) -> None:
    conn.executescript(
        """
        CREATE TABLE IF NOT EXISTS orders (
            id INTEGER PRIMARY KEY, customer TEXT NOT NULL, item TEXT NOT NULL,
            total REAL NOT NULL);
        CREATE TABLE IF NOT EXISTS users (
            id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL);
        """
    )


def place_order(conn: sqlite3.Connection, customer: str, item: str, total: float) -> int:
    """The order pipeline's write: the order and its OrderCreated message, one transaction."""
    with conn:  # commits on success, rolls back on any exception
        cur = conn.execute(
            "INSERT INTO orders (customer, item, total) VALUES (?, ?, ?)", (customer, item, total)
        )
        order_id = int(cur.lastrowid or 0)
        outboxer.enqueue(
            conn,
            "orders",
            {"order_id": order_id, "customer": customer, "item": item, "total": total},
            key=str(order_id),
            type="OrderCreated",
        )
        if total > 1000:
            raise PaymentDeclined(f"payment of {total:.2f} declined")
    return order_id


def register_user(conn: sqlite3.Connection, name: str, email: str) -> int:
    """The classic example: the user row and UserRegistered in one unit of work."""
    with conn:
        cur = conn.execute("INSERT INTO users (name, email) VALUES (?, ?)", (name, email))
        user_id = int(cur.lastrowid or 0)
        outboxer.enqueue(
            conn,
            "users",
            {"user_id": user_id, "name": name, "email": email},
            key=f"user-{user_id}",
            type="UserRegistered",
        )
    return user_id


def _url(database: str) -> str:
    """The ``sqlite:///`` URL of ``database``, percent-encoded: a space, ``?``, ``#`` or ``%``
    in its name is no part of the URL's grammar, and a quote none of the shell's."""
    return f"sqlite:///{quote(database)}"


async def run(database: str | None = None) -> None:
    """Run the whole demo and print what happened."""
    workdir = None
    if database is None:
        workdir = tempfile.TemporaryDirectory(prefix="outboxer-demo-")
        database = str(Path(workdir.name) / "demo.db")
    delivered.clear()
    echo = click.echo
    try:
        echo(f"outboxer demo: SQLite database {database}, in-process handlers, no services\n")
        async with SqliteStore(database) as store:
            await store.migrate()
            conn = sqlite3.connect(database)
            create_business_tables(conn)

            echo("1. Business transactions, each writing its rows and its message atomically")
            place_order(conn, "alice", "espresso machine", 349.00)
            echo("   ✓ alice orders an espresso machine          → OrderCreated queued")
            register_user(conn, "bob", "bob@example.com")
            echo("   ✓ bob registers                             → UserRegistered queued")
            try:
                place_order(conn, "carol", "grand piano", 25_000.00)
            except PaymentDeclined:
                echo("   ✗ carol orders a grand piano: payment declined")
                echo("     → the transaction rolled back: no order row, no OrderCreated message")
            place_order(conn, "dave", "coffee beans", 19.90)
            echo("   ✓ dave orders coffee beans                  → OrderCreated queued")
            register_user(conn, "mallory", "not-an-email")
            echo("   ✓ mallory registers with a broken address   → UserRegistered queued")
            orders = conn.execute("SELECT count(*) FROM orders").fetchone()[0]
            conn.close()
            queued = (await store.stats()).pending
            echo(f"   database: {orders} orders, {queued} messages waiting in the outbox\n")

            echo("2. The relay claims the messages and runs their handlers")
            settings = RelaySettings(
                batch_size=10,
                max_attempts=DEMO_MAX_ATTEMPTS,
                retry=Backoff(base=0.2, factor=2, cap=1),
            )
            counters = await Relay(store, InProcessPublisher(handlers), settings).drain(30)
            echo("")

            echo("3. Outcome")
            echo(f"   delivered ({counters.published}):")
            for line in delivered:
                echo(f"     • {line}")
            echo("   never sent (1):")
            echo("     • carol's OrderCreated: rolled back with her order, so it never existed")
            page = await store.list_dead_letters(DeadLetterFilter(), limit=10, cursor=None)
            echo(f"   dead-lettered ({len(page.items)}), kept for operators:")
            for dead in page.items:
                echo(
                    f"     • {dead.type} key={dead.key} after {dead.attempts} attempts: "
                    f"{dead.failure_reason}"
                )
            echo(
                f"\n   Inspect or replay it: outboxer dlq list --database-url {_url(database)}"
                if workdir is None
                else "\n   (run with --database FILE to keep the database and try 'outboxer dlq')"
            )
    finally:
        if workdir is not None:
            workdir.cleanup()
