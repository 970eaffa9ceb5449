"""Handler registry: which functions react to which messages, and how they are called.

One registry serves the in-process publisher (``inprocess://module:registry``) and the broker
consumers (``outboxer consume --handlers module:registry``). A handler is chosen by the message
``type`` (``UserRegistered``) or, for messages without a matching type handler, by ``topic``.
Delivery is at-least-once, so handlers must be idempotent; through the inbox
(:mod:`outboxer.inbox.inbox`) their database writes are.

A handler takes one or two parameters::

    def handler(payload) / def handler(payload, ctx)      (or ``async def``)

- ``payload`` is the :class:`~outboxer.message.Message` itself, unless the first parameter is
  annotated with a dataclass or a pydantic model (anything with ``model_validate``): then the
  JSON payload is decoded into that class. ``dict``/``list`` give the decoded JSON, ``str`` the
  text, ``bytes`` the raw payload.
- ``ctx`` is a :class:`HandlerContext`: the message, the database connection of the inbox
  transaction (write through it and your writes commit or roll back with the inbox row), the
  consumer name and the attempt number.

A payload that cannot be decoded into the annotated type raises :class:`UndecodablePayload`, a
:class:`PermanentHandlerError`: retrying cannot help, so the message is dead-lettered at once.

Classes work too: decorating a class registers an instance made without arguments, and an
instance of a class with ``__call__`` can be registered directly (with its settings)::

    @handlers.handler()                      # the type is taken from the annotation's name
    def send_welcome_email(event: UserRegistered, ctx: HandlerContext) -> None: ...

    handlers.register(SendWelcomeEmail(smtp_host="mail"), "UserRegistered")
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import importlib
import inspect
import threading
import typing
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from outboxer.errors import (
    ConfigurationError,
    PermanentHandlerError,
    UndecodablePayload,
    error_summary,
    error_text,
)
from outboxer.message import Message

__all__ = [
    "Handler",
    "HandlerContext",
    "HandlerRegistry",
    "PermanentHandlerError",
    "Route",
    "UndecodablePayload",
    "load_registry",
    "registry_spec",
]

Handler = Callable[..., Any] | Callable[..., Awaitable[Any]]

#: Routes (see :meth:`HandlerRegistry.route`) kept at most.
_ROUTES = 1024

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class HandlerContext:
    """What a handler may want besides the payload.

    Attributes:
        message: The message being handled (id, topic, key, type, headers, raw payload).
        connection: The driver connection of the inbox transaction (an asyncpg connection or an
            aiosqlite connection): writes made through it commit together with the inbox row
            and are undone if the handler fails. Never commit or roll back on it. ``None`` when
            the handler runs without an inbox (``inprocess://``, the in-memory store).
        consumer: The inbox consumer name, ``None`` outside a consumer.
        attempt: 1 on the first delivery, 2 on the first retry, ...
    """

    message: Message
    connection: Any = None
    consumer: str | None = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class _Signature:
    """How to call one handler, worked out once at registration."""

    decode: Callable[[Message], Any]
    wants_context: bool
    is_async: bool

    def call(self, handler: Handler, message: Message, context: HandlerContext | None) -> Any:
        """Call ``handler`` with the decoded payload, then the context if it takes one.

        Raises:
            TypeError: a plain handler returned an awaitable (``lambda p: send(p)`` around an
                ``async def send``): it would never run, and the message would pass for
                handled.
        """
        payload = self.decode(message)
        result = handler(payload, context) if self.wants_context else handler(payload)
        if not self.is_async and inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()  # (no "never awaited" warning on top of the error)
            raise TypeError(
                f"the plain handler {_name(handler)} returned {type(result).__name__}, which "
                "nothing awaits: declare it 'async def' and await what it calls"
            )
        if inspect.isgenerator(result) or inspect.isasyncgen(result):
            raise TypeError(  # (one wrapped in a plain function: its body never runs)
                f"the handler {_name(handler)} returned a generator, whose body nothing runs"
            )
        return result


class HandlerExited(Exception):
    """A handler raised ``SystemExit``, ``KeyboardInterrupt`` or another ``BaseException`` that
    is not an ``Exception``: a failure of its message (retried, then dead-lettered), not a way to
    end the consumer or the relay (SIGTERM is). Left to propagate, it ended the task storing the
    batch without a word, and the process waited for that batch forever."""


def exited(error: BaseException) -> HandlerExited:
    """The failure of a message whose handler raised ``error`` (not an ``Exception``)."""
    text = error_text(error)
    exc = HandlerExited(f"the handler raised {type(error).__name__}{': ' if text else ''}{text}")
    exc.__cause__ = error
    return exc


class HandlerCancelled(Exception):
    """A handler raised ``asyncio.CancelledError`` although it was not cancelled: a failure of
    its message (retried like any other), not a stop of the consumer or the relay."""


def cancelled_itself(error: asyncio.CancelledError) -> HandlerCancelled | None:
    """The failure of a message whose handler raised ``error`` without its task being
    cancelled (it awaited something cancelled elsewhere, or raised it by hand); ``None`` when
    the task was cancelled (the consumer or the relay is stopping): then it propagates. Left to
    propagate, a handler's own passed for a stop: the relay released its batch and claimed it
    again at once, running the other handlers of the batch a thousand times a second (a
    probe)."""
    task = asyncio.current_task()
    if task is None or task.cancelling():
        return None
    exc = HandlerCancelled("the handler raised CancelledError without being cancelled")
    exc.__cause__ = error
    return exc


@dataclass(frozen=True, slots=True)
class Route:
    """The handlers of one (type, topic) with how to call each, worked out once per pair:
    what the inbox looks up per message instead of going through the registry's lists.

    Attributes:
        calls: Each handler and its signature, in registration order.
        wants_context: Whether any of them takes the context (and so may write).
    """

    calls: tuple[tuple[Handler, _Signature], ...]
    wants_context: bool

    def start(
        self,
        message: Message,
        connection: Any = None,
        consumer: str | None = None,
        attempt: int = 1,
    ) -> Awaitable[object]:
        """What runs the handlers when awaited (:meth:`run`). The context is made only for a
        handler that takes it (most do not). A route of one ``async`` handler, the usual one,
        is that handler's own coroutine: no coroutine of the route's per message, which the
        inbox and the in-process publisher run for every message.

        Raises:
            UndecodablePayload: here or when awaited: the payload does not fit the annotated
                type.
        """
        if len(self.calls) == 1:
            handler, signature = self.calls[0]
            if signature.is_async:
                context = None
                if signature.wants_context:
                    context = HandlerContext(message, connection, consumer, attempt)
                return signature.call(handler, message, context)  # type: ignore[no-any-return]
        return self.run(message, connection, consumer, attempt)

    async def run(
        self,
        message: Message,
        connection: Any = None,
        consumer: str | None = None,
        attempt: int = 1,
    ) -> None:
        """Run the handlers one after the other, a plain one in a worker thread (it must not
        block the loop: an SMTP call, an HTTP request), with one context made for those that
        take it (:class:`HandlerContext` of these fields).

        Raises:
            Exception: the first handler's error; the handlers after it do not run.
        """
        context: HandlerContext | None = None
        if self.wants_context:
            context = HandlerContext(message, connection, consumer, attempt)
        for handler, signature in self.calls:
            if signature.is_async:
                await signature.call(handler, message, context)
            else:
                await _in_daemon_thread(signature.call, handler, message, context)


async def _in_daemon_thread(function: Callable[..., _T], *args: Any) -> _T:
    """``function(*args)`` in a worker thread, as ``asyncio.to_thread`` does, but in a daemon
    thread of its own.

    ``asyncio.run`` and the interpreter's exit join every thread of the default executor, so a
    plain handler that never returns (a hung SMTP call) would keep a consumer alive for good
    after its stop abandoned the batch (``--shutdown-timeout``). A daemon thread ends with the
    process. Starting one costs some 50 µs, little beside the blocking call a plain handler
    makes (fast handlers are ``async``).
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[_T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.done():  # the awaiting task was cancelled (the batch abandoned)
            return
        if error is None:
            done.set_result(result)
        else:
            done.set_exception(error)

    def work() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (context.run(function, *args), None)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            outcome = (None, exc)
        # The loop may be closed by now (the process stopping without this handler).
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=work, name="outboxer-handler", daemon=True).start()
    return await done


def _decoder_for(annotation: Any, handler: Handler) -> tuple[Callable[[Message], Any], str | None]:
    """The payload decoder for a first-parameter annotation, and the type name it implies."""
    if annotation is inspect.Parameter.empty or annotation is Message or annotation is Any:
        return (lambda message: message), None
    origin = typing.get_origin(annotation) or annotation
    if origin is dict or origin is list:
        return _json, None
    if annotation is str:
        return (lambda message: message.text), None
    if annotation is bytes:
        return (lambda message: message.payload), None
    if isinstance(annotation, type) and callable(getattr(annotation, "model_validate", None)):
        model: Any = annotation

        def pydantic(message: Message) -> Any:
            try:
                if callable(getattr(model, "model_validate_json", None)):
                    return model.model_validate_json(message.payload)
                return model.model_validate(message.json())
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                raise UndecodablePayload(_undecodable(message, model, exc)) from exc

        return pydantic, annotation.__name__
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _dataclass_decoder(annotation), annotation.__name__
    raise ConfigurationError(
        f"handler {_name(handler)}: cannot decode a payload into {annotation!r}; annotate the "
        "first parameter with Message, a dataclass, a pydantic model, dict, list, str or bytes"
    )


def _json(message: Message) -> Any:
    try:
        return message.json()
    except ValueError as exc:
        raise UndecodablePayload(_undecodable(message, "JSON", exc)) from exc


def _dataclass_decoder(cls: type[Any]) -> Callable[[Message], Any]:
    names = {f.name for f in dataclasses.fields(cls) if f.init}

    def decode(message: Message) -> Any:
        data = _json(message)
        if not isinstance(data, dict):
            raise UndecodablePayload(_undecodable(message, cls, "not a JSON object"))
        # A tolerant reader: fields added by a newer producer are ignored, not fatal.
        try:
            return cls(**{k: v for k, v in data.items() if k in names})
        except (TypeError, ValueError) as exc:
            raise UndecodablePayload(_undecodable(message, cls, exc)) from exc

    return decode


def _undecodable(message: Message, target: object, why: object) -> str:
    name = getattr(target, "__name__", target)
    return f"payload of message {message.id} does not decode into {name}: {why}"


def _name(handler: Handler) -> str:
    return getattr(handler, "__qualname__", None) or type(handler).__qualname__


def _payload_annotation(target: Any, parameter: inspect.Parameter) -> Any:
    """The first parameter's annotation, resolved (``from __future__ import annotations``
    makes it a string). Another parameter's unresolvable annotation (say ``ctx`` annotated
    with a name imported only under ``TYPE_CHECKING``) does not matter here.

    Raises:
        ConfigurationError: the payload annotation names something that cannot be resolved
            (a class defined inside a function, a missing import): guessing "the Message"
            would hand the handler the wrong object at run time.
    """
    try:
        return typing.get_type_hints(target).get(parameter.name, inspect.Parameter.empty)
    except Exception:  # noqa: BLE001 - resolve the one annotation that matters below
        pass
    annotation = parameter.annotation
    if not isinstance(annotation, str):
        return annotation
    namespace = dict(getattr(target, "__globals__", {}))
    namespace.setdefault("Message", Message)
    try:
        return eval(annotation, namespace)  # a type annotation, as typing itself evaluates it
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot resolve"
        raise ConfigurationError(
            f"handler {getattr(target, '__qualname__', target)!r}: cannot resolve the payload "
            f"annotation {annotation!r} ({exc}); define that type at module level"
        ) from None


def _signature(handler: Handler) -> tuple[_Signature, str | None]:
    try:  # callable objects: the signature of __call__ without self
        parameters = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"handler {_name(handler)}: no inspectable signature") from exc
    # The function whose annotations (and module) count: a partial's (functools.partial of a
    # handler: its __call__ has no annotations, and the payload came as the Message).
    inner: Any = handler
    while isinstance(inner, functools.partial):
        inner = inner.func
    if inspect.isroutine(inner) or inspect.isfunction(inner):
        target: Any = inner
    else:
        target = getattr(inner, "__call__", inner)  # noqa: B004 - callable objects
    positional = [
        p
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is inspect.Parameter.empty]
    if not positional or len(required) > 2:
        raise ConfigurationError(
            f"handler {_name(handler)} must take (payload) or (payload, ctx), "
            f"not {len(required)} required parameters"
        )
    if inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target):
        raise ConfigurationError(
            f"handler {_name(handler)} is a generator (it has 'yield'): its body would never "
            "run; return instead of yielding"
        )
    decode, type_name = _decoder_for(_payload_annotation(target, positional[0]), handler)
    signature = _Signature(
        decode=decode,
        wants_context=len(positional) >= 2,
        is_async=_is_async(handler),
    )
    return signature, type_name


class HandlerRegistry:
    """Maps message types and topics to handler functions.

    Example::

        handlers = HandlerRegistry()

        @handlers.handler("UserRegistered")
        def send_welcome_email(message: Message) -> None: ...
    """

    def __init__(self) -> None:
        self._by_type: dict[str, list[Handler]] = defaultdict(list)
        self._by_topic: dict[str, list[Handler]] = defaultdict(list)
        # id(handler) -> how to call it; the handler objects stay alive in the lists above.
        self._signatures: dict[int, _Signature] = {}
        # (type, topic) -> its route; cleared by register(), and when it grows past
        # _ROUTES (a consumer of many topics, say one NATS subject per entity).
        self._routes: dict[tuple[str | None, str], Route | None] = {}

    def register(
        self,
        function: Handler | type[Any],
        type: str | None = None,  # noqa: A002 - the contract's word
        *,
        topic: str | None = None,
    ) -> Handler:
        """Register ``function`` for a message type and/or a topic.

        Without either, the type is the class name of the first parameter's dataclass or
        pydantic annotation (``def f(event: UserRegistered)`` handles ``UserRegistered``). A
        class is instantiated without arguments. Returns what was registered.

        Raises:
            ConfigurationError: not callable, no type/topic to register under, a signature
                that is neither ``(payload)`` nor ``(payload, ctx)``, or already registered
                for that type or topic.
        """
        # A class is a handler factory: its instance (made without arguments) is the handler.
        handler: Handler = typing.cast(
            Handler, function() if inspect.isclass(function) else function
        )
        if not callable(handler):
            raise ConfigurationError(f"handler {handler!r} is not callable")
        signature, type_name = _signature(handler)
        if type is None and topic is None:
            type = type_name  # noqa: A001 - the contract's word
        if type is None and topic is None:
            raise ConfigurationError("a handler needs a message type or a topic")
        # Twice in one list, it would run twice per message (two e-mails for one event).
        for what, name, registered in (
            ("type", type, self._by_type),
            ("topic", topic, self._by_topic),
        ):
            if name is not None and any(h is handler for h in registered.get(name, ())):
                raise ConfigurationError(
                    f"handler {_name(handler)} is already registered for {what} {name!r}"
                )
        self._signatures[id(handler)] = signature
        self._routes.clear()
        if type is not None:
            self._by_type[type].append(handler)
        if topic is not None:
            self._by_topic[topic].append(handler)
        return handler

    def handler(
        self,
        type: str | None = None,  # noqa: A002 - the contract's word
        *,
        topic: str | None = None,
    ) -> Callable[[Any], Any]:
        """Decorator form of :meth:`register` (for functions and classes).

        The decorated name stays bound to what was decorated (the function, or the class).
        """

        def decorate(function: Any) -> Any:
            self.register(function, type, topic=topic)
            return function

        return decorate

    def handlers_for(self, message: Message) -> list[Handler]:
        """Type handlers when the type has any, else topic handlers."""
        if message.type is not None and message.type in self._by_type:
            return self._by_type[message.type]
        return self._by_topic.get(message.topic, [])

    def route(self, message: Message) -> Route | None:
        """The handlers of ``message`` with their signatures (:meth:`handlers_for`), ``None``
        when it has none; worked out once per (type, topic)."""
        pair = (message.type, message.topic)
        try:
            return self._routes[pair]
        except KeyError:
            pass
        handlers = self.handlers_for(message)
        if len(self._routes) >= _ROUTES:
            self._routes.clear()
        route = None
        if handlers:
            calls = tuple((h, self._signature(h)) for h in handlers)
            route = Route(calls, any(signature.wants_context for _, signature in calls))
        self._routes[pair] = route
        return route

    @property
    def topics(self) -> list[str]:
        """The topics handlers were registered for (consumers subscribe to them by default)."""
        return [topic for topic, handlers in self._by_topic.items() if handlers]

    @property
    def types(self) -> list[str]:
        """The message types handlers were registered for."""
        return [type_ for type_, handlers in self._by_type.items() if handlers]

    def call(self, handler: Handler, message: Message, context: HandlerContext) -> Any:
        """Call ``handler`` as its signature asks: decoded payload, then the context if wanted.

        Returns what the handler returns: an awaitable for an ``async`` handler, so the caller
        awaits it (or runs a plain handler in a worker thread and ignores the result).

        Raises:
            UndecodablePayload: the payload does not fit the annotated type.
        """
        return self._signature(handler).call(handler, message, context)

    def wants_context(self, message: Message) -> bool:
        """Whether a handler of ``message`` takes the context, and so may write through
        ``ctx.connection`` (the inbox runs only those in a savepoint)."""
        route = self.route(message)
        return route is not None and route.wants_context

    def _signature(self, handler: Handler) -> _Signature:
        signature = self._signatures.get(id(handler))
        if signature is None:  # added to the lists behind register()'s back
            signature = _signature(handler)[0]
            self._signatures[id(handler)] = signature
        return signature

    def is_async(self, handler: Handler) -> bool:
        """Whether ``handler`` is ``async`` (worked out once, at registration)."""
        return self._signature(handler).is_async


def _is_async(function: Handler) -> bool:
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__call__", None)  # noqa: B004 - async callable objects
    )


def registry_spec(spec: str) -> tuple[str, str]:
    """Split ``package.module:registry`` into its module and attribute, or refuse it."""
    module_name, sep, attribute = spec.partition(":")
    if not (
        sep
        and all(part.isidentifier() for part in module_name.split("."))
        and attribute.isidentifier()
    ):
        raise ConfigurationError(
            f"handlers must be given as 'package.module:registry', not {spec!r}"
        )
    return module_name, attribute


def load_registry(spec: str) -> HandlerRegistry:
    """Import ``package.module:attribute`` and return the registry it names.

    Raises:
        ConfigurationError: a malformed spec, a module that fails to import (whatever it
            raises, ``SystemExit`` included), or no registry with handlers behind the name.
    """
    module_name, attribute = registry_spec(spec)
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # the user's module: a SyntaxError, a failing import
        raise ConfigurationError(
            f"cannot import handler module {module_name!r}: {error_summary(exc)}"
        ) from exc
    registry = getattr(module, attribute, None)
    if not isinstance(registry, HandlerRegistry):
        raise ConfigurationError(f"{spec!r} is not a HandlerRegistry")
    if not registry.types and not registry.topics:
        raise ConfigurationError(f"{spec!r} has no handlers: register some before starting")
    return registry
