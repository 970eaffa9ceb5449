"""The example shop (examples/django_shop): a customer registers and orders (sync and async
views); after the commit, the relay sends the welcome and confirmation e-mails; an order that
fails sends nothing. On PostgreSQL (alias ``default``), SQLite (``other``) and MariaDB.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core import mail
from django.db import connections
from django.test import AsyncClient, Client, override_settings

from tests.acceptance.conftest import PYTHONPATH
from tests.django.conftest import EXAMPLE, relay_until_empty

ALIASES = ["default", "other", "mariadb"]


async def order_async(email: str, item: str, quantity: int) -> Any:
    """POST to the async view, as an ASGI server would call it."""
    body = {"email": email, "item": item, "quantity": quantity}
    try:
        return await AsyncClient().post("/async/orders", body, content_type="application/json")
    finally:
        # sync_to_async ran the transaction in asgiref's thread for sync code, whose
        # connections stay open (as in a server) until closed there
        await sync_to_async(connections.close_all)()


@pytest.fixture(params=ALIASES)
def shop(request: pytest.FixtureRequest) -> object:
    with override_settings(
        SHOP_ORDERS_DATABASE=request.param, OUTBOXER={"DATABASE": request.param}
    ):
        yield request.param


@pytest.mark.django_db(databases=ALIASES, transaction=True)
def test_a_customer_gets_a_welcome_and_a_confirmation_per_order(shop: str) -> None:
    client = Client()
    registered = client.post(
        "/customers", {"email": "ann@example.com", "name": "Ann"}, content_type="application/json"
    )
    assert registered.status_code == 201
    ordered = client.post(
        "/orders",
        {"email": "ann@example.com", "item": "tea", "quantity": 2},
        content_type="application/json",
    )
    assert ordered.status_code == 201
    ordered_async = asyncio.run(order_async("ann@example.com", "coffee", 1))
    assert ordered_async.status_code == 201
    with pytest.raises(KeyError):  # no such item: the order and its event roll back together
        client.post(
            "/orders",
            {"email": "ann@example.com", "item": "cake", "quantity": 1},
            content_type="application/json",
        )
    assert mail.outbox == []  # nothing is sent before the relay publishes

    relay_until_empty()

    assert [(m.to, m.subject) for m in mail.outbox] == [
        (["ann@example.com"], "Welcome to the shop"),
        (["ann@example.com"], f"Order {ordered.json()['order']} confirmed"),
        (["ann@example.com"], f"Order {ordered_async.json()['order']} confirmed"),
    ]
    assert "2 × tea, 9.00 EUR." in mail.outbox[1].body


def test_manage_py_outboxer_relay_sends_the_mails(tmp_path: Path) -> None:
    # The project as its README runs it: migrate, write, `manage.py outboxer relay`, SIGTERM.
    mails = tmp_path / "mails"
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join([PYTHONPATH, str(EXAMPLE)]),
        "SHOP_DATABASE": f"sqlite:///{tmp_path / 'shop.sqlite3'}",
        "SHOP_EMAIL_DIR": str(mails),
    }

    def manage(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(EXAMPLE / "manage.py"), *args],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def run(*args: str) -> str:
        process = manage(*args)
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        return out

    run("migrate", "--verbosity", "0")
    run(
        "shell",
        "-c",
        "from orders.views import register_customer; register_customer('bo@example.com', 'Bo')",
    )
    relay = manage("outboxer", "relay")
    try:
        deadline = time.monotonic() + 60
        while not (mails.exists() and any(mails.iterdir())):
            assert relay.poll() is None, relay.communicate()[1]
            assert time.monotonic() < deadline, "no mail within 60 s"
            time.sleep(0.1)
        relay.send_signal(signal.SIGTERM)
        relay.communicate(timeout=30)
    finally:
        relay.kill()
    assert relay.returncode == 0
    [sent] = [path.read_text() for path in mails.iterdir()]
    assert "To: bo@example.com" in sent and "Subject: Welcome to the shop" in sent
    assert '"pending": 0' in run("outboxer", "stats", "--json")


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ({"TABLE": "bad name"}, "invalid table name 'bad name'"),
        ({"TABLE": ["x"]}, "OUTBOXER['TABLE'] must be a string"),
        ({"DATABASE": "nope"}, "OUTBOXER['DATABASE'] 'nope' is not in DATABASES"),
        ({"TOPICS": ["orders", "two words"]}, "a list item must be a non-empty word"),
    ],
)
def test_a_bad_outboxer_setting_is_one_line_for_every_command(
    tmp_path: Path, setting: dict[str, Any], words: str
) -> None:
    """Found by a probe: the models' table names were worked out while django.setup()
    imported them, so a bad TABLE or DATABASE was a traceback from every manage.py command.
    Now ``manage.py outboxer`` says it in one line (exit 2) and Django's system check refuses
    it for the others (``check``, ``migrate``, ``runserver``)."""
    (tmp_path / "bad_settings.py").write_text(
        f"from shop.settings import *  # noqa: F403\nOUTBOXER = {setting!r}\n"
    )
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join([PYTHONPATH, str(EXAMPLE), str(tmp_path)]),
        "SHOP_DATABASE": f"sqlite:///{tmp_path / 'shop.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "bad_settings",
    }

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(EXAMPLE / "manage.py"), *args],
            env=env, text=True, capture_output=True, timeout=120,
        )  # fmt: skip

    stats = manage("outboxer", "stats")
    assert stats.returncode == 2, stats.stderr
    [line] = stats.stderr.splitlines()
    assert line.startswith("manage.py outboxer: error: ") and words in line
    if "TOPICS" not in setting:  # a command's option: the check has no say in it
        for command in ("check", "migrate"):
            refused = manage(command)
            assert refused.returncode != 0 and "Traceback" not in refused.stderr
            assert "(outboxer.E001)" in refused.stderr and words in refused.stderr


def test_a_project_with_its_own_table_and_settings_option(tmp_path: Path) -> None:
    """Found by a probe: ``--settings`` (every management command takes it) was refused by
    ``manage.py outboxer``; with a TABLE of the project's own, ``makemigrations --check``
    found a change in outboxer's migrations (their dead-letter table was outbox's) and wrote a
    migration into the installed package; ``sqlmigrate`` printed no DDL."""
    (tmp_path / "own_table.py").write_text(
        "from shop.settings import *  # noqa: F403\nOUTBOXER = {'TABLE': 'shop_events'}\n"
    )
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join([PYTHONPATH, str(EXAMPLE), str(tmp_path)]),
        "SHOP_DATABASE": f"sqlite:///{tmp_path / 'shop.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "shop.settings",  # overridden by --settings below
    }

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(EXAMPLE / "manage.py"), *args, "--settings=own_table"],
            env=env, text=True, capture_output=True, timeout=120,
        )  # fmt: skip

    assert manage("migrate").returncode == 0
    unchanged = manage("makemigrations", "--check", "--dry-run", "outboxer")
    assert unchanged.returncode == 0 and "No changes detected" in unchanged.stdout
    stats = manage("outboxer", "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert '"pending": 0' in stats.stdout
    sql = manage("sqlmigrate", "outboxer", "0001")
    assert sql.returncode == 0, sql.stderr
    assert "CANNOT BE WRITTEN" not in sql.stdout
    assert 'CREATE TABLE "shop_events"' in sql.stdout
    assert 'CREATE TABLE "shop_events_dead_letters"' in sql.stdout
    later = manage("sqlmigrate", "outboxer", "0005")  # the statements of version 8 alone
    assert "version 8" in later.stdout and 'CREATE TABLE "shop_events" (' not in later.stdout


def test_list_settings_are_the_words_of_their_variable() -> None:
    """``TOPICS``/``ALLOWED_HOSTS`` as lists reached the command as Python's text of the list
    (a consumer of the streams "['orders'," and "'users']": a probe)."""
    from outboxer.integrations.django.conf import environment

    with override_settings(OUTBOXER={"TOPICS": ["orders", "users"], "ALLOWED_HOSTS": ("a.b",)}):
        env = environment("other")
    assert (env["OUTBOXER_TOPICS"], env["OUTBOXER_ALLOWED_HOSTS"]) == ("orders users", "a.b")
