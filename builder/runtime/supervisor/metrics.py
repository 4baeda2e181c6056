"""The supervisor's endpoint: Prometheus counters of healed and dead stubs and restarted
servers, and the replica's readiness (503 at once while it drains)."""

from __future__ import annotations

import http.server
import threading
from typing import Any

from .admin_api import READY_PATH

METRICS_PORT = 8003


def metrics_text(restarts: dict[str, int], deaths: dict[str, int], server_restarts: int) -> str:
    """Prometheus text exposition of the restart and death counters."""
    lines = []
    for name, help_text, values in (
            ("triton_builder_stub_restarts_total",
             "Python backend stubs that died and were brought back by reloading their model.",
             restarts),
            ("triton_builder_stub_deaths_total",
             "Python backend stubs seen dead (zombie children of tritonserver).", deaths)):
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
        lines += [f'{name}{{model="{_label(model)}"}} {count}'
                  for model, count in sorted(values.items())]
    name = "triton_builder_server_restarts_total"
    lines += [f"# HELP {name} Servers started again in place: after a crash, or to heal a "
              "dead stub where the repository API is closed.",
              f"# TYPE {name} counter", f"{name} {server_restarts}"]
    return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def serve_metrics(supervisor: Any, port: int) -> http.server.ThreadingHTTPServer:
    """``GET /metrics`` on ``port`` (all interfaces, as Triton's own), and ``GET
    /v2/health/ready`` (:data:`READY_PATH`): Triton's readiness, except that a draining replica
    answers 503 at once (Triton's own stays 200 until it stops: a readiness probe that asks
    Triton would keep sending traffic to a replica that is going away). In a daemon thread."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            path = self.path.split("?")[0]
            if path == READY_PATH:
                status, text = supervisor.readiness()
                self._answer(status, text.encode(), "text/plain; charset=utf-8")
            elif path == "/metrics":
                self._answer(200, supervisor.metrics().encode(),
                             "text/plain; version=0.0.4; charset=utf-8")
            else:
                self.send_error(404)

        def _answer(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
