"""OTLP trace receivers for the tests: what a collector is to a served image.

:class:`OtlpReceiver` decodes ``POST /v1/traces`` bodies with the OpenTelemetry protobufs
(``ExportTraceServiceRequest``, of ``opentelemetry-proto``), :class:`OtlpGrpcReceiver` serves
the same request as OTLP's gRPC ``TraceService``; both keep every span, so a test can rebuild
each trace's tree. No collector binary is packaged here (REFERENCE.md); this is
the protocol's receiving end, not a stand-in for the exporter under test.
"""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int
    status_message: str
    service: str
    kind: int


@dataclass
class OtlpReceiver:
    """``with OtlpReceiver() as receiver:`` listens on ``host`` (all addresses by default: a
    container reaches it through the bridge's gateway) at a free port."""

    host: str = "0.0.0.0"
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0

    def __enter__(self) -> OtlpReceiver:
        receiver = self
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                request = ExportTraceServiceRequest.FromString(body)
                with lock:
                    receiver.requests += 1
                    receiver.spans.extend(_spans(request))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((self.host, 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, count: int, timeout: float = 30.0) -> list[ReceivedSpan]:
        """The spans received once at least ``count`` have come (``AssertionError`` after
        ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while len(self.spans) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.spans) >= count, f"{len(self.spans)} spans received, not {count}"
        return list(self.spans)


class OtlpGrpcReceiver(OtlpReceiver):
    """OTLP over gRPC: ``TraceService/Export`` on a free port of ``host``."""

    def __enter__(self) -> OtlpGrpcReceiver:
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        receiver = self
        lock = threading.Lock()

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: ExportTraceServiceRequest,  # noqa: N802 - gRPC's name
                       context: Any) -> ExportTraceServiceResponse:
                with lock:
                    receiver.requests += 1
                    receiver.spans.extend(_spans(request))
                return ExportTraceServiceResponse()

        self.grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.grpc_server)
        self.port = self.grpc_server.add_insecure_port(f"{self.host}:0")
        self.grpc_server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.grpc_server.stop(grace=None)


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _spans(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(ReceivedSpan(
                    trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                    parent_id=span.parent_span_id.hex(), name=span.name,
                    start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                    attributes={a.key: _value(a.value) for a in span.attributes},
                    status_code=span.status.code, status_message=span.status.message,
                    service=str(resource.get("service.name", "")), kind=span.kind))
    return spans


def trees(spans: list[ReceivedSpan]) -> dict[str, dict[str, list[ReceivedSpan]]]:
    """Each trace id → each parent span id → its children, in start order."""
    found: dict[str, dict[str, list[ReceivedSpan]]] = {}
    for span in sorted(spans, key=lambda s: s.start_ns):
        found.setdefault(span.trace_id, {}).setdefault(span.parent_id, []).append(span)
    return found
