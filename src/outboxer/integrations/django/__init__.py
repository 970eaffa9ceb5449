"""The outbox in a Django project: ``INSTALLED_APPS = [..., "outboxer.integrations.django"]``.

The app brings

- migrations creating the outbox tables, the schema ``outboxer db upgrade`` builds (both run the
  statements of :mod:`outboxer.stores.ddl`), on every database ``migrate`` runs on;
- ``manage.py outboxer relay|consume|stats|dlq|messages ...``: the ``outboxer`` command with the
  database URL taken from ``DATABASES`` and options from the ``OUTBOXER`` setting;
- the dead letters in the Django admin, with replay and delete actions;
- :func:`enqueue` / :func:`enqueue_many`: ``outboxer.enqueue`` on ``connections[using]`` with
  the table and schema of the ``OUTBOXER`` setting.

``outboxer.enqueue(connection, ...)`` works as well (the default table): Django's connections
are known to the write API (:mod:`outboxer.writers.django`). Settings (all optional)::

    OUTBOXER = {
        "DATABASE": "default",     # the alias the commands and the admin use
        "TABLE": "outbox",
        "SCHEMA": None,            # PostgreSQL schema (a database on MySQL)
        "BROKER": "kafka://kafka:9092",
        # any other option of the outboxer command, by its OUTBOXER_* variable's name:
        "BATCH_SIZE": 200,
    }

Nothing here is imported by outboxer's core; Django is imported when this app is used.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from outboxer.integrations.django.conf import database_url, outbox, outbox_on

__all__ = ["database_url", "enqueue", "enqueue_many", "outbox"]


def enqueue(topic: str, payload: object, *, using: str | None = None, **options: Any) -> str:
    """``outboxer.enqueue`` on ``connections[using]`` (default: ``OUTBOXER["DATABASE"]``) in
    the configured outbox: call it inside ``transaction.atomic(using=...)``."""
    from django.db import connections

    alias = using or outbox().database
    return outbox_on(alias).enqueue(connections[alias], topic, payload, **options)


def enqueue_many(messages: Iterable[Mapping[str, Any]], *, using: str | None = None) -> list[str]:
    """``outboxer.enqueue_many`` on ``connections[using]``, as :func:`enqueue`."""
    from django.db import connections

    alias = using or outbox().database
    return outbox_on(alias).enqueue_many(connections[alias], messages)
