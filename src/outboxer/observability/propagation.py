"""Capture the caller's trace context at enqueue, so the relay's publish span can continue it.

``enqueue`` asks :func:`trace_headers` for the W3C ``traceparent`` (and ``tracestate``) of the
span active in the caller, and stores them in the message headers, in the same row and the same
transaction as the message. The relay later starts its publish span as a child of that context
(:mod:`outboxer.observability.tracing`).

This is the only observability module the core imports, so it must cost nothing when tracing
is not in use: when the application never imported OpenTelemetry, no span can be active and
the check is a dictionary lookup in ``sys.modules`` (OpenTelemetry is never imported by it).
Only W3C Trace Context is written (not baggage: its entries would be stored in the database
with every message, and baggage often carries user data).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["TRACEPARENT", "TRACESTATE", "trace_headers"]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

_OTEL_TRACE = "opentelemetry.trace"
_get_current_span: Callable[[], Any] | None = None


def trace_headers() -> dict[str, str] | None:
    """``{"traceparent": …[, "tracestate": …]}`` of the active span, or ``None`` when there is
    none (OpenTelemetry not imported, no span, or an invalid/no-op span)."""
    global _get_current_span
    if _get_current_span is None:
        module = sys.modules.get(_OTEL_TRACE)
        if module is None:
            return None  # nobody imported OpenTelemetry: no span can be active
        _get_current_span = module.get_current_span
    context = _get_current_span().get_span_context()
    if not context.is_valid:
        return None
    # The W3C Trace Context header, version 00, as OpenTelemetry's TraceContextTextMapPropagator
    # writes it (formatted here to skip a second context lookup on every enqueue).
    headers = {
        TRACEPARENT: f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    }
    if context.trace_state:
        headers[TRACESTATE] = context.trace_state.to_header()
    return headers
