"""Running the admin app under uvicorn inside a caller's event loop (``outboxer serve``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

__all__ = ["listen", "serve_app"]

log = logging.getLogger("outboxer.admin")


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket; raises ``OSError`` (port taken, unknown host) at once.

    Binding before the server starts lets the CLI report a taken port as one line instead of
    uvicorn's log-and-``sys.exit`` inside its startup.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    return listener


class _Server(uvicorn.Server):
    """uvicorn's server, stopped by asyncio signal handlers.

    uvicorn re-raises a caught SIGTERM/SIGINT once its graceful shutdown is done, which would
    kill the process before the caller closes the store's connection pool. Here a signal only
    asks the server to stop (a second one forces it); the caller's ``async with`` then closes
    the store and ``outboxer serve`` exits 0.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()

        def stop() -> None:
            self.force_exit = self.should_exit
            self.should_exit = True

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop)
        try:
            yield
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)


async def serve_app(app: FastAPI, listener: socket.socket, *, graceful_seconds: int = 10) -> None:
    """Serve ``app`` on ``listener`` until SIGTERM/SIGINT; in-flight requests get
    ``graceful_seconds`` to finish."""
    # log_config=None: uvicorn logs through the handlers `outboxer --log-level` configured.
    config = uvicorn.Config(
        app, log_config=None, lifespan="on", timeout_graceful_shutdown=graceful_seconds
    )
    host, port = listener.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    log.info(
        "admin API and dashboard on http://%s:%d/ (OpenAPI schema at /openapi.json)", shown, port
    )
    await _Server(config).serve(sockets=[listener])
