"""``outboxer dlq``: inspect, replay and purge dead letters."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import click

from outboxer.cli._common import (
    EXIT_USAGE,
    echo_list,
    echo_one,
    fail,
    short,
    store_options,
    with_store,
)
from outboxer.cli.options import (
    database_options,
    filter_options,
    json_option,
    page_options,
    stored_text,
)
from outboxer.errors import OutboxerError
from outboxer.message import printable
from outboxer.ports import (
    AdminStore,
    DeadLetter,
    DeadLetterFilter,
    Direction,
    dead_letter_ids,
    dead_letters_not_found,
    missing_dead_letters,
    replay_skipped,
)


@click.group()
def dlq() -> None:
    """Inspect, replay and purge dead letters."""


def _print_dead_letters(items: list[DeadLetter]) -> None:
    """The human table. Every text came from a message or an error, so it is escaped: a topic
    holding ``\x1b[2J`` must not clear the operator's terminal."""
    header = f"{'ID':36}  {'DIRECTION':9} {'TOPIC':16} {'TYPE':18} {'KEY':12} {'ATT':>3}  REASON"
    click.echo(header)
    for d in items:  # an id may have two: one publish, one consume dead letter
        click.echo(
            f"{printable(d.id):36}  {d.direction:9} {short(d.topic, 16):16} "
            f"{short(d.type or '-', 18):18} {short(d.key or '-', 12):12} {d.attempts:>3}  "
            f"{short(d.failure_reason, 60)}"
        )


def _direction_option(help: str) -> Callable[[Any], Any]:  # noqa: A002 - click's name
    """``--direction``: publish or consume (an id may have a dead letter of each)."""
    return click.option("--direction", type=click.Choice(["publish", "consume"]), help=help)


#: ``--direction`` of list, replay and purge.
direction_option = _direction_option(
    "Only publish or only consume dead letters (an id may have one of each)."
)


@dlq.command("list")
@database_options
@filter_options
@direction_option
@page_options
@json_option
def dlq_list(**values: Any) -> None:
    """List dead letters, newest first."""
    echo_list(values, DeadLetterFilter, lambda store: store.list_dead_letters, _print_dead_letters)


@dlq.command("show")
@database_options
@click.argument("dead_letter_id", callback=stored_text)
@_direction_option("Which of the id's dead letters, when it has both (default: the newer).")
@json_option
def dlq_show(dead_letter_id: str, direction: Direction | None, **values: Any) -> None:
    """One dead letter with payload, reason and attempts."""
    echo_one(values, lambda store: store.get_dead_letter(dead_letter_id, direction))


def _bulk_filter(values: dict[str, Any]) -> DeadLetterFilter:
    """Take the dead-letter IDs, ``--all`` or ``--topic``/``--type``/``--key`` out of a
    command's ``values``: exactly one of them chooses what is acted on; ``--direction`` narrows
    any of them (alone, it chooses every dead letter of that direction)."""
    ids, all_ = values.pop("ids"), values.pop("all_")
    topic, type_, key = values.pop("topic"), values.pop("type_"), values.pop("key")
    direction = values.pop("direction")
    chosen = bool(ids) + all_ + any(v is not None for v in (topic, type_, key))
    if chosen == 0 and direction is not None:
        chosen = 1
    if chosen != 1:
        fail(
            "give dead-letter IDs, or --all, or a filter (--topic/--type/--key/--direction)",
            EXIT_USAGE,
        )
    ids_ = list(ids) if ids else None
    return DeadLetterFilter(topic=topic, type=type_, key=key, ids=ids_, direction=direction)


def _bulk(
    verb: str,
    action: Callable[[AdminStore, DeadLetterFilter], Awaitable[list[str]]],
    flt: DeadLetterFilter,
    values: dict[str, Any],
) -> None:
    """Replay or purge what ``flt`` chooses, on the store of the command's ``values``."""
    database_url, names = store_options(values)
    as_json: bool = values.pop("as_json")
    progress = not as_json and sys.stderr.isatty()

    async def run(store: AdminStore) -> tuple[list[str], list[str], list[str]]:
        """What was done, what a replay skipped, and the ids that name no dead letter."""
        if flt.ids is not None:
            # As the API: an unknown id is refused before anything is done, so a typo in one
            # id never leaves the others replayed or purged and the command exiting 1.
            unknown = await missing_dead_letters(store, flt.ids, flt.direction)
            if unknown:
                return [], [], unknown
        if progress:
            done = await _bulk_in_chunks(store, verb, action, flt)
        else:
            done = await action(store, flt)
        # A replay skips a publish dead letter whose id is in the outbox again (also when
        # the id's consume dead letter was replayed): named, and the command exits 1.
        skipped = await replay_skipped(store, flt) if verb == "replayed" else []
        return done, skipped, sorted(set(flt.ids or ()) - set(done) - set(skipped))

    done, skipped, missing = with_store(run, database_url, names)
    if as_json:
        result: dict[str, Any] = {verb: done, "count": len(done), "not_found": missing}
        if verb == "replayed":
            result["skipped"] = skipped
        click.echo(json.dumps(result, indent=2))
    elif done or not missing:  # (ids refused before anything was done: the error alone)
        click.echo(f"{verb} {len(done)} dead letter(s)")
        for i in done:
            click.echo(f"  {printable(i)}")
    if skipped:
        more = f" (+{len(skipped) - 20} more)" if len(skipped) > 20 else ""
        fail(
            f"not replayed: {', '.join(sorted(skipped)[:20])}{more}: a message with the same id "
            "is in the outbox again; replay once it is published, or purge the dead letter"
            + (f"; {dead_letters_not_found(missing, flt.direction)}" if missing else "")
        )
    if missing:
        fail(str(dead_letters_not_found(missing, flt.direction)))


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
    # Oldest first, as the one-statement replay (its INSERT ... ORDER BY dl_seq): the chunks
    # must not put a key's newer dead letters back in the outbox before its older ones.
    # dead_letter_ids lists newest first, also for given ids (each once, whatever their order).
    ids = list(reversed(await dead_letter_ids(store, flt)))
    label = {"replayed": "replaying", "purged": "purging"}.get(verb, verb)
    done: list[str] = []
    with click.progressbar(
        length=len(ids), label=label, file=sys.stderr, show_pos=True, show_percent=True
    ) as bar:
        for start in range(0, len(ids), BULK_CHUNK):
            chunk = ids[start : start + BULK_CHUNK]
            try:
                chosen = dataclasses.replace(flt, ids=chunk)  # and the filter's fields
                done.extend(await action(store, chosen))
            except OutboxerError as exc:
                raise OutboxerError(
                    f"{exc} ({verb} {len(done)} of {len(ids)} before this failure; run the "
                    "command again to finish)"
                ) from exc
            bar.update(len(chunk))
    return done


@dlq.command("replay")
@database_options
@click.argument("ids", nargs=-1, callback=stored_text)
@click.option("--all", "all_", is_flag=True, help="Every dead letter.")
@filter_options
@direction_option
@json_option
def dlq_replay(**values: Any) -> None:
    """Move dead letters back to the outbox (same id, attempts reset)."""
    flt = _bulk_filter(values)
    _bulk("replayed", lambda s, f: s.replay_dead_letters(f), flt, values)


@dlq.command("purge")
@database_options
@click.argument("ids", nargs=-1, callback=stored_text)
@click.option("--all", "all_", is_flag=True, help="Every dead letter.")
@filter_options
@direction_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def dlq_purge(yes: bool, **values: Any) -> None:
    """Delete dead letters for good."""
    flt = _bulk_filter(values)
    if not yes and not click.confirm("Delete the matching dead letters for good?", err=True):
        fail("nothing deleted")
    _bulk("purged", lambda s, f: s.purge_dead_letters(f), flt, values)
