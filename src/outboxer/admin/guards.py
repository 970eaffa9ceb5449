"""The ASGI middlewares that stand between the network and the admin app's routes.

Each is pure ASGI (not a FastAPI dependency) so it decides before the request body is read or
validated, and each refusal is a JSON ``{"detail": …}`` like every other error of the API:

* :class:`HostCheck` refuses a ``Host`` header the server does not answer to (DNS rebinding);
* :class:`BodyLimits` caps the request body's size (413) and the time to receive it (408);
* :class:`BearerAuth` guards ``/api/`` with the admin token;
* :class:`SecurityHeaders` keeps the dashboard from being framed, sniffed or fed scripts.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import socket
from collections.abc import Iterable, MutableMapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "TOKEN_ENV",
    "BearerAuth",
    "BodyLimits",
    "HostCheck",
    "SecurityHeaders",
    "default_allowed_hosts",
    "route_path",
]

TOKEN_ENV = "OUTBOXER_ADMIN_TOKEN"
MUTATIONS_DISABLED = (
    f"replay and delete are disabled because no admin token is configured: set {TOKEN_ENV} "
    "(or --admin-token) on the server and send 'Authorization: Bearer <token>'"
)
_MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def route_path(scope: Scope) -> str:
    """The path inside this app: mounted under a prefix, ``scope["path"]`` still holds the
    prefix (``root_path``), and checking it unstripped would leave ``/prefix/api/`` unguarded."""
    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", ""))
    return path[len(root) :] if root and path.startswith(root) else path


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


# -- Host ----------------------------------------------------------------------------------------


def default_allowed_hosts() -> frozenset[str]:
    """The names this machine answers to: ``localhost``, its host name and its FQDN.

    IP address literals are accepted besides (see :class:`HostCheck`), so probes that address
    the pod or the machine by IP need no configuration.
    """
    names = {"localhost", socket.gethostname(), socket.getfqdn()}
    return frozenset(n.lower().rstrip(".") for n in names if n)


def _host_name(header: bytes) -> str | None:
    """The host part of a ``Host`` header (no port, no IPv6 brackets), lower-case; ``None``
    when it cannot be a host name at all."""
    try:
        text = header.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return None
    if text.startswith("["):  # [v6 address]:port
        name, bracket, port = text[1:].partition("]")
        if not bracket or (port and not (port[:1] == ":" and port[1:].isdigit())):
            return None
        return name or None
    name, _, port = text.partition(":")
    if port and not port.isdigit():
        return None
    return name.rstrip(".") or None


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostCheck:
    """Refuses (400) a request whose ``Host`` is not one of the server's own names.

    DNS rebinding: a page on ``evil.example`` re-resolves its own name to 127.0.0.1, and the
    browser then lets that page read a tokenless admin server on the victim's machine, because
    to the browser it is still ``evil.example``. The request carries ``Host: evil.example``,
    which is what this check refuses. An IP address literal is always accepted: an attacker's
    page can only be reached through a name, and a request by IP from another origin is a
    cross-origin request whose answer the browser keeps from the page.

    Args:
        app: The wrapped app.
        allowed: Host names accepted besides IP literals; ``"*"`` accepts every host, and a
            leading dot (``".example.com"``) accepts the domain and its subdomains.
    """

    def __init__(self, app: ASGIApp, allowed: Iterable[str]) -> None:
        self.app = app
        names = {a.strip().lower().rstrip(".") for a in allowed}
        self._any = "*" in names
        self._exact = frozenset(n for n in names if n and not n.startswith("."))
        self._suffixes = tuple(n for n in names if n.startswith("."))

    def allows(self, header: bytes | None) -> bool:
        """Whether a request with this ``Host`` header value may be served."""
        if self._any:
            return True
        name = _host_name(header) if header is not None else None
        if name is None:
            return False
        return (
            name in self._exact
            or _is_ip_literal(name)
            or any(name.endswith(s) or name == s[1:] for s in self._suffixes)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.allows(_header(scope, b"host")):
            await self.app(scope, receive, send)
            return
        detail = (
            "this server does not answer to the Host of the request; add the name the server "
            "is reached by with --allowed-host (OUTBOXER_ALLOWED_HOSTS)"
        )
        await JSONResponse({"detail": detail}, status_code=400)(scope, receive, send)


# -- request bodies ------------------------------------------------------------------------------


class BodyLimits:
    """Refuses bodies over ``max_bytes`` (413) and bodies not received within ``timeout`` (408).

    The declared ``Content-Length`` is judged before anything is read; a chunked body is
    counted as it arrives. The timeout covers the whole body, not each chunk: a client
    trickling one byte at a time would otherwise hold a connection (and a worker) forever.
    Both refusals are raised as ``HTTPException`` from ``receive``, which FastAPI lets through
    its body parsing to the app's JSON error handler.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            too_large = self._too_large() if declared.isdigit() else "invalid Content-Length"
            status = 413 if declared.isdigit() else 400
            await JSONResponse({"detail": too_large}, status_code=status)(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise HTTPException(
                    408, f"the request body was not received within {self.timeout:g}s"
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, self._too_large())
            return message

        await self.app(scope, limited_receive, send)

    def _too_large(self) -> str:
        return f"the request body is larger than {self.max_bytes} bytes"


# -- authorization -------------------------------------------------------------------------------


class BearerAuth:
    """Guards ``/api/``: with a token every request needs it; without, mutations are refused.

    A middleware rather than a FastAPI dependency so authorization is decided before the body
    is read or validated: an unauthenticated caller gets 401 for a malformed body too, and learns
    nothing about the API's validation rules.
    """

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self._token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not route_path(scope).startswith("/api/"):
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await refusal(scope, receive, send)

    def _refusal(self, scope: Scope) -> Response | None:
        if self._token is None:
            if scope.get("method", "GET") in _MUTATING:
                return JSONResponse({"detail": MUTATIONS_DISABLED}, status_code=403)
            return None
        header = _header(scope, b"authorization") or b""
        scheme, _, presented = header.partition(b" ")
        # compare_digest: the time taken must not reveal how much of the token was right.
        if scheme.lower() == b"bearer" and hmac.compare_digest(presented.strip(), self._token):
            return None
        detail = (
            "missing bearer token: send 'Authorization: Bearer <token>'"
            if not header
            else "invalid bearer token"
        )
        return JSONResponse(
            {"detail": detail}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
        )


class SecurityHeaders:
    """Headers that keep the dashboard from being framed, sniffed or fed foreign scripts."""

    # The dashboard's own files only; no inline script, so injected markup cannot run.
    _CSP = (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    )

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        dashboard = path == "/" or path.startswith("/static/")

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-content-type-options", b"nosniff"))
                headers.append((b"referrer-policy", b"no-referrer"))
                if dashboard:
                    headers.append((b"content-security-policy", self._CSP.encode()))
                    headers.append((b"x-frame-options", b"DENY"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)
