"""``outboxer messages``: the messages not yet published, and where each one stands."""

from __future__ import annotations

from typing import Any, get_args

import click

from outboxer.cli._common import echo_list, echo_one, short
from outboxer.cli.options import (
    database_options,
    filter_options,
    json_option,
    page_options,
    stored_text,
)
from outboxer.message import printable
from outboxer.ports import MessageFilter, MessageState, OutboxMessage


@click.group()
def messages() -> None:
    """Messages not yet published: state, attempts, last error, next attempt."""


def _print_messages(items: list[OutboxMessage]) -> None:
    """The human table, escaped like ``dlq list`` (texts come from messages and errors)."""
    click.echo(
        f"{'ID':36}  {'TOPIC':16} {'TYPE':18} {'KEY':12} {'STATE':9} {'ATT':>3}  "
        f"{'NEXT ATTEMPT (UTC)':19}  RELAY / LAST ERROR"
    )
    for m in items:
        why = f"relay {m.relay}" if m.relay else (m.last_error or "-")
        click.echo(
            f"{printable(m.id):36}  {short(m.topic, 16):16} {short(m.type or '-', 18):18} "
            f"{short(m.key or '-', 12):12} {m.state:9} {m.attempts:>3}  "
            f"{m.next_attempt_at:%Y-%m-%d %H:%M:%S}  {short(why, 60)}"
        )


@messages.command("list")
@database_options
@click.option("--state", type=click.Choice(get_args(MessageState)), help="Only this state.")
@filter_options
@page_options
@json_option
def messages_list(**values: Any) -> None:
    """List messages not yet published, oldest first (the order relays claim them in).

    A state is pending (due, waiting for a relay), scheduled (available later, never tried),
    retrying (a publish failed; see the next attempt and last error), in_flight (leased by the
    relay shown) or held (its key has a publish dead letter).
    """
    echo_list(values, MessageFilter, lambda store: store.list_messages, _print_messages)


@messages.command("show")
@database_options
@click.argument("message_id", callback=stored_text)
@json_option
def messages_show(message_id: str, **values: Any) -> None:
    """One message not yet published, with its payload, state, attempts and last error."""
    echo_one(values, lambda store: store.get_message(message_id))
