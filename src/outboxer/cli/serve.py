"""``outboxer serve``: the admin HTTP API and dashboard."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import click

from outboxer.cli._common import fail, open_store
from outboxer.cli.options import (
    build_settings,
    database_options,
    host_option,
    port_option,
    settings_options,
)
from outboxer.config import AdminSettings, TableNames


@click.command()
@database_options
@host_option("--host", "Interface to listen on")
@port_option("--port", 8080, "Port to listen on (0: any free port).")
@settings_options(AdminSettings)
def serve(
    database_url: str, schema: str | None, table: str, host: str, port: int, **values: Any
) -> None:
    """Admin HTTP API, Prometheus /metrics and the dashboard at /."""
    # The name it listens on is one the server answers to, besides the --allowed-host ones.
    hosts = frozenset((host, *values["allowed_hosts"]))
    settings = build_settings(AdminSettings, values, allowed_hosts=hosts)
    try:
        from outboxer.admin import create_app
        from outboxer.admin.server import listen, serve_app
    except ImportError as exc:
        fail(f"the admin server needs its extra: pip install 'outboxer[admin]' ({exc})")
    names = TableNames(table=table, schema=schema)
    try:
        listener = listen(host, port)  # before the database: a taken port is one line too
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")

    async def main() -> None:
        async with open_store(database_url, names) as store:
            app = create_app(store, **dataclasses.asdict(settings))
            await serve_app(app, listener)

    try:
        asyncio.run(main())
    finally:
        listener.close()
