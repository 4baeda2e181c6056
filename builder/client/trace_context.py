"""The caller's trace, sent with each request: W3C Trace Context headers.

Why through OpenTelemetry's API, where it is installed: a caller that traces its own work has
a current span (its context is a ``contextvars`` one, so threads and coroutines each see
their own); its ``traceparent`` makes the served pipeline's spans children of it
(:mod:`builder.runtime.tracing`, in an image built ``--tracing``). Without the API, or without
a current span, nothing is sent.
"""

from __future__ import annotations


def trace_headers() -> dict[str, str] | None:
    """The headers carrying the caller's current span (``traceparent``, ``tracestate`` where
    it has one), as the global propagator writes them; ``None`` where there are none."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None
