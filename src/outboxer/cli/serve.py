"""``outboxer serve``: the admin HTTP API and dashboard."""

from __future__ import annotations

import click

from outboxer.cli._common import fail, open_store, run_async, table_names
from outboxer.cli.options import database_options, env_option


@click.command()
@database_options
@env_option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Interface to listen on (0.0.0.0 for every interface).",
)
@env_option(
    "--port",
    default=8080,
    show_default=True,
    type=click.IntRange(0, 65535),
)
@env_option(
    "--admin-token",
    default=None,
    help="Bearer token required on /api/; without it reads are open and replay/delete refused.",
)
@env_option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    envvar="OUTBOXER_ALLOWED_HOSTS",
    help="A name the server is reached by, besides this machine's names and IP addresses "
    "(requests to other Host names are refused against DNS rebinding); repeatable; "
    "'.example.com' for a domain, '*' for any.",
)
@env_option(
    "--ready-max-age",
    default=300.0,
    show_default=True,
    type=click.FloatRange(0.001, None),
    help="/readyz fails when the oldest pending message is older (seconds).",
)
@env_option(
    "--ready-min-relays",
    default=1,
    show_default=True,
    type=click.IntRange(0, None),
    help="/readyz fails with fewer live relays (0: do not check).",
)
def serve(
    database_url: str,
    schema: str | None,
    table: str,
    host: str,
    port: int,
    admin_token: str | None,
    allowed_hosts: tuple[str, ...],
    ready_max_age: float,
    ready_min_relays: int,
) -> None:
    """Admin HTTP API, Prometheus /metrics and the dashboard at /."""
    try:
        from outboxer.admin import create_app
        from outboxer.admin.server import listen, serve_app
    except ImportError as exc:
        fail(f"the admin server needs its extra: pip install 'outboxer[admin]' ({exc})")
    names = table_names(schema, table)
    try:
        listener = listen(host, port)  # before the database: a taken port is one line too
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")

    async def main() -> None:
        async with open_store(database_url, names) as store:
            app = create_app(
                store,
                token=admin_token,
                ready_max_age=ready_max_age,
                ready_min_relays=ready_min_relays,
                allowed_hosts=(host, *allowed_hosts),
            )
            await serve_app(app, listener)

    try:
        run_async(main())
    finally:
        listener.close()
