"""W3C trace context carried in an execution's metadata (opentelemetry-api only).

A submitted execution carries the trace of whoever submitted it: ``client.submit`` merges
``telemetry_context()`` into the execution's metadata (``traceparent`` and, when present,
``tracestate``), and a workflow puts its run's context into the children it creates. The
worker that runs the execution starts its span as a child of that context
(``workers.telemetry``), so a request, the workflow it submitted and every child of that
workflow are one trace.

Without the OpenTelemetry SDK configured (the default) there is no recording span: the
current span is invalid, nothing is added, and the cost is one context-variable lookup.
The submitting process's context comes from its own instrumentation (a WSGI/Django
OpenTelemetry instrumentation, or code that starts a span around ``submit``).
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACE_KEYS = ("traceparent", "tracestate")
_propagator = TraceContextTextMapPropagator()


def telemetry_context() -> dict[str, str]:
    """The current span's W3C trace context (``{"traceparent": …}``), or ``{}`` when there
    is no valid current span."""
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier


def trace_of_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The W3C trace context an incoming request carries (its ``traceparent`` and
    ``tracestate`` headers), normalised by the propagator; ``{}`` when it carries none or
    an invalid one. How the REST API hands a caller's trace to the execution it submits,
    with or without the SDK."""
    carrier = {key: headers[key] for key in TRACE_KEYS if key in headers}
    if "traceparent" not in carrier:
        return {}
    context = _propagator.extract(carrier)
    if not trace.get_current_span(context).get_span_context().is_valid:
        return {}
    normalised: dict[str, str] = {}
    _propagator.inject(normalised, context=context)
    return normalised


def with_trace(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """``metadata`` plus the current trace context; a ``traceparent`` the caller set wins."""
    context = telemetry_context()
    if not context or (metadata and "traceparent" in metadata):
        return dict(metadata or {})
    return {**context, **(metadata or {})}


def context_of(metadata: Mapping[str, str] | None) -> Context | None:
    """The trace context an execution's metadata carries (None: it carries none)."""
    if not metadata or "traceparent" not in metadata:
        return None
    return _propagator.extract({key: metadata[key] for key in TRACE_KEYS if key in metadata})
