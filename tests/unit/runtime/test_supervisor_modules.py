"""The supervisor's modules one by one, without processes: what each decides from its inputs.
(``test_supervisor.py`` runs the whole supervisor on real processes.)"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import threading
import urllib.request

import pytest

from builder.runtime.supervisor import admin_api, healer, metrics, reaper, stop_drain, watch


def test_metrics_text_is_prometheus_with_escaped_labels():
    text = metrics.metrics_text({'a"b': 2}, {'a"b': 3, "c": 0}, 1)
    assert 'triton_builder_stub_restarts_total{model="a\\"b"} 2' in text
    assert 'triton_builder_stub_deaths_total{model="c"} 0' in text
    assert text.endswith("triton_builder_server_restarts_total 1\n")
    assert text.count("# TYPE") == 3


def test_the_metrics_endpoint_serves_the_supervisors_answers():
    class Answers:
        def readiness(self):
            return 503, "draining: this replica is stopping\n"

        def metrics(self):
            return "up 1\n"

    server = metrics.serve_metrics(Answers(), 0)
    port = server.server_address[1]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as page:
            assert page.read() == b"up 1\n"
        with pytest.raises(urllib.error.HTTPError) as ready:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{admin_api.READY_PATH}")
        assert ready.value.code == 503
    finally:
        server.shutdown()


def test_exit_codes_and_crash_signals_as_a_shell_sees_them():
    assert reaper.exit_code(3 << 8) == 3
    assert reaper.exit_code(signal.SIGKILL) == 128 + signal.SIGKILL
    assert reaper.crash_signal(signal.SIGSEGV) == signal.SIGSEGV
    assert reaper.crash_signal(signal.SIGTERM) is None  # a stop, not a crash
    assert reaper.crash_signal(1 << 8) is None
    reaper.forward_signal(2**22 + 12345, signal.SIGTERM)  # a process that is gone: no error


def test_drain_periods_from_the_environment():
    assert stop_drain.drain_periods({}) == (stop_drain.DRAIN_S, stop_drain.FINISH_S)
    assert stop_drain.drain_periods({"TRITON_BUILDER_DRAIN_S": "2.5"})[0] == 2.5
    for bad in ({"TRITON_BUILDER_DRAIN_S": "soon"}, {"TRITON_BUILDER_DRAIN_FINISH_S": "-1"}):
        with pytest.raises(SystemExit, match="TRITON_BUILDER_DRAIN"):
            stop_drain.drain_periods(bad)


def test_the_server_option_and_the_admin_key():
    command = ["tritonserver", "--http-port=9000", "--model-control-mode", "explicit"]
    assert admin_api.server_option(command, "--http-port") == "9000"
    assert admin_api.server_option(command, "--model-control-mode") == "explicit"
    assert admin_api.server_option(command, "--grpc-port") is None
    made, whose = admin_api.admin_key({})
    assert admin_api.ADMIN_KEY.fullmatch(made) and whose == "a key made at start"
    assert admin_api.admin_key({admin_api.ADMIN_KEY_VARIABLE: "k" * 16})[0] == "k" * 16


def test_shared_memory_runs_short_below_the_reserve(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    assert watch.shared_memory_short(tmp_path, free)  # four regions of all that is free
    assert not watch.shared_memory_short(tmp_path, 1)
    assert not watch.shared_memory_short(tmp_path / "gone", 1 << 40)  # unreadable: no restart


def test_healed_stubs_kept_are_the_zombies_still_there(tmp_path):
    """A healed stub that the server reaped since (its pid may come back) is dropped."""
    path = tmp_path / "healed.json"
    (tmp_path / "proc").mkdir()  # a /proc with no process in it
    kept = watch.write_healed({(os.getpid(), 1), (2**22 + 1, 1)}, path, tmp_path / "proc")
    assert kept == set() and json.loads(path.read_text()) == []


def test_regions_removed_are_only_the_ones_named(tmp_path):
    for name in ("ours", "theirs"):
        (tmp_path / name).write_text("x")
    regions = {"/ours", "/missing"}
    assert watch.remove_regions(regions, tmp_path) == 1
    assert regions == set() and (tmp_path / "theirs").exists()


def test_the_supervisors_state_is_read_under_its_lock(tmp_path):
    """While another thread holds the lock (a reload recording its result), the drain, main and
    the readiness wait for it instead of reading half-made state."""
    supervisor = healer.Supervisor(2**22 + 7, 1, healer.RestartPolicy(), proc=tmp_path,
                                   healed_path=tmp_path / "healed.json")
    read = []
    with supervisor.lock:
        reader = threading.Thread(target=lambda: read.append(supervisor.given_up()))
        reader.start()
        reader.join(0.2)
        assert read == [], "read without the lock"
        supervisor.gave_up = "a reason"
    reader.join(5)
    assert read == ["a reason"]
    supervisor.start_draining()
    assert supervisor.readiness() == (503, "draining: this replica is stopping\n")
    supervisor.step(0.0)  # draining: no scan, no heal
    assert supervisor.restart_pending() is False and supervisor.server_pid() == 2**22 + 7


def test_a_port_that_is_no_number_is_refused_naming_where_it_came_from(capsys):
    """The supervisor's settings are checked before the server starts: a bad port says which
    flag or variable holds it (exit 2), where it was an int() traceback."""
    supervisor_main = importlib.import_module("builder.runtime.supervisor.main")

    assert supervisor_main.main(["tritonserver", "--http-port=eighty"]) == 2
    assert "--http-port must be a port number (0 to 65535), not 'eighty'" in (
        capsys.readouterr().err)
    with pytest.raises(ValueError, match="TRITON_BUILDER_METRICS_PORT must be a port number"):
        supervisor_main.ServerLaunch.prepare(["tritonserver"], [],
                                             {"TRITON_BUILDER_METRICS_PORT": "70000"})
    assert supervisor_main.port_number("--http-port", "8000") == 8000
