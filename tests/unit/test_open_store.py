"""``open_store``: the scheme registry picks the store package; URLs are checked at once."""

from __future__ import annotations

import asyncio

import pytest

from outboxer import urls
from outboxer.errors import ConfigurationError, StoreUnavailable
from outboxer.ports import DatabaseStore
from outboxer.stores import open_store
from outboxer.stores.mysql import MysqlStore
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.postgres.connection import normalize_url
from outboxer.stores.sqlite import SqliteStore


def test_the_scheme_picks_the_store() -> None:
    postgres = open_store("postgresql+asyncpg://app@127.0.0.1/app")
    sqlite = open_store("sqlite:///outbox.db")
    mysql = open_store("mariadb://root@127.0.0.1/test", connections=3)
    assert isinstance(postgres, PostgresStore) and isinstance(sqlite, SqliteStore)
    assert isinstance(mysql, MysqlStore)
    for store in (postgres, sqlite, mysql):
        assert isinstance(store, DatabaseStore)
    assert sqlite.path == "outbox.db"
    absolute = open_store("sqlite:////var/lib/outbox.db")
    assert isinstance(absolute, SqliteStore) and absolute.path == "/var/lib/outbox.db"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("kafka://127.0.0.1:9092", "unsupported database URL kafka://"),
        ("postgresql://app:s3cret@db/app?fsync=off", "unknown option 'fsync'"),
        ("postgresql://app:s3cret@db/app?sslmode=maybe", "sslmode='maybe' is not one of"),
        ("postgresql://app:s3cret@db:70000/app", "port '70000'"),
        ("sqlite://host/outbox.db", "no host is allowed"),
        ("sqlite:///", "a path is required"),
        ("sqlite://user:pw@/x.db", "no host is allowed"),
    ],
)
def test_bad_urls_are_refused_in_one_line_without_the_password(url: str, words: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        open_store(url)
    message = str(caught.value)
    assert words in message and "\n" not in message
    assert "s3cret" not in message and "pw@" not in message


def test_asyncpg_gets_the_declared_options_and_the_timeout_goes_to_the_pool() -> None:
    dsn, timeout, command_timeout = normalize_url(
        "postgres://app:pw@h1,h2:5433/app?application_name=relay%201&connect_timeout=3"
        "&sslmode=require&command_timeout=7"
    )
    assert dsn == "postgresql://app:pw@h1,h2:5433/app?application_name=relay%201&sslmode=require"
    assert (timeout, command_timeout) == (3.0, 7.0)
    assert normalize_url("postgresql:///app") == ("postgresql:///app", 10.0, 60.0)
    assert normalize_url("postgresql:///app?command_timeout=0")[2] is None  # 0: no limit


def test_a_registered_scheme_without_its_store_package_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheme = urls.Scheme("cockroach", "database", "outboxer.stores.cockroach", None)
    monkeypatch.setitem(urls.SCHEMES, "cockroachdb", scheme)
    with pytest.raises(ConfigurationError, match="cockroachdb:// databases are not supported"):
        open_store("cockroachdb://root:s3cret@127.0.0.1/app")


@pytest.mark.parametrize("scheme", ["mysql", "postgresql"])
async def test_a_server_that_accepts_but_never_answers_is_unavailable_after_connect_timeout(
    scheme: str,
) -> None:
    """A hung server, or a proxy or load balancer without a backend, accepts the TCP connection
    and sends nothing. asyncmy's own connect_timeout bounds the TCP connect only, so every
    command against such a MySQL server hung forever."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # held open, never written to

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        store = open_store(f"{scheme}://app:s3cret@127.0.0.1:{port}/app?connect_timeout=0.5")
        with pytest.raises(StoreUnavailable) as caught:
            async with asyncio.timeout(10):
                await store.__aenter__()
        assert accepted, "the server was reached"
        message = str(caught.value)
        assert "s3cret" not in message and message.rstrip().rstrip(":") == message.rstrip()
    finally:
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()
