"""A small, real HTTP/1.1 webhook receiver for the HTTP publisher's tests and benchmark.

It listens on a real TCP socket (127.0.0.1, a free port by default), speaks enough HTTP/1.1 for
a webhook sender (keep-alive, ``Content-Length`` bodies), records every request in arrival
order, and answers what a ``responder`` callback says: a status, a body, an optional delay, or
dropping the connection without an answer. It counts requests in flight (the highest number at
once, overall and per ``ce-partitionkey``) and TCP connections opened, so tests can check
bounded concurrency and per-key ordering from the server's side of the wire.

``stop()`` closes the listening socket *and* every open connection, as a crashed receiver would;
``start()`` can then listen on the same port again, to test recovery.

Run ``python -m tests.http_receiver --port N`` for a receiver that acknowledges everything
(used by ``benchmarks/raw_http.py`` in its own process).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import unquote

__all__ = ["HttpReceiver", "Reply", "ReceivedRequest"]


@dataclass(frozen=True)
class ReceivedRequest:
    """One request as it arrived on the wire."""

    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    connection: int

    def header(self, name: str) -> str | None:
        """A header's raw value (case-insensitive name), or ``None``."""
        name = name.lower()
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    @property
    def header_map(self) -> dict[str, str]:
        """Headers by lower-case name (raw values)."""
        return {k.lower(): v for k, v in self.headers}

    def ce(self, attribute: str) -> str | None:
        """A CloudEvents attribute from its ``ce-`` header, percent-decoded as the spec says."""
        value = self.header(f"ce-{attribute}")
        return None if value is None else unquote(value)


@dataclass(frozen=True)
class Reply:
    """What the receiver answers: ``drop`` closes the connection without any response."""

    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0
    drop: bool = False
    #: Writes the whole answer itself (a misbehaving receiver: a trickled or endless body),
    #: then the connection is closed.
    raw: Callable[[asyncio.StreamWriter], Awaitable[None]] | None = None


Responder = Callable[[ReceivedRequest], Reply | Awaitable[Reply]]


def _acknowledge(request: ReceivedRequest) -> Reply:
    return Reply()


@dataclass
class HttpReceiver:
    """A recording HTTP/1.1 server on 127.0.0.1. Use as ``async with HttpReceiver() as rx``."""

    responder: Responder = _acknowledge
    host: str = "127.0.0.1"
    port: int = 0
    record: bool = True
    requests: list[ReceivedRequest] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    max_in_flight_per_key: int = 0
    connections_opened: int = 0
    _per_key: Counter[str] = field(default_factory=Counter)
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _arrived: asyncio.Condition | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        """Listen (again) on ``port``; port 0 picks a free one, remembered for restarts."""
        self._arrived = asyncio.Condition()
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and cut every open connection, as a crashed server would."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> HttpReceiver:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def wait_for(self, count: int, timeout: float = 5.0) -> list[ReceivedRequest]:
        """Wait until at least ``count`` requests arrived; return all of them."""
        assert self._arrived is not None, "receiver not started"
        async with asyncio.timeout(timeout), self._arrived:
            await self._arrived.wait_for(lambda: len(self.requests) >= count)
        return list(self.requests)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.connections_opened += 1
        connection = self.connections_opened
        try:
            while await self._serve_one(reader, writer, connection):
                pass
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            # stop() cancelled this connection; ending quietly keeps asyncio's stream callback
            # from logging the cancellation as an error.
            pass
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            writer.transport.abort()

    async def _serve_one(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: int
    ) -> bool:
        """Read one request and answer it; ``False`` when the connection is to be closed."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False  # the client closed an idle keep-alive connection
        lines = head[:-4].decode("latin-1").split("\r\n")
        method, target, _version = lines[0].split(" ", 2)
        headers = [(n.strip(), v.strip()) for n, _, v in (x.partition(":") for x in lines[1:])]
        lowered = {n.lower(): v for n, v in headers}
        if "chunked" in lowered.get("transfer-encoding", "").lower():
            await self._respond(writer, Reply(status=411), close=True)
            return False
        body = await reader.readexactly(int(lowered.get("content-length", "0")))
        request = ReceivedRequest(method, target, headers, body, connection)

        key = request.header("ce-partitionkey")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if key is not None:
            self._per_key[key] += 1
            self.max_in_flight_per_key = max(self.max_in_flight_per_key, self._per_key[key])
        try:
            reply = self.responder(request)
            if inspect.isawaitable(reply):
                reply = await reply
            if self.record:
                self.requests.append(request)
                assert self._arrived is not None
                async with self._arrived:
                    self._arrived.notify_all()
            if reply.delay:
                await asyncio.sleep(reply.delay)
        finally:
            self.in_flight -= 1
            if key is not None:
                self._per_key[key] -= 1
        if reply.drop:
            return False
        if reply.raw is not None:
            with contextlib.suppress(ConnectionError):
                await reply.raw(writer)
            return False
        close = lowered.get("connection", "").lower() == "close"
        await self._respond(writer, reply, close=close)
        return not close

    @staticmethod
    async def _respond(writer: asyncio.StreamWriter, reply: Reply, *, close: bool) -> None:
        try:
            phrase = HTTPStatus(reply.status).phrase
        except ValueError:
            phrase = "Unknown"
        head = [f"HTTP/1.1 {reply.status} {phrase}", f"content-length: {len(reply.body)}"]
        head += [f"{n}: {v}" for n, v in reply.headers]
        if close:
            head.append("connection: close")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + reply.body)
        await writer.drain()


async def _main(port: int) -> None:
    receiver = HttpReceiver(port=port, record=False)
    async with receiver:
        print(f"listening on {receiver.url}", flush=True)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="an HTTP receiver that acknowledges everything")
    parser.add_argument("--port", type=int, default=0)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(parser.parse_args().port))
