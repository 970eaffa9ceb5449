"""What ``enqueue`` adds to a Django view's transaction, on PostgreSQL.

One Django connection commits N transactions of the example shop (examples/django_shop): an
``Order.objects.create`` alone, then the same with the ``OrderPlaced`` event enqueued in the
same ``transaction.atomic()`` (a dataclass payload, a key, a type), through
``outboxer.integrations.django.enqueue`` (the configured outbox) and through
``outboxer.enqueue(connection, ...)``. Interleaved in rounds so a noisy neighbour hurts every
variant alike; the median round is reported. With synchronous commit on, as in production, then
off (the commit's fsync left out: the cost of the statements alone); psycopg 3 under Django, a
database created for the run and dropped after it.

Run: ``.venv/bin/python -m benchmarks.django_overhead``
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.common import PG_URL, save

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "django_shop"
N = 1000
ROUNDS = 5


def setup_django(database: str) -> None:
    sys.path.insert(0, str(EXAMPLE))
    os.environ["SHOP_DATABASE"] = f"{PG_URL.rsplit('/', 1)[0]}/{database}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "shop.settings"
    os.environ["SHOP_DEBUG"] = "0"  # DEBUG keeps every query in memory
    from django.core.management import call_command

    import django

    django.setup()
    call_command("migrate", verbosity=0)


def variants() -> dict[str, Callable[[int], None]]:
    from django.db import connection, transaction
    from orders.events import OrderPlaced
    from orders.models import Customer, Order

    import outboxer
    from outboxer.integrations.django import enqueue

    customer = Customer.objects.create(email="bench@example.com", name="Bench")

    def order(n: int) -> Order:
        return Order.objects.create(
            customer=customer, item="tea", quantity=n % 5 + 1, total_cents=450
        )

    def event(o: Order) -> OrderPlaced:
        return OrderPlaced(o.pk, customer.email, o.item, o.quantity, o.total_cents)

    def alone(n: int) -> None:
        with transaction.atomic():
            order(n)

    def with_enqueue(n: int) -> None:
        with transaction.atomic():
            o = order(n)
            enqueue("orders", event(o), key=customer.pk, type="OrderPlaced")

    def with_plain_enqueue(n: int) -> None:
        with transaction.atomic():
            o = order(n)
            outboxer.enqueue(connection, "orders", event(o), key=customer.pk, type="OrderPlaced")

    return {
        "create alone": alone,
        "create + integrations.django.enqueue": with_enqueue,
        "create + outboxer.enqueue(connection)": with_plain_enqueue,
    }


def measure(runs: dict[str, Callable[[int], None]]) -> dict[str, Any]:
    """Median seconds per transaction of each variant, interleaved over the rounds."""
    timings: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(ROUNDS):
        for name, transaction_ in runs.items():
            started = time.perf_counter()
            for n in range(N):
                transaction_(n)
            timings[name].append((time.perf_counter() - started) / N)
    base = statistics.median(timings["create alone"])
    result: dict[str, Any] = {}
    for name, seconds in timings.items():
        per_tx = statistics.median(seconds)
        result[name] = {
            "tx_per_s": round(1 / per_tx),
            "us_per_tx": round(per_tx * 1e6),
            "added_us": round((per_tx - base) * 1e6),
            "time_ratio": round(per_tx / base, 3),
        }
        print(
            f"  {name:40} {1 / per_tx:7.0f} tx/s  {per_tx * 1e6:6.0f} µs/tx  "
            f"+{(per_tx - base) * 1e6:4.0f} µs  ×{per_tx / base:.2f}"
        )
    return result


def main() -> dict[str, Any]:
    database = f"bench_django_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')  # type: ignore[arg-type]
    result: dict[str, Any] = {"transactions": N, "rounds": ROUNDS}
    try:
        setup_django(database)
        from django.db import connection, connections

        runs = variants()
        # Production settings first; then without waiting for the commit's fsync, which on a
        # shared VM dominates and varies: what is left is the cost of the statements themselves.
        for mode, synchronous_commit in (("synchronous_commit", "on"), ("no_commit_wait", "off")):
            print(f"synchronous_commit = {synchronous_commit}")
            with connection.cursor() as cursor:
                cursor.execute(f"SET synchronous_commit TO {synchronous_commit}")
            result[mode] = measure(runs)
        connections.close_all()
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}"')  # type: ignore[arg-type]
    save("django_overhead", result)
    return result


if __name__ == "__main__":
    main()
