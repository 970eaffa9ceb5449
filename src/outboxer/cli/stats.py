"""``outboxer stats``: the figures operators watch."""

from __future__ import annotations

import json
from typing import Any

import click

from outboxer.cli._common import with_store
from outboxer.cli.options import database_options, json_option
from outboxer.config import TableNames
from outboxer.message import printable
from outboxer.ports import AdminStore


@click.command()
@database_options
@json_option
def stats(database_url: str, schema: str | None, table: str, as_json: bool) -> None:
    """Pending, in flight, dead letters, oldest pending age, live relays, last sweep, and the
    consumers' failed messages still to re-drive (retrying, or waiting behind their key)."""

    async def read(store: AdminStore) -> dict[str, Any]:
        result: dict[str, Any] = (await store.stats()).to_json()
        return result

    figures = with_store(read, database_url, TableNames(table=table, schema=schema))
    if as_json:
        click.echo(json.dumps(figures, indent=2))
        return
    age = figures["oldest_pending_age_seconds"]
    click.echo(f"pending             {figures['pending']}")
    click.echo(f"in flight           {figures['in_flight']}")
    click.echo(f"dead letters        {figures['dead_letters']}")
    click.echo(f"oldest pending age  {'-' if age is None else f'{age:.1f}s'}")
    click.echo(f"live relays         {len(figures['relays'])}")
    for r in figures["relays"]:
        # A relay id is whatever --relay-id said: escaped like every stored text.
        click.echo(
            f"  {printable(r['relay_id'])}  in flight {r['in_flight']}  "
            f"heartbeat {r['heartbeat_at']}"
        )
    sweep = figures["last_sweep"]
    click.echo(f"last sweep          {'-' if sweep is None else json.dumps(sweep)}")
    # Last, so the lines above read as they always did; the total, then each failing consumer.
    failing = figures["consume_failures"]
    total = sum(c["retrying"] + c["waiting"] for c in failing.values())
    click.echo(f"consume failures    {total}")
    for name, c in failing.items():
        click.echo(
            f"  {printable(name)}  retrying {c['retrying']}  waiting {c['waiting']}  "
            f"oldest {c['oldest_age_seconds']:.1f}s"
        )
