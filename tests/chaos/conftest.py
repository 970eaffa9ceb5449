"""Chaos tests run real relay processes and are marked ``chaos``: ``make test`` runs them after
the parallel part, one at a time, because two of them restart PostgreSQL and MariaDB."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/chaos/" in str(item.fspath):
            item.add_marker(pytest.mark.chaos)
