"""What every command shares: one readable error line with its documented exit code, and the
store a command opens (docs/operations.md, "Errors and exit codes")."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, NoReturn, TypeVar

import click

from outboxer.config import TableNames
from outboxer.errors import ConfigurationError, NotFound, OutboxerError
from outboxer.ports import AdminStore, DatabaseStore

T = TypeVar("T")

EXIT_USAGE = 2
EXIT_FAILURE = 1


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    click.echo(f"outboxer: error: {message}", err=True)
    sys.exit(code)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine, turning outboxer errors into one line and an exit code."""
    try:
        return asyncio.run(coro)
    except ConfigurationError as exc:
        fail(str(exc), EXIT_USAGE)
    except NotFound as exc:
        fail(str(exc))
    except OutboxerError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail("interrupted", 130)


def table_names(schema: str | None, table: str) -> TableNames:
    try:
        return TableNames(table=table, schema=schema)
    except ConfigurationError as exc:
        fail(str(exc), EXIT_USAGE)


@contextlib.asynccontextmanager
async def open_store(
    url: str, names: TableNames, *, check: bool = True
) -> AsyncIterator[DatabaseStore]:
    from outboxer.stores import store_from_url

    store = store_from_url(url, names)
    async with store:
        if check:
            await store.check_schema()
        yield store


def with_store(action: Callable[[AdminStore], Awaitable[T]], url: str, names: TableNames) -> T:
    async def main() -> T:
        async with open_store(url, names) as store:
            return await action(store)

    return run_async(main())
