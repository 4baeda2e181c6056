"""Traces of the served pipeline: a span per request, per operator call and per model call.

Copied beside the pipeline's ``model.py`` as ``triton_builder_tracing.py``, which it imports;
like it, imports nothing from ``builder`` and loads on Python 3.8.

Why spans are made after the fact: the pipeline model serves a dynamic batch of requests at
once, each operator over the rows of all of them, each model call over the rows whose shapes
agree (:mod:`builder.pipeline.executor`). So one operator call belongs to several requests'
traces. The executor and the model-call runner only record when each node and each model
call ran and on which calls' rows (:class:`BatchTrace`); once the batch is answered, every
request gets its own tree — ``pipeline <model>`` → ``operator <label>`` → ``model <name>`` —
with those times, under the W3C ``traceparent`` its client sent (a header Triton forwards as
a request parameter, or the parameter itself). No span of one request is under another's.

On only where the container says where to send them (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, the OpenTelemetry SDK's own variables, as are the
protocol, ``OTEL_TRACES_SAMPLER*``, ``OTEL_SERVICE_NAME`` and ``OTEL_BSP_*``), and where the
image was built with ``--tracing``, which puts the SDK and the OTLP exporters into its
environment. Spans leave on the SDK's batch processor's thread, never on a request's path.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
PROTOCOLS = ("http/protobuf", "grpc")
"""The OTLP protocols the image exports over (the SDK's default first)."""
TRACE_HEADERS = ("traceparent", "tracestate")
"""W3C Trace Context: the headers Triton forwards into request parameters (``--tracing``)."""
SDK_REQUIREMENTS = ("opentelemetry-sdk>=1.20,<2", "opentelemetry-exporter-otlp-proto-http>=1.20,<2",
                    "opentelemetry-exporter-otlp-proto-grpc>=1.20,<2")
"""What ``--tracing`` adds to the image's environment (1.20 and later read every variable
above; the resolver picks the newest the environment's Python takes)."""
ATTRIBUTE = "triton_builder."
"""The prefix of the spans' own attributes."""


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the container asks for traces: an OTLP endpoint, the SDK not disabled and no
    other exporter chosen."""
    return (any(environ.get(name) for name in ENDPOINT_VARIABLES)
            and environ.get("OTEL_SDK_DISABLED", "").lower() != "true"
            and environ.get("OTEL_TRACES_EXPORTER", "otlp").lower() == "otlp")


def protocol(environ: Mapping[str, str]) -> str:
    """The OTLP protocol asked for; ``ValueError`` naming the variable for one not exported."""
    for name in PROTOCOL_VARIABLES:
        value = environ.get(name)
        if value:
            if value not in PROTOCOLS:
                raise ValueError(f"{name}={value!r}: traces are exported over "
                                 f"{' or '.join(PROTOCOLS)}")
            return value
    return PROTOCOLS[0]


def span_exporter(environ: Mapping[str, str]) -> Any:
    """The SDK's OTLP exporter for the protocol asked for; it reads the endpoint, headers,
    timeout and compression from the environment itself."""
    if protocol(environ) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


class PipelineTracing:
    """The pipeline model's tracer: :meth:`begin` a batch, the executor and runner record
    into it (:meth:`model_call` finds the batch of the thread serving it), :meth:`finish`
    turns it into spans."""

    def __init__(self, tracer: Any, provider: Any, model_name: str,
                 labels: Sequence[str] = (), route: Any = None) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer, self.provider, self.model_name = tracer, provider, model_name
        self.labels, self.route = list(labels), route
        self.under = set_span_in_context
        self.propagator = TraceContextTextMapPropagator()
        self.kinds, self.status, self.codes = SpanKind, Status, StatusCode
        self.local = threading.local()

    @classmethod
    def create(cls, api: Any, model_name: str, environ: Mapping[str, str],
               labels: Sequence[str] = (), route: Any = None,
               exporter: Any = None) -> PipelineTracing | None:
        """Tracing where :func:`wanted`; ``None`` otherwise, and where the environment lacks
        the SDK (logged: the image was built without ``--tracing``). ``labels``: the plan's
        nodes' (how errors name them), ``route(target)`` how a model call goes, ``exporter``
        the span exporter (default: :func:`span_exporter`)."""
        if not wanted(environ):
            return None
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as error:
            api.log_warning(f"pipeline model {model_name!r}: OTEL_EXPORTER_OTLP_ENDPOINT is set, "
                            f"but the OpenTelemetry SDK is not in the image's environment "
                            f"({error}): build the image with --tracing; no traces are sent")
            return None
        attributes = {"triton.model.name": model_name}
        if not environ.get("OTEL_SERVICE_NAME") and "service.name=" not in environ.get(
                "OTEL_RESOURCE_ATTRIBUTES", ""):
            attributes["service.name"] = f"triton-builder/{model_name}"
        provider = TracerProvider(resource=Resource.create(attributes))  # sampler: OTEL_*
        provider.add_span_processor(BatchSpanProcessor(
            span_exporter(environ) if exporter is None else exporter))
        api.log_info(f"pipeline model {model_name!r}: traces over OTLP "
                     f"({protocol(environ)}), sampled as OTEL_TRACES_SAMPLER says")
        return cls(provider.get_tracer("triton-builder"), provider, model_name, labels, route)

    def begin(self, parameters: Sequence[Mapping[str, Any]]) -> BatchTrace | None:
        """A batch of requests with these request parameters, recorded on this thread: each
        request's span starts now, under its client's; ``None`` where the sampler records none
        of them (nothing is recorded then: a 1% sample costs the others almost nothing)."""
        started = time.time_ns()
        roots = []
        for request in parameters:
            parent = self.propagator.extract({key: str(request[key])
                                              for key in TRACE_HEADERS if key in request})
            root = self.tracer.start_span(
                f"pipeline {self.model_name}", context=parent, kind=self.kinds.SERVER,
                start_time=started, attributes={ATTRIBUTE + "batch_requests": len(parameters)})
            roots.append(root if root.is_recording() else None)
        if not any(roots):
            return None
        batch = BatchTrace(roots, self.labels, started)
        self.local.batch = batch
        return batch

    def model_call(self, target: Any, started_ns: int, ended_ns: int,
                   positions: Sequence[int], batch_size: int, error: str | None) -> None:
        """One model call (:class:`model_batching.BatchingRunner`'s observer)."""
        batch = getattr(self.local, "batch", None)
        if batch is not None:
            route = "" if self.route is None else self.route(target)
            batch.model_call(ModelCallRun(target.model_name, route, started_ns, ended_ns,
                                          batch.calls_at(positions), batch_size, error))

    def finish(self, batch: BatchTrace, errors: Sequence[str | None], ended_ns: int) -> None:
        """Every recorded request's spans: ``errors`` holds each request's error message
        (``None`` where it was answered)."""
        self.local.batch = None
        owner = batch.owners()
        for request, root in enumerate(batch.roots):
            if root is None:
                continue
            root.set_attribute(ATTRIBUTE + "calls", batch.calls_of(request))
            self._children(root, batch, request, owner)
            if errors[request] is not None:
                root.set_status(self.status(self.codes.ERROR, errors[request]))
            root.end(end_time=ended_ns)

    def _children(self, root: Any, batch: BatchTrace, request: int,
                  owner: Mapping[int, int]) -> None:
        under_root = self.under(root)
        for node in batch.nodes:
            rows = node.rows_by_request(owner).get(request, 0)
            if not rows:
                continue
            failures = [(kind, message) for call, (kind, message) in node.failures.items()
                        if owner.get(call) == request]
            kinds = {kind for kind, _ in failures}
            outcome = "rejected" if "rejected" in kinds else ("failed" if kinds else "ok")
            span = self.tracer.start_span(
                f"operator {node.label}", context=under_root, start_time=node.started_ns,
                attributes={ATTRIBUTE + "operator": node.label, ATTRIBUTE + "rows": rows,
                            ATTRIBUTE + "batch_size": len(node.calls),
                            ATTRIBUTE + "outcome": outcome})
            if failures:
                span.set_status(self.status(self.codes.ERROR, failures[0][1]))
            under_operator = self.under(span)
            for call in node.model_calls:
                own = call.rows_by_request(owner).get(request, 0)
                if own:
                    made = self.tracer.start_span(
                        f"model {call.model}", context=under_operator,
                        kind=self.kinds.CLIENT, start_time=call.started_ns,
                        attributes={ATTRIBUTE + "model": call.model,
                                    ATTRIBUTE + "route": call.route, ATTRIBUTE + "rows": own,
                                    ATTRIBUTE + "batch_size": call.batch_size})
                    if call.error is not None:
                        made.set_status(self.status(self.codes.ERROR, call.error))
                    made.end(end_time=call.ended_ns)
            span.end(end_time=node.ended_ns)

    def close(self) -> None:
        """Send what is left (the model unloads)."""
        self.provider.shutdown()


class _Run:
    """A node's run or a model call: the calls of the rows it held (one entry per row)."""

    __slots__ = ("calls", "counted")

    def __init__(self, calls: list[int]) -> None:
        self.calls = calls
        self.counted: Counter | None = None

    def rows_by_request(self, owner: Mapping[int, int]) -> Counter:
        """Each request → its rows here (counted once)."""
        if self.counted is None:
            self.counted = Counter(owner.get(call, -1) for call in self.calls)
        return self.counted


class NodeRun(_Run):
    """One node's run in a batch: when, the calls it failed, the model calls it made."""

    __slots__ = ("label", "started_ns", "ended_ns", "failures", "model_calls")

    def __init__(self, label: str, started_ns: int, ended_ns: int, calls: list[int],
                 failures: dict[int, tuple[str, str]]) -> None:
        super().__init__(calls)
        self.label, self.started_ns, self.ended_ns = label, started_ns, ended_ns
        self.failures = failures
        self.model_calls: list[ModelCallRun] = []


class ModelCallRun(_Run):
    """One model call: its model, route, times, batch size and error."""

    __slots__ = ("model", "route", "started_ns", "ended_ns", "batch_size", "error")

    def __init__(self, model: str, route: str, started_ns: int, ended_ns: int,
                 calls: list[int], batch_size: int, error: str | None = None) -> None:
        super().__init__(calls)
        self.model, self.route = model, route
        self.started_ns, self.ended_ns = started_ns, ended_ns
        self.batch_size, self.error = batch_size, error


class BatchTrace:
    """What one served batch did, recorded as it ran (the executor's ``NodeTrace``)."""

    def __init__(self, roots: Sequence[Any], labels: Sequence[str] = (),
                 started_ns: int | None = None) -> None:
        self.roots = list(roots)
        """Each request's span (``None`` where it is not sampled)."""
        self.started_ns = time.time_ns() if started_ns is None else started_ns
        self.labels = list(labels)
        self.requests: list[tuple[int, int, int]] = []
        """``(request, first call, calls)`` of each request decoded."""
        self.nodes: list[NodeRun] = []
        self.pending: list[ModelCallRun] = []
        self.row_calls: list[int] = []

    def calls_of(self, request: int) -> int:
        return next((count for index, _, count in self.requests if index == request), 0)

    def owners(self) -> dict[int, int]:
        """Each call → the request it belongs to."""
        return {first + k: request for request, first, count in self.requests
                for k in range(count)}

    def node(self, index: int, started_ns: int, ended_ns: int, calls: list[int],
             failures: dict[int, tuple[str, str]]) -> None:
        label = self.labels[index] if index < len(self.labels) else str(index)
        run = NodeRun(label, started_ns, ended_ns, calls, failures)
        run.model_calls, self.pending = self.pending, []
        self.nodes.append(run)

    def rows(self, calls: list[int]) -> _Rows:
        return _Rows(self, calls)

    def calls_at(self, positions: Sequence[int]) -> list[int]:
        """The calls of the rows at ``positions`` in the ``call_batch`` running now."""
        return [self.row_calls[p] for p in positions if p < len(self.row_calls)]

    def model_call(self, run: ModelCallRun) -> None:
        """A model call of the node running now."""
        self.pending.append(run)


class _Rows:
    """The rows of one ``call_batch``: positions in the model calls made inside are theirs."""

    def __init__(self, batch: BatchTrace, calls: list[int]) -> None:
        self.batch, self.calls = batch, calls

    def __enter__(self) -> None:
        self.saved, self.batch.row_calls = self.batch.row_calls, self.calls

    def __exit__(self, *exc: object) -> None:
        self.batch.row_calls = self.saved
