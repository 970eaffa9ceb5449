"""Django for the tests of this folder only: the example shop (examples/django_shop) with its
orders and the outbox on PostgreSQL (alias ``default``), SQLite (``other``) and MariaDB
(``mariadb``).

pytest-django is installed for the whole suite but does nothing until Django's settings are
configured, which happens here, when this folder is collected: the other tests see no Django
(no DJANGO_SETTINGS_MODULE, no environment variable left behind). pytest-django creates a test
database per alias (with the xdist worker's suffix) and drops it at the end; the PostgreSQL
one has a name unique to this run.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import logging
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

import django
from tests.conftest import PG_URL, require_service

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "django_shop"


def _configure() -> None:
    if settings.configured:
        return
    sys.path.insert(0, str(EXAMPLE))
    server = PG_URL.rsplit("/", 1)[0]
    files = tempfile.mkdtemp(prefix="shop-")  # the SQLite database and its test twin
    atexit.register(shutil.rmtree, files, True)
    environment = {
        "SHOP_DATABASE": f"{server}/shop_{uuid.uuid4().hex[:8]}",
        "SHOP_OTHER_DATABASE": f"sqlite:///{files}/other.sqlite3",
    }
    os.environ.update(environment)
    try:
        module = importlib.import_module("shop.settings")
    finally:
        for name in environment:
            os.environ.pop(name)
    values = {name: getattr(module, name) for name in dir(module) if name.isupper()}
    # MariaDB too, as a third database (the example itself runs on one)
    values["DATABASES"]["mariadb"] = {
        "ENGINE": "django.db.backends.mysql",
        "NAME": f"shop_{uuid.uuid4().hex[:8]}",
        "USER": "root",
        "HOST": "127.0.0.1",
        "PORT": "3306",
    }
    settings.configure(**values)
    django.setup()


_configure()


def _tolerate_a_missing_sqlite_test_file() -> None:
    """pytest-django drops every alias's test database when a worker's session ends; the SQLite
    file of the ``other`` alias is created lazily, and a CI run once found it gone at that point
    (the teardown then failed the last test of the worker, whatever it was). Removing a file
    that is not there is not a failure of anything under test."""
    from django.db.backends.sqlite3.creation import DatabaseCreation

    destroy = DatabaseCreation._destroy_test_db

    def destroy_if_present(self: DatabaseCreation, name: str, verbosity: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            destroy(self, name, verbosity)

    DatabaseCreation._destroy_test_db = destroy_if_present  # type: ignore[method-assign]


_tolerate_a_missing_sqlite_test_file()


def relay_until_empty(alias: str | None = None) -> None:
    """What ``manage.py outboxer relay`` does (the shop's in-process handlers), until the outbox
    of ``alias`` (default: ``OUTBOXER["DATABASE"]``) is empty."""
    from outboxer.brokers.inprocess.publisher import InProcessPublisher
    from outboxer.config import RelaySettings
    from outboxer.integrations.django import database_url, outbox
    from outboxer.relay import Relay
    from outboxer.stores import open_store

    async def drain() -> None:
        async with (
            open_store(database_url(alias), outbox().names) as store,
            InProcessPublisher.from_url("inprocess://shop.handlers:registry") as publisher,
        ):
            settings = RelaySettings(poll_interval=0.05, min_poll_interval=0.01)
            await Relay(store, publisher, settings).drain(timeout=60)

    asyncio.run(drain())


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings: None) -> None:
    """Runs before pytest-django creates the test databases (pytest-django's own fixture, the
    xdist suffix, first): a stopped PostgreSQL or MariaDB fails each test with the command that
    starts it, instead of a driver's connection error."""
    require_service("PostgreSQL", "127.0.0.1", 5432)
    require_service("MariaDB", "127.0.0.1", 3306)


@pytest.fixture(autouse=True)
def _empty_outbox(request: pytest.FixtureRequest) -> Iterator[None]:
    """Empty outboxer's tables after a database test: Django's flush empties only the tables of
    its managed models, and the outbox is not one."""
    yield
    marker = request.node.get_closest_marker("django_db")
    if marker is None:
        return
    from django.db import connections

    for alias in marker.kwargs.get("databases", ["default"]):
        with connections[alias].cursor() as cursor:
            for suffix in ("", "_dead_letters", "_relays", "_sweeps"):
                cursor.execute(
                    f"DELETE FROM {connections[alias].ops.quote_name(f'outbox{suffix}')}"
                )


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """``manage.py outboxer`` configures the process's logging, as the ``outboxer`` command
    does; called in a test, its handler would write to pytest's captured (then closed) stderr."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
