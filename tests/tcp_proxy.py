"""A small asyncio TCP proxy for tests that break a broker connection on purpose.

Point the client under test at ``127.0.0.1:proxy.port`` instead of the service, then::

    async with TcpProxy("127.0.0.1", 5672) as proxy:   # start() ... stop()
        ...                                             # traffic flows to the service
        await proxy.pause()     # keep the connections open but forward nothing (a black hole)
        await proxy.resume()    # forward again (what was held back is delivered)
        await proxy.cut()       # reset every open connection and refuse new ones
        await proxy.restore()   # accept again, on the same port

``cut`` aborts both sides of each connection (a TCP reset, as when a broker dies or a network
path breaks) and closes the listening socket, so a reconnect attempt is refused at once rather
than hanging. ``accepted`` counts the connections accepted so far (reconnects show up there).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``target_host:target_port``; see the module docstring."""

    def __init__(self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self.listen_host = listen_host
        self.port = 0  # chosen by the OS on the first start(), kept by restore()
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # pumps
        self._handlers: set[asyncio.Task[Any]] = set()  # one per accepted connection

    async def __aenter__(self) -> TcpProxy:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> TcpProxy:
        """Listen (on a free port the first time, on the same port afterwards)."""
        self._server = await asyncio.start_server(
            self._accept, self.listen_host, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def restore(self) -> None:
        """Accept connections again after :meth:`cut`, on the same port."""
        if self._server is None:
            await self.start()

    async def pause(self) -> None:
        """Stop forwarding bytes in both directions; connections stay open."""
        self._flowing.clear()

    async def resume(self) -> None:
        """Forward again after :meth:`pause`."""
        self._flowing.set()

    async def cut(self) -> None:
        """Reset every open connection and refuse new ones until :meth:`restore`."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for client, upstream in list(self._links):
            client.transport.abort()
            upstream.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        # Each handler closes its two sockets once its pumps ended: wait for all of them.
        await asyncio.gather(*list(self._handlers), return_exceptions=True)
        self._links.clear()
        self._flowing.set()

    async def stop(self) -> None:
        """Cut everything and stop listening for good."""
        await self.cut()

    @property
    def connections(self) -> int:
        """Connections open through the proxy right now."""
        return len(self._links)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            await self._forward(reader, writer)
        finally:
            self._handlers.discard(handler)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        link = (writer, up_writer)
        self._links.add(link)
        pumps = [
            asyncio.ensure_future(self._pump(reader, up_writer)),
            asyncio.ensure_future(self._pump(up_reader, writer)),
        ]
        self._tasks.update(pumps)
        try:
            # Either side closing ends the link: close both.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._tasks.difference_update(pumps)
            self._links.discard(link)
            for side in link:
                side.close()
                with contextlib.suppress(OSError, asyncio.CancelledError):
                    await side.wait_closed()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
