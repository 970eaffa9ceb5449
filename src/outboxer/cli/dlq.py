"""``outboxer dlq``: inspect, replay and purge dead letters."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable

import click

from outboxer.cli._common import (
    EXIT_USAGE,
    echo_fields,
    echo_page,
    fail,
    printable,
    short,
    with_store,
)
from outboxer.cli.options import database_options, filter_options, json_option, page_options
from outboxer.config import TableNames
from outboxer.errors import OutboxerError
from outboxer.ports import AdminStore, DeadLetter, DeadLetterFilter


@click.group()
def dlq() -> None:
    """Inspect, replay and purge dead letters."""


def _print_dead_letters(items: list[DeadLetter]) -> None:
    """The human table. Every text came from a message or an error, so it is escaped: a topic
    holding ``\x1b[2J`` must not clear the operator's terminal."""
    header = f"{'ID':36}  {'TOPIC':16} {'TYPE':18} {'KEY':12} {'ATT':>3}  REASON"
    click.echo(header)
    for d in items:
        click.echo(
            f"{printable(d.id):36}  {short(d.topic, 16):16} {short(d.type or '-', 18):18} "
            f"{short(d.key or '-', 12):12} {d.attempts:>3}  {short(d.failure_reason, 60)}"
        )


@dlq.command("list")
@database_options
@filter_options
@page_options
@json_option
def dlq_list(
    database_url: str,
    schema: str | None,
    table: str,
    topic: str | None,
    type_: str | None,
    key: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """List dead letters, newest first."""
    flt = DeadLetterFilter(topic=topic, type=type_, key=key)
    names = TableNames(table=table, schema=schema)
    page = with_store(
        lambda store: store.list_dead_letters(flt, limit=limit, cursor=cursor), database_url, names
    )
    echo_page(page, as_json, _print_dead_letters)


@dlq.command("show")
@database_options
@click.argument("dead_letter_id")
@json_option
def dlq_show(
    database_url: str, schema: str | None, table: str, dead_letter_id: str, as_json: bool
) -> None:
    """One dead letter with payload, reason and attempts."""
    names = TableNames(table=table, schema=schema)
    dead = with_store(lambda store: store.get_dead_letter(dead_letter_id), database_url, names)
    echo_fields(dead, as_json)


def _bulk_filter(
    ids: tuple[str, ...], all_: bool, topic: str | None, type_: str | None, key: str | None
) -> DeadLetterFilter:
    chosen = bool(ids) + all_ + any(v is not None for v in (topic, type_, key))
    if chosen != 1:
        fail("give dead-letter IDs, or --all, or a filter (--topic/--type/--key)", EXIT_USAGE)
    return DeadLetterFilter(topic=topic, type=type_, key=key, ids=list(ids) if ids else None)


def _bulk(
    verb: str,
    action: Callable[[AdminStore, DeadLetterFilter], Awaitable[list[str]]],
    database_url: str,
    names: TableNames,
    flt: DeadLetterFilter,
    as_json: bool,
) -> None:
    progress = not as_json and sys.stderr.isatty()

    async def run(store: AdminStore) -> tuple[list[str], set[str]]:
        if progress:
            done = await _bulk_in_chunks(store, verb, action, flt)
        else:
            done = await action(store, flt)
        missing = sorted(set(flt.ids or ()) - set(done))
        if not missing or verb != "replayed":
            return done, set()
        # A replay skips a dead letter whose id is in the outbox again: it still exists.
        page = await store.list_dead_letters(
            DeadLetterFilter(ids=missing), limit=len(missing), cursor=None
        )
        return done, {d.id for d in page.items}

    done, skipped = with_store(run, database_url, names)
    missing = sorted(set(flt.ids or ()) - set(done) - skipped)
    if as_json:
        click.echo(json.dumps({verb: done, "count": len(done), "not_found": missing}, indent=2))
    else:
        click.echo(f"{verb} {len(done)} dead letter(s)")
        for i in done:
            click.echo(f"  {printable(i)}")
    if skipped:
        fail(
            f"not replayed: {', '.join(sorted(skipped))}: a message with the same id is in the "
            "outbox again; replay once it is published, or purge the dead letter"
            + (f"; no dead letter with id {', '.join(missing)}" if missing else "")
        )
    if missing:
        fail(f"no dead letter with id {', '.join(missing)}")


#: Dead letters per statement when bulk replay/purge shows a progress bar.
BULK_CHUNK = 500


async def _bulk_in_chunks(
    store: AdminStore,
    verb: str,
    action: Callable[[AdminStore, DeadLetterFilter], Awaitable[list[str]]],
    flt: DeadLetterFilter,
) -> list[str]:
    """Bulk replay/purge with a progress bar on stderr (a terminal, no ``--json``).

    The store acts on a filter in one statement, which cannot report progress; so the matching
    ids are listed first and acted on in chunks of :data:`BULK_CHUNK`, each chunk in one
    statement (all or nothing). Dead letters added after the listing are left for the next
    run. If a chunk fails, the error says how many were done before it; running the command
    again finishes the rest (replayed/purged ones no longer match).
    """
    if flt.ids is not None:
        ids = list(dict.fromkeys(flt.ids))
    else:
        ids, cursor = [], None
        while True:
            page = await store.list_dead_letters(flt, limit=1000, cursor=cursor)
            ids.extend(d.id for d in page.items)
            cursor = page.next_cursor
            if cursor is None:
                break
    label = {"replayed": "replaying", "purged": "purging"}.get(verb, verb)
    done: list[str] = []
    with click.progressbar(
        length=len(ids), label=label, file=sys.stderr, show_pos=True, show_percent=True
    ) as bar:
        for start in range(0, len(ids), BULK_CHUNK):
            chunk = ids[start : start + BULK_CHUNK]
            try:
                done.extend(await action(store, DeadLetterFilter(ids=chunk)))
            except OutboxerError as exc:
                raise OutboxerError(
                    f"{exc} ({verb} {len(done)} of {len(ids)} before this failure; run the "
                    "command again to finish)"
                ) from exc
            bar.update(len(chunk))
    return done


@dlq.command("replay")
@database_options
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every dead letter.")
@filter_options
@json_option
def dlq_replay(
    database_url: str,
    schema: str | None,
    table: str,
    ids: tuple[str, ...],
    all_: bool,
    topic: str | None,
    type_: str | None,
    key: str | None,
    as_json: bool,
) -> None:
    """Move dead letters back to the outbox (same id, attempts reset)."""
    flt = _bulk_filter(ids, all_, topic, type_, key)
    names = TableNames(table=table, schema=schema)
    _bulk("replayed", lambda s, f: s.replay_dead_letters(f), database_url, names, flt, as_json)


@dlq.command("purge")
@database_options
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every dead letter.")
@filter_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def dlq_purge(
    database_url: str,
    schema: str | None,
    table: str,
    ids: tuple[str, ...],
    all_: bool,
    topic: str | None,
    type_: str | None,
    key: str | None,
    yes: bool,
    as_json: bool,
) -> None:
    """Delete dead letters for good."""
    flt = _bulk_filter(ids, all_, topic, type_, key)
    if not yes and not click.confirm("Delete the matching dead letters for good?", err=True):
        fail("nothing deleted")
    names = TableNames(table=table, schema=schema)
    _bulk("purged", lambda s, f: s.purge_dead_letters(f), database_url, names, flt, as_json)
