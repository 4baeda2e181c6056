"""The host Triton's environment and readiness probe, without starting a server (the e2e test
bed starts the real one)."""

from __future__ import annotations

import os
import socket
import sys
import sysconfig
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from builder.tritonserver.host_process import _server_environment, free_ports, triton_ready
from builder.tritonserver.wheel import TritonDistribution


def test_the_stub_finds_this_interpreter_first_and_the_servers_libraries(monkeypatch, tmp_path):
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/opt/other:{tmp_path / 'wheel/nvidia_pytriton.libs'}")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    distribution = TritonDistribution(root=tmp_path / "wheel", wheel=tmp_path / "w.whl")
    env = _server_environment(distribution, {"OMP_NUM_THREADS": "1"},
                              libraries=(tmp_path / "backends/python",))
    assert env["LD_LIBRARY_PATH"].split(os.pathsep) == [
        str(distribution.library_dir), str(tmp_path / "backends/python"),
        sysconfig.get_config_var("LIBDIR"), "/opt/other"]
    assert env["PATH"].split(os.pathsep) == [os.path.dirname(sys.executable), "/usr/bin", "/bin"]
    assert env["OMP_NUM_THREADS"] == "1"


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(3)
    assert len(set(ports)) == 3
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize(("status", "ready"), [(200, True), (400, False), (503, False)])
def test_ready_means_200_on_the_ready_endpoint(status, ready):
    class Server(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(status if self.path == "/v2/health/ready" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert triton_ready(f"127.0.0.1:{server.server_address[1]}") is ready
    finally:
        server.shutdown()
        server.server_close()


def test_nothing_listening_is_not_ready():
    (port,) = free_ports(1)
    assert triton_ready(f"127.0.0.1:{port}") is False


def test_the_wheels_layout_names(tmp_path: Path):
    distribution = TritonDistribution(root=tmp_path, wheel=tmp_path / "w.whl")
    assert distribution.tritonserver == tmp_path / "pytriton/tritonserver/bin/tritonserver"
    assert distribution.python_backend == tmp_path / "pytriton/tritonserver/backends/python"
