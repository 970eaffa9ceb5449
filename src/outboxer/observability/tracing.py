"""OpenTelemetry tracing of the relay: a publish span per traced message, continued downstream.

The trace of a message crosses three processes:

1. the application's request span is active when it calls ``enqueue``; its W3C ``traceparent``
   (and ``tracestate``) are stored in the message headers, in the same transaction
   (:mod:`outboxer.observability.propagation`);
2. the relay publishes the message inside a ``publish <topic>`` span (kind ``PRODUCER``) whose
   parent is that stored context: :class:`TracingPublisher` wraps any publisher;
3. the ``traceparent`` sent to the broker is replaced by the publish span's, so a consumer that
   extracts it continues the same trace below the publish span.

Why one span per message and not one per batch with links: a span has exactly one parent, and
the point is that each message's trace shows its own publish step (with its own outcome) under
the request that wrote it; a batch span would only *link* to those traces. Messages written
outside any span carry no context and get no span at all, so untraced traffic costs one
dictionary lookup per message, and a traced one costs about one span (see
``docs/observability.md`` for measurements).

This module needs ``opentelemetry-api`` (``pip install 'outboxer[tracing]'``);
:func:`configure_tracing` also needs the SDK and an exporter.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from outboxer import urls
from outboxer.errors import ConfigurationError, PublishError
from outboxer.message import Message
from outboxer.observability.propagation import TRACEPARENT, TRACESTATE
from outboxer.ports import Publisher

__all__ = [
    "TracingPublisher",
    "configure_tracing",
    "messaging_system",
    "sdk_configured",
]

_PROPAGATOR = TraceContextTextMapPropagator()

#: OpenTelemetry ``messaging.system`` values that are not the broker's name in the scheme
#: registry (:data:`outboxer.urls.SCHEMES`); in-process handlers are no standard system.
_SYSTEMS = {"inprocess": "outboxer.inprocess"}


def messaging_system(broker_url: str) -> str:
    """The ``messaging.system`` attribute for a broker URL (``kafka://…`` → ``kafka``)."""
    scheme = urls.scheme_of(broker_url)
    entry = urls.SCHEMES.get(scheme)
    if entry is None or entry.kind != "broker":
        return scheme or "unknown"
    return _SYSTEMS.get(entry.name, entry.name)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("outboxer")
    except Exception:  # noqa: BLE001 - an uninstalled checkout still traces
        return "0"


class TracingPublisher:
    """A :class:`~outboxer.ports.Publisher` that traces each message through another one.

    For every message whose headers carry a ``traceparent`` it starts a ``publish <topic>``
    span (kind ``PRODUCER``) as a child of that context, replaces the message's
    ``traceparent``/``tracestate`` with the span's before handing the batch to ``inner``, and
    ends the span when the broker answered: status ``OK`` when acknowledged, ``ERROR`` with
    the reason otherwise. Messages without a ``traceparent`` pass through untouched.

    Args:
        inner: The real publisher; entered and exited with this one.
        system: The ``messaging.system`` attribute (see :func:`messaging_system`).
        tracer_provider: Where spans go; the global provider by default.
    """

    def __init__(
        self,
        inner: Publisher,
        *,
        system: str,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.inner = inner
        self.system = system
        self._tracer = trace.get_tracer("outboxer", _version(), tracer_provider=tracer_provider)

    def __repr__(self) -> str:
        return f"TracingPublisher({self.inner!r})"

    async def __aenter__(self) -> TracingPublisher:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.inner.__aexit__(*exc_info)

    async def publish(self, messages: Sequence[Message]) -> Sequence[PublishError | None]:
        spans: list[tuple[int, Span]] = []
        sent: list[Message] | None = None
        for index, message in enumerate(messages):
            parent = message.headers.get(TRACEPARENT)
            # Unsampled (flags bit 0 clear): the default parent-based sampler would drop the
            # span anyway, so skip it and pass the stored context on as it is.
            if not parent or not _sampled(parent):
                continue
            span = self._start(message)
            if span is None:
                continue  # a malformed stored traceparent: pass it through untouched
            context = span.get_span_context()
            if not context.is_valid:
                continue  # no SDK (a no-op span): nothing to record, nothing to change
            headers = dict(message.headers)
            headers[TRACEPARENT] = (
                f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
            )
            if context.trace_state:
                headers[TRACESTATE] = context.trace_state.to_header()
            else:
                headers.pop(TRACESTATE, None)
            if sent is None:
                sent = list(messages)
            sent[index] = dataclasses.replace(message, headers=headers)
            spans.append((index, span))
        if sent is None:
            return await self.inner.publish(messages)
        try:
            results = await self.inner.publish(sent)
        except BaseException as exc:
            for _, span in spans:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                span.end()
            raise
        for index, span in spans:
            result = results[index] if index < len(results) else None
            if result is not None:  # success leaves the status unset, as OTel asks of libraries
                span.set_attribute("error.type", type(result).__name__)
                span.set_status(Status(StatusCode.ERROR, str(result)))
            span.end()
        return results

    def _start(self, message: Message) -> Span | None:
        parent = _PROPAGATOR.extract(message.headers)
        if not trace.get_current_span(parent).get_span_context().is_valid:
            return None
        attributes: dict[str, Any] = {
            "messaging.system": self.system,
            "messaging.operation.type": "send",
            "messaging.destination.name": message.topic,
            "messaging.message.id": message.id,
            "outboxer.attempt": message.attempts + 1,
        }
        if message.type is not None:
            attributes["outboxer.message.type"] = message.type
        return self._tracer.start_span(
            f"publish {message.topic}",
            context=parent,
            kind=SpanKind.PRODUCER,
            attributes=attributes,
        )


def _sampled(traceparent: str) -> bool:
    try:
        return bool(int(traceparent[-2:], 16) & 1)
    except ValueError:
        return False


def sdk_configured() -> bool:
    """Whether an OpenTelemetry SDK tracer provider is installed in this process (e.g. by
    ``opentelemetry-instrument``), without importing OpenTelemetry when nobody has."""
    module = sys.modules.get("opentelemetry.trace")
    if module is None:
        return False
    provider = module.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def configure_tracing(service_name: str = "outboxer-relay") -> Callable[[], None]:
    """Install an SDK tracer provider for this process; returns its shutdown (which flushes).

    When a provider is installed already (``opentelemetry-instrument``, the application),
    it is used as it is and the returned function does nothing. Otherwise the exporter is
    chosen by the standard ``OTEL_TRACES_EXPORTER`` variable: ``otlp`` (default; HTTP, or gRPC
    when ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``; endpoint and headers from the standard
    ``OTEL_EXPORTER_OTLP_*`` variables), ``console`` (one JSON span per line on stdout) or
    ``none``. The service name is ``OTEL_SERVICE_NAME`` or ``service_name``.

    Raises:
        ConfigurationError: the SDK or the chosen exporter is not installed, or the exporter
            name is unknown.
    """
    if sdk_configured():
        return lambda: None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
    except ImportError as exc:
        raise ConfigurationError(
            f"tracing needs the OpenTelemetry SDK: pip install 'outboxer[tracing]' ({exc})"
        ) from exc
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    exporter: SpanExporter | None
    if exporter_name == "none":
        exporter = None
    elif exporter_name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        exporter = ConsoleSpanExporter(formatter=lambda span: span.to_json(indent=None) + "\n")
    elif exporter_name == "otlp":
        exporter = _otlp_exporter()
    else:
        raise ConfigurationError(
            f"OTEL_TRACES_EXPORTER={exporter_name!r} is not supported here: use otlp, console "
            "or none (or run the relay under opentelemetry-instrument)"
        )
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = SdkTracerProvider(resource=Resource.create({"service.name": name}))
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider.shutdown


def _otlp_exporter() -> Any:
    grpc = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip().lower() == "grpc"
    flavour = "grpc" if grpc else "http"
    try:
        module = importlib.import_module(
            f"opentelemetry.exporter.otlp.proto.{flavour}.trace_exporter"
        )
    except ImportError as exc:
        raise ConfigurationError(
            f"the OTLP trace exporter is not installed: pip install "
            f"opentelemetry-exporter-otlp-proto-{flavour} (or set OTEL_TRACES_EXPORTER=console) "
            f"({exc})"
        ) from exc
    return module.OTLPSpanExporter()
