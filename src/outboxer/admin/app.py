"""The admin HTTP API and dashboard: a FastAPI app over any
:class:`~outboxer.ports.AdminStore`.

Two factories:

* :func:`create_app` takes a store whose lifecycle belongs to the caller (``outboxer serve``
  opens it before the server starts, so a bad URL is one readable line, not a traceback).
* :func:`create_app_from_url` builds the store from a database URL and opens/closes it in the
  app's lifespan, to serve on its own with uvicorn (a sub-app mounted elsewhere does not get
  its lifespan run: mount :func:`create_app` then).

Authorization (see ``docs/admin.md``): with a token, every ``/api/`` request needs
``Authorization: Bearer <token>``; without one, reads are open and replay/delete are refused
(403). ``/healthz``, ``/readyz``, ``/metrics``, the dashboard and the OpenAPI schema are never
behind the token: probes and scrapers must reach them, and they carry no payloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from importlib import resources
from typing import Annotated, Any, TypedDict

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from outboxer.admin.guards import (
    TOKEN_ENV,
    BearerAuth,
    BodyLimits,
    HostCheck,
    SecurityHeaders,
    default_allowed_hosts,
)
from outboxer.admin.metrics import CONTENT_TYPE, render_metrics
from outboxer.admin.models import (
    MAX_TEXT,
    BulkResult,
    DeadLetterFilterBody,
    DeadLetterOut,
    DeadLetterPageOut,
    MessageOut,
    MessagePageOut,
    Problem,
    ReadinessOut,
    StatsOut,
    checked_text,
)
from outboxer.config import BODY_TIMEOUT, MAX_BODY_BYTES, AdminSettings, TableNames
from outboxer.errors import (
    ConfigurationError,
    NotFound,
    OutboxerError,
    PermissionDenied,
    SchemaError,
    StoreError,
)
from outboxer.ports import (
    AdminStore,
    DeadLetter,
    DeadLetterFilter,
    DeadLetterPage,
    Direction,
    MessageFilter,
    MessagePage,
    MessageState,
    OutboxMessage,
    OutboxStats,
    dead_letter_not_found,
    dead_letters_not_found,
    missing_dead_letters,
    replay_skipped,
)
from outboxer.urls import redact

__all__ = ["AdminSettings", "create_app", "create_app_from_url"]

log = logging.getLogger("outboxer.admin")

NO_TOKEN_WARNING = (
    "NO ADMIN TOKEN IS SET: the admin API is open to read by anyone who can reach it, and "
    f"replay/delete are disabled. Set {TOKEN_ENV} (or --admin-token) to protect it."
)
_STATIC = resources.files("outboxer.admin") / "static"


# Declared for the OpenAPI schema (its securitySchemes); BearerAuth enforces it.
_bearer = HTTPBearer(auto_error=False, description=f"The server's {TOKEN_ENV}.")


def _documented_bearer(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    del credentials


# -- errors --------------------------------------------------------------------------------------


def _problem(status: int, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": encodable(detail)}, status_code=status, headers=headers)


def encodable(value: Any) -> Any:
    """``value`` with every string UTF-8 can encode: a lone surrogate (which a SQLite row or
    an old writer may hold) becomes its ``\\udXXX`` escape as text, instead of making the whole
    answer fail to serialize (a 500 for the list that holds it)."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode()
        return value
    if isinstance(value, dict):
        return {encodable(k): encodable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [encodable(v) for v in value]
    return value


#: FastAPI's answer to a body ``json.loads`` cannot even decode (bytes that are not UTF-8).
_FASTAPI_UNPARSED_BODY = "There was an error parsing the body"
_NOT_UTF8 = "JSON decode error: the body is not UTF-8"


def _install_error_handlers(app: FastAPI) -> None:
    """Every failure is a JSON ``{"detail": …}``; never a stack trace."""

    async def validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        # Only location, message and type: the rejected input is not echoed back (it may be a
        # large or sensitive body) and pydantic's ``ctx`` may hold non-JSON objects.
        errors = [
            {
                "loc": [str(part) for part in e.get("loc", ())],
                "msg": str(e.get("msg", "")),
                "type": str(e.get("type", "")),
            }
            for e in exc.errors()
        ]
        return _problem(422, errors)

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 400 and exc.detail == _FASTAPI_UNPARSED_BODY:
            # A body that does not decode (not UTF-8): malformed JSON like any other
            return _problem(422, [{"loc": ["body"], "msg": _NOT_UTF8, "type": "json_invalid"}])
        return _problem(exc.status_code, exc.detail, dict(exc.headers or {}))

    async def not_found(_: Request, exc: Exception) -> JSONResponse:
        return _problem(404, str(exc))

    async def bad_request(_: Request, exc: Exception) -> JSONResponse:
        return _problem(400, str(exc))

    async def permission_denied(request: Request, exc: Exception) -> JSONResponse:
        # Not the client's input (a 400) but the server's database role: the reason says which.
        log.error("%s %s refused by the database: %s", request.method, request.url.path, exc)
        return _problem(500, str(exc))

    async def schema_error(_: Request, exc: Exception) -> JSONResponse:
        return _problem(503, str(exc))

    async def store_error(_: Request, exc: Exception) -> JSONResponse:
        return _problem(503, str(exc), {"Retry-After": "5"})

    async def other_error(request: Request, exc: Exception) -> JSONResponse:
        # The traceback goes to the server log, never to the client.
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _problem(500, "internal error; see the server log")

    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(NotFound, not_found)
    app.add_exception_handler(ConfigurationError, bad_request)
    app.add_exception_handler(PermissionDenied, permission_denied)
    app.add_exception_handler(SchemaError, schema_error)
    app.add_exception_handler(StoreError, store_error)
    app.add_exception_handler(OutboxerError, other_error)
    app.add_exception_handler(Exception, other_error)


# -- the app -------------------------------------------------------------------------------------

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "Invalid filter or cursor."},
    401: {"model": Problem, "description": "Missing or wrong bearer token."},
    422: {"model": Problem, "description": "Malformed request."},
    503: {"model": Problem, "description": "The database is unavailable."},
}
_MUTATION_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    403: {"model": Problem, "description": "No admin token configured: mutations disabled."},
    404: {"model": Problem, "description": "No such dead letter."},
}


def _store(request: Request) -> AdminStore:
    """The store of the app serving this request (a mounted sub-app has its own)."""
    store: AdminStore = request.app.state.store
    return store


def _settings(request: Request) -> AdminSettings:
    settings: AdminSettings = request.app.state.settings
    return settings


StoreDep = Annotated[AdminStore, Depends(_store)]


def _checked(value: str, *loc: str) -> str:
    """``value`` if a store can look it up (see ``checked_text``); else 422 naming ``loc``."""
    try:
        return checked_text(value)
    except ValueError as exc:
        raise _unprocessable(loc, str(exc)) from None


FilterText = Annotated[str | None, Query(min_length=1, max_length=MAX_TEXT)]
PageLimit = Annotated[int, Query(ge=1, le=1000)]
# Cursors are opaque to clients; the stores hand out decimal sequence numbers, and the bound
# keeps an out-of-range integer from ever reaching the driver.
PageCursor = Annotated[str | None, Query(pattern=r"^[0-9]{1,18}$")]


def _text_filters(
    topic: FilterText = None,
    type: FilterText = None,  # noqa: A002 - the API's field name
    key: FilterText = None,
) -> dict[str, str | None]:
    """The topic/type/key filters both lists share."""
    given = {"topic": topic, "type": type, "key": key}
    return {k: None if v is None else _checked(v, "query", k) for k, v in given.items()}


TextFilters = Annotated[dict[str, str | None], Depends(_text_filters)]


def _list_filter(text: TextFilters, direction: Direction | None = None) -> DeadLetterFilter:
    return DeadLetterFilter(direction=direction, **text)


def _message_filter(text: TextFilters, state: MessageState | None = None) -> MessageFilter:
    return MessageFilter(state=state, **text)


DeadLetterQuery = Annotated[DeadLetterFilter, Depends(_list_filter)]
MessageQuery = Annotated[MessageFilter, Depends(_message_filter)]
IdPath = Path(min_length=1, max_length=MAX_TEXT, description="The message id.")


def _dead_letter_id(dead_letter_id: Annotated[str, IdPath]) -> str:
    return _checked(dead_letter_id, "path", "dead_letter_id")


def _message_id(message_id: Annotated[str, IdPath]) -> str:
    return _checked(message_id, "path", "message_id")


DeadLetterId = Annotated[str, Depends(_dead_letter_id)]
MessageId = Annotated[str, Depends(_message_id)]


class _PageRequest(TypedDict):
    limit: int
    cursor: str | None


def _page_request(limit: PageLimit = 50, cursor: PageCursor = None) -> _PageRequest:
    """``limit`` and ``cursor``, the paging both lists share."""
    return {"limit": limit, "cursor": cursor}


# First in a list's parameters: limit and cursor lead its query parameters in the schema.
PageRequest = Annotated[_PageRequest, Depends(_page_request)]


def _page(page: DeadLetterPage | MessagePage) -> dict[str, Any]:
    return {"items": [_item(i) for i in page.items], "next_cursor": page.next_cursor}


def _item(item: DeadLetter | OutboxMessage) -> dict[str, Any]:
    body: dict[str, Any] = encodable(item.to_json())
    return body


def _declared_query(dependant: Dependant) -> set[str]:
    """The query parameters a route (and its dependencies) declares."""
    names = {param.alias for param in dependant.query_params}
    for dependency in dependant.dependencies:
        names |= _declared_query(dependency)
    return names


def _no_duplicate_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's fields, refusing one given twice (``{"topic": "a", "topic": "b"}``)."""
    fields = dict(pairs)
    if len(fields) < len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise HTTPException(400, f"body field {name!r} is given more than once")
            seen.add(name)
    return fields


async def _checked_request(request: Request) -> None:
    """Refuse a query parameter the route does not declare (422), or one given twice (400):
    either would otherwise act on what the operator did not mean: a misspelt filter lists
    everything, a misspelt ``?directon=consume`` on a DELETE deleted both dead letters of the
    id, and ``?direction=publish&direction=consume`` took the last value. A body that is not
    sent as JSON is refused with 415 (``curl -d`` sends a form: the 422 said "Input should be
    a valid dictionary")."""
    headers = request.headers
    has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
    content_type = headers.get("content-type", "").partition(";")[0].strip().lower()
    if has_body and content_type != "application/json":
        raise HTTPException(415, "send the body as JSON, with Content-Type: application/json")
    route = request.scope.get("route")
    declared = _declared_query(route.dependant) if isinstance(route, APIRoute) else set()
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        if name not in declared:
            raise _unprocessable(["query", name], "unknown query parameter")
        if name in seen:
            raise HTTPException(400, f"query parameter {name!r} is given more than once")
        seen.add(name)
    if has_body:
        # As a query parameter given twice: the last value would act on a filter nobody meant.
        with contextlib.suppress(ValueError, RecursionError):  # malformed: FastAPI answers 422
            json.loads(await request.body(), object_pairs_hook=_no_duplicate_fields)


# Every /api/ route declares the bearer scheme for the OpenAPI schema; BearerAuth enforces it.
api = APIRouter(
    prefix="/api", dependencies=[Depends(_documented_bearer), Depends(_checked_request)]
)
dead_letters = APIRouter(prefix="/deadletters", tags=["dead letters"])
messages = APIRouter(prefix="/messages", tags=["messages"])
probes = APIRouter(tags=["probes"])


@dead_letters.get(
    "",
    response_model=DeadLetterPageOut,
    responses=_ERRORS,
    summary="List dead letters, newest first",
)
async def list_dead_letters(
    store: StoreDep, page: PageRequest, flt: DeadLetterQuery
) -> dict[str, Any]:
    return _page(await store.list_dead_letters(flt, **page))


@dead_letters.get(
    "/{dead_letter_id:path}",
    response_model=DeadLetterOut,
    responses={**_ERRORS, 404: _MUTATION_ERRORS[404]},
    summary="One dead letter with payload, reason and attempts",
    description=(
        "An id may have two dead letters, one publish and one consume (a service consuming "
        "what it publishes): direction chooses; without it, the newer."
    ),
)
async def get_dead_letter(
    store: StoreDep, dead_letter_id: DeadLetterId, direction: Direction | None = None
) -> dict[str, Any]:
    return _item(await store.get_dead_letter(dead_letter_id, direction))


@dead_letters.post(
    "/replay",
    response_model=BulkResult,
    responses=_MUTATION_ERRORS,
    summary="Replay the dead letters a filter selects",
    description=(
        "Moves them back to the outbox with the same id and attempts reset. Body: "
        '{"ids": [...]}, a {"topic"/"type"/"key"} filter, or {"all": true}. With ids, every '
        "id must exist (404 otherwise, and nothing is replayed)."
    ),
)
async def replay_many(store: StoreDep, body: DeadLetterFilterBody) -> dict[str, Any]:
    flt = await _bulk_filter(store, body)
    replayed = await store.replay_dead_letters(flt)
    return _bulk_result("replayed", replayed, flt, await replay_skipped(store, flt))


@dead_letters.post(
    "/purge",
    response_model=BulkResult,
    responses=_MUTATION_ERRORS,
    summary="Delete the dead letters a filter selects",
    description="The same body and rules as the bulk replay.",
)
async def purge_many(store: StoreDep, body: DeadLetterFilterBody) -> dict[str, Any]:
    flt = await _bulk_filter(store, body)
    return _bulk_result("purged", await store.purge_dead_letters(flt), flt)


#: Why a dead letter that exists was not replayed (the stores skip it rather than collide).
_BACK_IN_THE_OUTBOX = (
    "a message with this id is in the outbox again (the application wrote it anew): replay "
    "this dead letter once that message is published, or purge it"
)


@dead_letters.post(
    "/{dead_letter_id:path}/replay",
    response_model=BulkResult,
    responses={**_MUTATION_ERRORS, 409: {"model": Problem, "description": "Not replayable."}},
    summary="Replay one dead letter",
)
async def replay_one(
    store: StoreDep, dead_letter_id: DeadLetterId, direction: Direction | None = None
) -> dict[str, Any]:
    # NotFound → 404. A publish dead letter goes back to the outbox; a consume dead letter is
    # re-driven to the consumer(s) that gave up on it (the store does either). An id may have
    # both (``direction`` chooses one): if its publish dead letter cannot go back, neither is
    # replayed (409), rather than half of what the id names.
    await store.get_dead_letter(dead_letter_id, direction)
    if direction != "consume" and await _back_in_the_outbox(store, dead_letter_id):
        raise HTTPException(409, _BACK_IN_THE_OUTBOX)
    flt = DeadLetterFilter(ids=[dead_letter_id], direction=direction)
    replayed = await store.replay_dead_letters(flt)
    if not replayed:
        await store.get_dead_letter(dead_letter_id, direction)  # gone meanwhile → 404
        raise HTTPException(409, _BACK_IN_THE_OUTBOX)
    return _bulk_result("replayed", replayed, flt, await replay_skipped(store, flt))


async def _back_in_the_outbox(store: AdminStore, dead_letter_id: str) -> bool:
    """Whether the id has a publish dead letter while a message with the id is in the outbox
    again (a replay leaves such a dead letter where it is). The message is looked for first:
    a replay by another operator moves the dead letter to the outbox in one transaction, so
    the message seen before the dead letter is still there is not that replay's (the other
    order answered 409 to the second of two operators replaying the same dead letter)."""
    try:
        await store.get_message(dead_letter_id)
        await store.get_dead_letter(dead_letter_id, "publish")
    except NotFound:
        return False
    return True


@dead_letters.delete(
    "/{dead_letter_id:path}",
    response_model=BulkResult,
    responses=_MUTATION_ERRORS,
    summary="Discard one dead letter",
)
async def delete_one(
    store: StoreDep, dead_letter_id: DeadLetterId, direction: Direction | None = None
) -> dict[str, Any]:
    # Both dead letters of the id when it has two, unless ``direction`` chooses one.
    flt = DeadLetterFilter(ids=[dead_letter_id], direction=direction)
    purged = await store.purge_dead_letters(flt)
    if not purged:
        raise dead_letter_not_found(dead_letter_id, direction)
    return _bulk_result("purged", purged, flt)


@messages.get(
    "",
    response_model=MessagePageOut,
    responses=_ERRORS,
    summary="List messages not yet published, oldest first, with where each one stands",
    description=(
        "state: pending (due, waiting for a relay), scheduled (available later, never tried), "
        "retrying (a publish failed; next attempt at next_attempt_at), in_flight (leased by "
        "the relay named in relay), held (its key has a publish dead letter)."
    ),
)
async def list_messages(store: StoreDep, page: PageRequest, flt: MessageQuery) -> dict[str, Any]:
    return _page(await store.list_messages(flt, **page))


@messages.get(
    "/{message_id:path}",
    response_model=MessageOut,
    responses={**_ERRORS, 404: {"model": Problem, "description": "Not in the outbox."}},
    summary="One message not yet published, with its payload, state and last error",
)
async def get_message(store: StoreDep, message_id: MessageId) -> dict[str, Any]:
    return _item(await store.get_message(message_id))


api.include_router(dead_letters)
api.include_router(messages)


@api.get(
    "/stats",
    response_model=StatsOut,
    responses=_ERRORS,
    tags=["stats"],
    summary="The figures of 'outboxer stats --json'",
)
async def stats(store: StoreDep) -> dict[str, Any]:
    figures: dict[str, Any] = (await store.stats()).to_json()
    return figures


# The probes and the dashboard answer HEAD too (``curl -I``, load balancers' health checks).
@probes.head("/healthz", include_in_schema=False)
@probes.get("/healthz", summary="Liveness: the server answers")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@probes.head("/readyz", include_in_schema=False)
@probes.get(
    "/readyz",
    response_model=ReadinessOut,
    responses={503: {"model": ReadinessOut, "description": "Not ready; see the checks."}},
    summary="Readiness: database reachable, relays alive, lag under the threshold",
)
async def readyz(
    store: StoreDep, settings: Annotated[AdminSettings, Depends(_settings)]
) -> JSONResponse:
    body = await _readiness(store, settings)
    return JSONResponse(body, status_code=200 if body["ready"] else 503)


@probes.get(
    "/metrics",
    summary="Prometheus metrics computed from the store at scrape time",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Text format 0.0.4."}},
)
async def metrics(
    store: StoreDep, settings: Annotated[AdminSettings, Depends(_settings)]
) -> Response:
    snapshot, _ = await _read_stats(store, settings.stats_timeout)
    return Response(render_metrics(snapshot), media_type=CONTENT_TYPE)


@probes.head("/", include_in_schema=False)
@probes.get("/", include_in_schema=False)
async def dashboard() -> FileResponse:
    return FileResponse(str(_STATIC / "index.html"), media_type="text/html")


def create_app(
    store: AdminStore,
    *,
    token: str | None,
    ready_max_age: float = 300.0,
    ready_min_relays: int = 1,
    stats_timeout: float = 5.0,
    allowed_hosts: Iterable[str] = (),
    max_body_bytes: int = MAX_BODY_BYTES,
    body_timeout: float = BODY_TIMEOUT,
    lifespan: Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]] | None = None,
) -> FastAPI:
    """The admin app over ``store``; the store's lifecycle is the caller's.

    Args:
        store: An open store (or one that ``lifespan`` opens).
        token: The admin bearer token; ``None`` or empty leaves reads open and refuses
            replay/delete.
        ready_max_age: Oldest pending age (s) above which ``/readyz`` answers 503.
        ready_min_relays: Live relays ``/readyz`` requires (0: not checked).
        stats_timeout: Longest wait for the database in ``/readyz`` and ``/metrics`` (s).
        allowed_hosts: Host names the app answers to besides IP literals and this machine's
            names (``localhost``, host name, FQDN): the name a proxy or a service reaches it
            by (``".example.com"`` for a domain and its subdomains; ``"*"``: any host, for a
            proxy that checks the Host itself).
        max_body_bytes: Largest request body accepted (413 above).
        body_timeout: Longest time to receive a request body (408 after), in seconds.
        lifespan: An extra lifespan run inside the app's (see :func:`create_app_from_url`).

    Raises:
        ConfigurationError: A setting is out of range, or the token has surrounding
            whitespace.
    """
    settings = AdminSettings(
        token=token or None,
        ready_max_age=ready_max_age,
        ready_min_relays=ready_min_relays,
        stats_timeout=stats_timeout,
        allowed_hosts=default_allowed_hosts() | frozenset(allowed_hosts),
        max_body_bytes=max_body_bytes,
        body_timeout=body_timeout,
    )

    @contextlib.asynccontextmanager
    async def app_lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.token is None:
            log.warning("%s %s %s", "!" * 10, NO_TOKEN_WARNING, "!" * 10)
        elif len(settings.token) < 16:
            log.warning(
                "the admin token is short (%d characters): use 32 or more", len(settings.token)
            )
        if lifespan is None:
            yield
        else:
            async with lifespan(app):
                yield

    app = FastAPI(
        title="outboxer admin",
        version=_version(),
        description=(
            "Dead letters, stats, health and metrics of an outboxer transactional outbox. "
            f"When the server has {TOKEN_ENV} set, every /api/ request needs "
            "'Authorization: Bearer <token>'; without it, reads are open and replay/delete "
            "answer 403."
        ),
        lifespan=app_lifespan,
        # Swagger UI and ReDoc pages load their scripts from a CDN, without integrity, on the
        # API's own origin: off. /openapi.json stays for clients and local tools.
        docs_url=None,
        redoc_url=None,
    )
    app.state.store = store
    app.state.settings = settings
    _install_error_handlers(app)
    # The last added runs first: headers on every answer, then Host, size and token.
    app.add_middleware(BearerAuth, token=settings.token)
    app.add_middleware(BodyLimits, max_bytes=settings.max_body_bytes, timeout=settings.body_timeout)
    app.add_middleware(HostCheck, allowed=settings.allowed_hosts)
    app.add_middleware(SecurityHeaders)
    app.include_router(api)
    app.include_router(probes)
    app.mount("/static", StaticFiles(directory=str(_STATIC)), name="static")
    return app


def create_app_from_url(
    database_url: str,
    names: TableNames | None = None,
    *,
    token: str | None,
    ready_max_age: float = 300.0,
    ready_min_relays: int = 1,
    allowed_hosts: Iterable[str] = (),
) -> FastAPI:
    """The admin app over a store it opens at startup and closes at shutdown.

    The URL is checked here (``ConfigurationError`` at once); the database is first contacted
    when the server starts, and startup fails if the outbox schema is missing or outdated.
    """
    from outboxer.stores import open_store

    store = open_store(database_url, names)

    @contextlib.asynccontextmanager
    async def own_store(_: FastAPI) -> AsyncIterator[None]:
        async with store:
            await store.check_schema()
            yield

    return create_app(
        store,
        token=token,
        ready_max_age=ready_max_age,
        ready_min_relays=ready_min_relays,
        allowed_hosts=allowed_hosts,
        lifespan=own_store,
    )


# -- helpers -------------------------------------------------------------------------------------


def _unprocessable(loc: Sequence[str], message: str) -> RequestValidationError:
    return RequestValidationError([{"loc": tuple(loc), "msg": message, "type": "value_error"}])


async def _bulk_filter(store: AdminStore, body: DeadLetterFilterBody) -> DeadLetterFilter:
    """The store filter for a bulk body; with ``ids``, refuse (404) unless all exist."""
    if body.ids is None:
        return DeadLetterFilter(
            topic=body.topic, type=body.type, key=body.key, direction=body.direction
        )
    ids = list(dict.fromkeys(body.ids))
    missing = sorted(await missing_dead_letters(store, ids, body.direction))
    if missing:
        raise dead_letters_not_found(missing, body.direction)
    return DeadLetterFilter(ids=ids, direction=body.direction)


def _bulk_result(
    verb: str, done: list[str], flt: DeadLetterFilter, skipped: list[str] | None = None
) -> dict[str, Any]:
    """The answer of a replay or purge, logged for the audit trail. A replay also says which
    dead letters it ``skipped``: still there, as their id is in the outbox again."""
    shown = ", ".join(done[:20]) + (f" (+{len(done) - 20} more)" if len(done) > 20 else "")
    log.info("%s %d dead letter(s): %s", verb, len(done), shown)
    missing = sorted(set(flt.ids or ()) - set(done) - set(skipped or ()))
    result: dict[str, Any] = {verb: done, "count": len(done), "not_found": missing}
    if skipped is not None:
        result["skipped"] = skipped
    return result


async def _read_stats(store: AdminStore, timeout: float) -> tuple[OutboxStats | None, str]:
    """Stats, or ``None`` and why not: probes report a broken database, they never crash."""
    try:
        async with asyncio.timeout(timeout):
            stats = await store.stats()
        return stats, ""
    except TimeoutError:
        return None, f"the database did not answer within {timeout:g}s"
    except Exception as exc:  # noqa: BLE001 - any failure means "not reachable" to a probe
        # The driver's text (host names, user names, SQL) goes to the log, not to an
        # unauthenticated probe.
        log.warning("stats query failed: %s: %s", type(exc).__name__, redact(str(exc)))
        return None, "the stats query failed; see the server log"


async def _readiness(store: AdminStore, settings: AdminSettings) -> dict[str, Any]:
    """Every check with ``ok`` and a ``detail`` sentence; ready only when all are ok."""
    stats, error = await _read_stats(store, settings.stats_timeout)
    checks: dict[str, dict[str, Any]] = {}
    if stats is None:
        unknown = "unknown: the database is unreachable"
        checks["database"] = {"ok": False, "detail": f"unreachable: {error}"}
        checks["relays"] = {"ok": False, "detail": unknown}
        checks["lag"] = {"ok": False, "detail": unknown}
    else:
        live = len(stats.relays)
        age = stats.oldest_pending_age_seconds
        limit = settings.ready_max_age
        checks["database"] = {"ok": True, "detail": "reachable"}
        checks["relays"] = {
            "ok": live >= settings.ready_min_relays,
            "detail": f"{live} live relay(s), at least {settings.ready_min_relays} required",
            "live": live,
            "required": settings.ready_min_relays,
        }
        checks["lag"] = {
            "ok": age is None or age <= limit,
            "detail": "the outbox is empty"
            if age is None
            else f"the oldest pending message is {age:.1f}s old, limit {limit:g}s",
            "oldest_pending_age_seconds": age,
            "max_age_seconds": limit,
        }
    return {"ready": all(c["ok"] for c in checks.values()), "checks": checks}


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("outboxer")
    except Exception:  # noqa: BLE001 - an uninstalled checkout still serves
        return "0"
