"""What every command shares: one readable, redacted error line with its documented exit code
(docs/operations.md, "Errors and exit codes"), and the store a command opens."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, NoReturn, Protocol, TypeVar

import click

from outboxer.config import TableNames
from outboxer.errors import ConfigurationError, OutboxerError
from outboxer.message import printable
from outboxer.ports import AdminStore, DatabaseStore
from outboxer.urls import redact

T = TypeVar("T")
F = TypeVar("F", contravariant=True)


class Listing(Protocol[F]):
    """A store's ``list_…`` method (dead letters, messages)."""

    def __call__(self, flt: F, /, *, limit: int, cursor: str | None) -> Awaitable[Any]: ...


EXIT_USAGE = 2  # invalid usage or configuration: bad URL, name or option
EXIT_FAILURE = 1  # a runtime failure: database unreachable, schema missing, unknown dead letter
EXIT_INTERRUPTED = 130

log = logging.getLogger("outboxer.cli")


def short(text: str, width: int) -> str:
    """``text`` escaped (see :func:`printable`) and cut to ``width`` characters for a table."""
    text = printable(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def echo_list(
    values: dict[str, Any],
    make_filter: Callable[..., F],
    listing: Callable[[AdminStore], Listing[F]],
    print_items: Callable[[list[Any]], None],
) -> None:
    """A ``list`` command (dead letters, messages): the page ``listing`` reads with the filter
    of the command's options (``--topic``/``--type``/``--key`` and those the command adds),
    ``--limit`` and ``--cursor``, printed by :func:`echo_page`.

    Args:
        values: The command's parsed options, every one of them.
        make_filter: The filter class, given the filter options by name.
        listing: The store's method that reads a page.
        print_items: Prints the human table of a page's items.
    """
    url, names = store_options(values)
    limit, cursor, as_json = values.pop("limit"), values.pop("cursor"), values.pop("as_json")
    flt = make_filter(type=values.pop("type_"), **values)
    page = with_store(lambda store: listing(store)(flt, limit=limit, cursor=cursor), url, names)
    echo_page(page, as_json, print_items)


def echo_one(values: dict[str, Any], lookup: Callable[[AdminStore], Awaitable[Any]]) -> None:
    """A ``show`` command: the item ``lookup`` reads, printed by :func:`echo_fields`."""
    url, names = store_options(values)
    echo_fields(with_store(lookup, url, names), values.pop("as_json"))


def store_options(values: dict[str, Any]) -> tuple[str, TableNames]:
    """Take ``--database-url``, ``--schema`` and ``--table`` out of a command's ``values``: the
    database URL and the outbox's table names."""
    url: str = values.pop("database_url")
    return url, TableNames(table=values.pop("table"), schema=values.pop("schema"))


def echo_page(page: Any, as_json: bool, print_items: Callable[[list[Any]], None]) -> None:
    """A list page (dead letters, messages): its JSON (``{"items", "next_cursor"}``, as the
    admin API), or the human table and how to go on."""
    if as_json:
        body = {"items": [i.to_json() for i in page.items], "next_cursor": page.next_cursor}
        click.echo(json.dumps(body, indent=2))
        return
    print_items(list(page.items))
    if page.next_cursor:
        click.echo(f"more: --cursor {page.next_cursor}")


def echo_fields(item: Any, as_json: bool) -> None:
    """One item (``show``): its JSON, or one ``name value`` line per field."""
    body = item.to_json()
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    for name, value in body.items():
        # JSON escapes control characters itself; plain text is escaped here.
        shown = json.dumps(value) if isinstance(value, dict | list) else printable(str(value))
        click.echo(f"{name:17} {shown}")


#: After a stop signal, how long a process may take beyond its own shutdown timeout.
STOP_GRACE = 5.0


def stop_on_signals(stop: Callable[[], None], deadline: float, what: str) -> None:
    """SIGTERM/SIGINT call ``stop`` on the running loop; the process must then end within
    ``deadline`` seconds. A handler that swallows its cancellation, or blocks the event loop
    (where asyncio's own signal handling would never even run ``stop``), kept a consumer alive
    for good, deaf to every further signal (found by a probe): past the deadline, or at a second
    signal, the process exits at once, status 1, saying so. What it had in progress was not
    acknowledged: the broker delivers it again. The handler is Python's, run between two
    bytecodes of the main thread, and the deadline a daemon thread's."""
    loop = asyncio.get_running_loop()
    signalled = threading.Event()

    def force(reason: str) -> None:
        sys.stderr.write(
            f"outboxer: error: {what} {reason}; exiting now: what it had in progress was not "
            "acknowledged and will be delivered again\n"
        )
        sys.stderr.flush()
        os._exit(EXIT_FAILURE)

    def on_signal(signum: int, frame: object) -> None:
        if signalled.is_set():
            force("got a second signal while stopping")
        signalled.set()
        with contextlib.suppress(RuntimeError):  # the loop closed: the work is over already
            loop.call_soon_threadsafe(stop)
        late = f"did not stop within {deadline:g} s of the signal (a handler ignores its "
        late += "cancellation or blocks the event loop)"
        timer = threading.Timer(deadline, force, args=(late,))
        timer.daemon = True
        timer.start()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Print ``outboxer: error: <message>`` on one line, passwords masked, and exit."""
    line = printable(" ".join(redact(message).split())) or "unknown error"
    click.echo(f"outboxer: error: {line}", err=True)
    sys.exit(code)


@contextlib.contextmanager
def errors_as_one_line() -> Iterator[None]:
    """Whatever a command raises ends as one line and an exit code, never a traceback.

    An exception outboxer did not expect (a driver's, a bug) is exit 1 with its type and
    message; its traceback is logged at DEBUG (``--log-level DEBUG``), redacted like every log
    line.
    """
    try:
        yield
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "outboxer"
        fail(f"{exc.format_message()} (see '{where} --help')", EXIT_USAGE)
    except click.Abort as exc:
        # click turns a KeyboardInterrupt (Ctrl-C, SIGINT) into Abort when not standalone.
        if isinstance(exc.__cause__, KeyboardInterrupt):
            fail("interrupted", EXIT_INTERRUPTED)
        fail("aborted")
    except click.ClickException as exc:
        fail(exc.format_message(), exc.exit_code)
    except ConfigurationError as exc:
        fail(str(exc), EXIT_USAGE)
    except OutboxerError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail("interrupted", EXIT_INTERRUPTED)
    except Exception as exc:
        log.debug("unexpected error", exc_info=True)
        fail(f"unexpected {type(exc).__name__}: {exc}")


def _unreadable_url(url: str, exc: Exception) -> ConfigurationError:
    """A driver's ``ValueError`` about the URL (bad port, broken IPv6 address, a ``/`` in the
    password) as a configuration error. The driver quotes what it could not read, which may
    be a piece of the password: quoted pieces of the URL's user information are masked."""
    userinfo = url.partition("://")[2].rpartition("@")[0]
    reason = re.sub(
        r"'([^']*)'",
        lambda m: "'***'" if userinfo and m.group(1) and m.group(1) in userinfo else m.group(0),
        str(exc),
    )
    hint = " (percent-encode '/', '@' and ':' in a user name or password)" if userinfo else ""
    return ConfigurationError(f"invalid database URL {redact(url)}: {reason}{hint}")


@contextlib.asynccontextmanager
async def open_store(
    url: str,
    names: TableNames,
    *,
    check: bool = True,
    connections: int | None = None,
) -> AsyncIterator[DatabaseStore]:
    """The store of ``url`` (the scheme's store, with at most ``connections`` connections
    where it has a pool), open and, with ``check``, its schema checked; a URL the driver cannot
    read is a ``ConfigurationError``."""
    from outboxer.stores import open_store as store_for

    async with contextlib.AsyncExitStack() as stack:
        try:
            store = store_for(url, names, connections=connections)
            await stack.enter_async_context(store)
        except ConfigurationError:
            raise
        except (ValueError, OverflowError) as exc:
            raise _unreadable_url(url, exc) from exc
        if check:
            await store.check_schema()
        yield store


def with_store(action: Callable[[AdminStore], Awaitable[T]], url: str, names: TableNames) -> T:
    async def main() -> T:
        async with open_store(url, names) as store:
            return await action(store)

    return asyncio.run(main())
