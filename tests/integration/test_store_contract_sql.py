"""The store contract against real SQLite and PostgreSQL, writing through ``enqueue``."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from outboxer.outbox import Outbox
from outboxer.stores.postgres import PostgresStore
from outboxer.stores.sqlite import SqliteStore
from tests.conftest import wait_past_commit_gate
from tests.contracts.store import StoreContract


class TestSqliteStore(StoreContract):
    @pytest.fixture
    def store(self, sqlite_store: SqliteStore) -> SqliteStore:
        return sqlite_store

    @pytest.fixture
    def add(self, sqlite_store: SqliteStore, sqlite_path: Path) -> Any:
        async def add(topic: str, payload: object, **options: Any) -> str:
            conn = sqlite3.connect(sqlite_path)
            try:
                with conn:
                    return Outbox().enqueue(conn, topic, payload, **options)
            finally:
                conn.close()

        return add


class TestPostgresStore(StoreContract):
    @pytest.fixture
    def store(self, pg_store: PostgresStore) -> PostgresStore:
        return pg_store

    @pytest.fixture
    def add(self, pg_store: PostgresStore, pg_url: str, pg_schema: str) -> Any:
        outbox = Outbox(schema=pg_schema)

        async def add(topic: str, payload: object, **options: Any) -> str:
            conn = await asyncpg.connect(pg_url)
            try:
                async with conn.transaction():
                    message_id = await outbox.enqueue_async(conn, topic, payload, **options)
            finally:
                await conn.close()
            await wait_past_commit_gate(pg_store)
            return message_id

        return add
