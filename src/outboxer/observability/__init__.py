"""Metrics, tracing and logging helpers: adapters around the core's seams.

- :mod:`outboxer.observability.metrics`: a Prometheus :class:`~outboxer.relay.RelayObserver`
  and the relay's ``/metrics`` server (``prometheus-client``).
- :mod:`outboxer.observability.tracing`: OpenTelemetry publish spans and trace-context
  propagation to the broker (``opentelemetry-api``).
- :mod:`outboxer.observability.propagation`: captures the active trace context at enqueue; the
  only module here the core imports, and it imports OpenTelemetry only when the application
  already has.
- :mod:`outboxer.observability.logging`: JSON log lines and secret redaction.

Nothing is imported here, so ``import outboxer`` never pulls in a metrics or tracing library.
See ``docs/observability.md``.
"""
