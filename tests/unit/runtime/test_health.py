"""The serving container's health check (``builder/runtime/health.py``) without a container:
the ``/proc`` reading on this machine's real ``/proc`` and on a written one (for the states a
test cannot make a real ``tritonserver`` show on demand), the HTTP side against a real server.

The container end to end — a stub killed inside a running image turns it unhealthy — is in
``tests/e2e/test_reliability.py``.
"""

from __future__ import annotations

import http.server
import os
import threading
from pathlib import Path

import pytest

from builder.runtime import health


def _write_proc(root: Path, table: list[tuple[int, str, str, int]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for pid, name, state, parent in table:
        (root / str(pid)).mkdir()
        (root / str(pid) / "stat").write_text(f"{pid} ({name}) {state} {parent} 1 1 0 -1\n")
    (root / "self").mkdir()
    return root


def test_processes_reads_this_machines_proc():
    mine = {p.pid: p for p in health.processes()}[os.getpid()]
    assert mine.parent == os.getppid() and mine.state in "RS"


def test_only_dead_stubs_of_a_tritonserver_count(tmp_path):
    proc = _write_proc(tmp_path, [
        (1, "tritonserver", "S", 0),
        (20, "triton_python_b", "S", 1),      # a live stub
        (21, "triton_python_b", "Z", 1),      # a dead one: the signal
        (30, "triton_python_b", "Z", 99),     # a zombie of something else
        (40, "odd (name) Z", "S", 1),         # parentheses in a name do not confuse parsing
    ])
    assert [p.pid for p in health.dead_stubs(health.processes(proc))] == [21]


@pytest.fixture
def triton_like():
    """A real HTTP server answering Triton's health endpoints with the status we set."""
    status = {"/v2/health/ready": 200, "/v2/health/live": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            self.send_response(status.get(self.path, 404))
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], status
    server.shutdown()


def test_check_wants_ready_and_no_dead_stub(triton_like, tmp_path):
    port, status = triton_like
    alive = _write_proc(tmp_path / "alive", [(1, "tritonserver", "S", 0),
                                            (7, "triton_python_b", "S", 1)])
    dead = _write_proc(tmp_path / "dead", [(1, "tritonserver", "S", 0),
                                          (7, "triton_python_b", "Z", 1)])
    nothing_healed = tmp_path / "healed.json"
    assert health.check(port, proc=alive, healed=nothing_healed) is None
    assert "1 python backend stub process(es) died (pid 7)" in health.check(
        port, proc=dead, healed=nothing_healed)
    status["/v2/health/ready"] = 400
    assert health.check(port, proc=alive).endswith("/v2/health/ready answered 400")
    assert health.check(port, live=True, proc=alive) is None


def test_a_dead_stub_the_supervisor_healed_does_not_count(triton_like, tmp_path):
    """The healed list names a zombie by pid *and* start time (field 22): a zombie with that pid
    but another start time is another process, and still counts."""
    port, _ = triton_like
    proc = tmp_path / "proc"
    proc.mkdir()
    for pid, name, state, parent, started in [(1, "tritonserver", "S", 0, 100),
                                              (7, "triton_python_b", "Z", 1, 200),
                                              (8, "triton_python_b", "Z", 1, 300)]:
        (proc / str(pid)).mkdir()
        fields = [state, str(parent)] + ["0"] * 17 + [str(started)] + ["0"] * 30
        (proc / str(pid) / "stat").write_text(f"{pid} ({name}) {' '.join(fields)}\n")
    healed = tmp_path / "healed.json"
    assert health.healed_stubs(healed) == frozenset(), "no file: nothing healed"
    healed.write_text("[[7, 200], [8, 299]]")
    assert health.check(port, proc=proc, healed=healed).startswith(
        "1 python backend stub process(es) died (pid 8) and are not healed")
    healed.write_text("[[7, 200], [8, 300]]")
    assert health.check(port, proc=proc, healed=healed) is None
    healed.write_text("not json")
    assert health.check(port, proc=proc, healed=healed).startswith("2 python backend stub")


def test_a_server_that_does_not_answer_is_unhealthy(tmp_path):
    from builder.tritonserver.host_process import free_ports

    problem = health.check(free_ports(1)[0], proc=_write_proc(tmp_path, []))
    assert "/v2/health/ready" in problem and "refused" in problem.lower()

