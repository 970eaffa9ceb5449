"""The store contract against the in-memory fake users get in ``outboxer.testing``."""

from __future__ import annotations

from typing import Any

import pytest

from outboxer.testing import InMemoryStore
from tests.contracts.store import StoreContract


class TestInMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> InMemoryStore:
        return InMemoryStore()

    @pytest.fixture
    def add(self, store: InMemoryStore) -> Any:
        async def add(topic: str, payload: object, **options: Any) -> str:
            return store.enqueue(topic, payload, **options)

        return add
