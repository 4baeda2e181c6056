"""The serving image's supervisor (``builder/runtime/supervisor/``) on real processes.

A real ``tritonserver`` with a stub killed inside the built image is in
``tests/e2e/test_reliability.py``. Here, to reach the states that take long or cannot be made on
demand there (a model that keeps failing, a server that will not reload), the server is a small
real process that stands for ``tritonserver``: it starts real child processes whose command
line and process name (``triton_python_backend_stub``, through a symlink to this Python) are
what the python backend starts, never reaps one that dies (as the backend does not), and
answers the repository API's ``load`` by starting a new one — behind the header that
``--http-restricted-api`` names, as Triton does, when the command restricts that API. The
supervisor runs as in the image: ``python3 supervisor.py COMMAND`` in a process of its own, as
that process's parent, from the files the image carries at ``/opt/triton-builder`` (its package
beside ``supervisor.py``, ``drain.py`` and ``health.py``), written to a directory of their own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from builder.image.serving_dockerfile import runtime_scripts
from builder.runtime import drain, health, supervisor
from builder.runtime.supervisor import ModelRecord, RestartPolicy, StubWatch

pytestmark = pytest.mark.light  # times restarts and drains of small real processes


_SCRATCH = tempfile.TemporaryDirectory(prefix="triton-builder-runtime-")
"""The module's own files (the image's runtime, the drains' state), removed as the run ends."""


def _image_layout() -> Path:
    """The runtime files as the image carries them, in a directory of their own."""
    root = Path(_SCRATCH.name, "image")
    for name, text in runtime_scripts().items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


SUPERVISOR = _image_layout() / "supervisor.py"

FAKE_SERVER = textwrap.dedent('''
    """Stands for tritonserver: starts a stub per model and never reaps one that dies."""
    import http.server, json, os, sys, threading, time

    stub, repository, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    models = [arg for arg in sys.argv[4:] if not arg.startswith("--")]
    restricted = {}  # api -> (header, value), from --http-restricted-api=<apis>:<header>=<value>
    for arg in sys.argv[4:]:
        if arg.startswith("--http-restricted-api="):
            apis, _, header = arg.split("=", 1)[1].partition(":")
            for api in apis.split(","):
                restricted[api] = tuple(header.split("=", 1))
    loads = {model: 0 for model in models}
    stamps = set()

    def start(model, *, autocomplete=False):
        name = model if autocomplete else f"{model}_0_{loads[model]}"
        region = f"/{os.path.basename(os.path.dirname(repository))}-{model}"  # under /dev/shm
        size = os.environ.get("FAKE_REGION_BYTES", "1048576")
        argv = [stub, f"{repository}/{model}/1/model.py", region, size, "1048576",
                str(os.getpid()), "/opt/lib", "/ipc", name, "DEFAULT"]
        return os.posix_spawn(stub, argv, os.environ)

    class Load(http.server.BaseHTTPRequestHandler):
        def refused(self, api):
            if api in restricted and self.headers.get(restricted[api][0]) != restricted[api][1]:
                self.send_response(403)
                self.end_headers()
                return True
            return False

        def do_GET(self):  # the model's configuration, sent back with the load
            if self.refused("model-config"):
                return
            body = json.dumps({"name": self.path.split("/")[-2]}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            if self.refused("model-repository"):
                return
            sent = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            config = json.loads(sent["parameters"]["config"])  # Triton reloads only a change
            stamp = config["parameters"]["triton_builder_reloaded"]["string_value"]
            assert stamp not in stamps, "the same configuration again: a no-op load"
            stamps.add(stamp)
            model = self.path.split("/")[-2]
            if os.path.exists(f"{repository}/{model}/hangs"):  # as Triton 2.51 without model.py
                time.sleep(3600)
            if model not in loads or os.path.exists(f"{repository}/{model}/broken"):
                self.send_response(400)
            else:
                loads[model] += 1
                start(model)
                self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    for model in models:
        start(model)
    if os.path.exists(f"{repository}/crashes"):  # as Triton when a stub dies holding a lock
        with open(f"{repository}/crashes") as file:
            left = int(file.read())
        if left:
            with open(f"{repository}/crashes", "w") as file:
                file.write(str(left - 1))
            threading.Timer(1.0, os.abort).start()
    print("ready", flush=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Load)
    server.serve_forever()
''')

STUB_MODEL = textwrap.dedent('''
    """Stands for a stub's model.py: lives while its parent does, as a real stub does."""
    import os, sys, time
    parent = int(sys.argv[4])  # the stub's 6th argument; sys.argv[0] is this file
    while os.getppid() == parent:
        time.sleep(0.1)
''')


@pytest.fixture
def repository(tmp_path) -> Path:
    """A model repository of two models, and the stub 'binary' (a symlink to this Python)."""
    for model in ("pipeline", "text_encoder"):
        (tmp_path / "models" / model / "1").mkdir(parents=True)
        (tmp_path / "models" / model / "1" / "model.py").write_text(STUB_MODEL)
    (tmp_path / "triton_python_backend_stub").symlink_to(sys.executable)
    (tmp_path / "server.py").write_text(FAKE_SERVER)
    return tmp_path


def _server_command(repository: Path, port: int, *extra: str) -> list[str]:
    return [sys.executable, str(repository / "server.py"),
            str(repository / "triton_python_backend_stub"), str(repository / "models"), str(port),
            "pipeline", "text_encoder", *extra]


def _stubs_of(parent: int) -> list[health.Process]:
    return [p for p in health.processes() if p.parent == parent and p.name == health.STUB]


def _wait(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# -- reading the stubs -----------------------------------------------------------------------
def test_the_model_comes_from_an_instance_stubs_command_line():
    line = ["/opt/tritonserver/backends/python/triton_python_backend_stub",
            "/models/text_encoder/1/model.py", "/tritonpythonbackend_abc", "1048576", "1048576",
            "17", "/opt/tritonserver/backends/python", "/ipc", "text_encoder_0_1",
            "/opt/tritonserver/backends/onnxruntime"]
    assert supervisor.stub_model(line) == "text_encoder"
    autocomplete = [*line[:8], "text_encoder", line[9]]
    assert supervisor.stub_model(autocomplete) is None, "the config stub exits on purpose"
    assert supervisor.stub_model(["/bin/bash", "-c", "source activate && exec ..."]) is None


def test_a_killed_stub_is_a_death_of_its_model_and_an_unloaded_one_is_not(repository):
    server = subprocess.Popen(_server_command(repository, 0), stdout=subprocess.PIPE)
    try:
        assert server.stdout.readline() == b"ready\n"
        watch = StubWatch(server.pid)
        _wait(lambda: len(watch.scan() or watch.live) == 2, what="two stubs")
        assert watch.models() == {"pipeline", "text_encoder"}
        (victim,) = [identity for identity, (model, _) in watch.live.items()
                     if model == "text_encoder"]
        os.kill(victim[0], signal.SIGKILL)
        deaths = _wait(watch.scan, what="the death")
        assert [(d.model, d.instance, d.stub.identity) for d in deaths] == [
            ("text_encoder", "text_encoder_0_0", victim)]
        assert deaths[0].why.startswith("killed by SIGKILL")
        assert watch.models() == {"pipeline"} and watch.scan() == [], "one death, reported once"
        zombie = {p.pid: p for p in health.processes()}[victim[0]]
        assert zombie.state == "Z" and zombie.identity == victim
        assert os.WTERMSIG(zombie.exit_status) == signal.SIGKILL
        assert [p.pid for p in health.dead_stubs(_stubs_of(server.pid) + [
            health.Process(server.pid, health.SERVER, "S", 1)])] == [victim[0]]
    finally:
        server.kill()
        server.wait()


# -- when to reload, when to give up ---------------------------------------------------------
def test_backoff_doubles_and_the_window_forgets_old_failures():
    policy = RestartPolicy(max_failures=4, window_s=10, first_delay_s=1, max_delay_s=3)
    assert [policy.delay(n) for n in range(1, 6)] == [0, 1, 2, 3, 3]
    record = ModelRecord()
    assert record.fail(100.0, policy) == 100.0, "the first death reloads at once"
    assert record.fail(101.0, policy) == 102.0
    assert record.fail(102.0, policy) == 104.0
    assert record.fail(103.0, policy) == 106.0
    assert record.fail(104.0, policy) is None, "a fifth failure within 10 s: give up"
    spaced = ModelRecord()
    assert all(spaced.fail(100.0 + 11 * n, policy) == 100.0 + 11 * n for n in range(10)), \
        "deaths further apart than the window never back off, never give up"


def test_bad_settings_are_refused_with_their_name():
    with pytest.raises(SystemExit, match="TRITON_BUILDER_HEAL"):
        RestartPolicy.from_environment({"TRITON_BUILDER_HEAL_WINDOW_S": "a minute"})
    assert RestartPolicy.from_environment({"TRITON_BUILDER_HEAL_MAX_FAILURES": "2"}) == \
        RestartPolicy(max_failures=2)


# -- the supervisor as the image runs it -----------------------------------------------------
def _supervise(command: list[str], **environment: str) -> subprocess.Popen:
    """The supervisor as the image runs it; a stop drains for 0 s (see the drain's own test),
    with a drain state and a healed-stubs file of its own."""
    state = Path(tempfile.mkdtemp(prefix="run-", dir=_SCRATCH.name))
    return subprocess.Popen(
        [sys.executable, str(SUPERVISOR), *command], stderr=subprocess.PIPE, text=True,
        env={**os.environ, "TRITON_BUILDER_METRICS_PORT": "0", "TRITON_BUILDER_DRAIN_S": "0",
             drain.STATE_DIR_VARIABLE: str(state / "drain"),
             "TRITON_BUILDER_HEALED_STUBS": str(state / "healed-stubs.json"), **environment})


def _stop(running: subprocess.Popen) -> str:
    """Kill the supervisor and its server (whose stubs follow their parent); its log."""
    for child in [p for p in health.processes() if p.parent == running.pid]:
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    running.kill()
    return running.communicate(timeout=10)[1]


def test_the_exit_status_follows_the_server():
    assert _supervise(["sh", "-c", "exit 3"]).wait(10) == 3
    assert _supervise(["sh", "-c", "kill -KILL $$"]).wait(10) == 128 + signal.SIGKILL


def test_sigint_reaches_the_server_and_its_status_comes_back():
    """SIGINT (Ctrl-C) stops at once, without a drain."""
    running = _supervise([sys.executable, "-c", (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *a: sys.exit(7))\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n")], PYTHONUNBUFFERED="1", TRITON_BUILDER_DRAIN_S="30")
    _wait(lambda: [p for p in health.processes() if p.parent == running.pid],
          what="the server")
    time.sleep(0.5)  # its handler is installed once it runs its code
    running.send_signal(signal.SIGINT)
    assert running.wait(10) == 7


DRAINED_SERVER = textwrap.dedent('''
    """Stands for tritonserver with one request in execution in a model that counts it, as the
    pipeline model does: the request is answered 1 s after the replica closes."""
    import http.server, sys, threading, time
    from pathlib import Path
    from builder.runtime import drain

    marks = Path(sys.argv[1])
    in_flight = drain.InFlight()
    in_flight.add(1)

    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (marks / "up").touch()
    while not drain.closing():
        time.sleep(0.01)
    time.sleep(1.0)
    (marks / "answered").write_text(repr(time.time()))
    in_flight.add(-1)
    time.sleep(3600)  # killed by the supervisor, never stopped by a signal
''')


ANOTHER_SERVER_WITH_A_DEAD_STUB = textwrap.dedent('''
    """Stands for another replica's tritonserver on this machine whose stub died (a test beside
    this one that kills stubs): a process named as the server, with a zombie child named as
    the stub, never reaped."""
    import ctypes, os, sys, time

    def named(name):
        ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME: /proc/PID/comm

    named("tritonserver")
    if os.fork() == 0:
        named("triton_python_backend_stub")
        os._exit(9)
    print("dead stub", flush=True)
    time.sleep(3600)
''')


def _replica_proc(supervisor: int, view: Path) -> Path:
    """``/proc`` as the replica's own container shows it to its health check: the supervisor
    and the processes it started, none of this machine's other servers."""
    table = health.processes()
    replica, grown = {supervisor}, True
    while grown:
        children = {p.pid for p in table if p.parent in replica} - replica
        replica |= children
        grown = bool(children)
    view.mkdir()
    for pid in replica:
        (view / str(pid)).symlink_to(f"/proc/{pid}")
    return view


def test_sigterm_drains_closes_and_stops_once_the_requests_in_flight_are_answered(tmp_path):
    """SIGTERM: not ready at once (health check, the supervisor's readiness), serving on for
    the drain period (1 s here), then closing; the server is killed only after the request it
    holds was answered, and the supervisor exits 0. Another server on this machine has a dead
    stub meanwhile, which this replica's health check must not see (its container would not)."""
    other = subprocess.Popen([sys.executable, "-c", ANOTHER_SERVER_WITH_A_DEAD_STUB],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline() == "dead stub\n"
        assert _wait(lambda: health.dead_stubs(health.processes()), what="another's dead stub")
        _drain_and_stop(tmp_path)
    finally:
        other.kill()
        other.wait()


def _drain_and_stop(tmp_path: Path) -> None:
    from builder.tritonserver.host_process import free_ports

    (http_port, metrics_port) = free_ports(2)
    state = tmp_path / "drain"
    (tmp_path / "server.py").write_text(DRAINED_SERVER)
    running = _supervise([sys.executable, str(tmp_path / "server.py"), str(tmp_path),
                          str(http_port), f"--http-port={http_port}"],
                         TRITON_BUILDER_DRAIN_S="1", TRITON_BUILDER_METRICS_PORT=str(metrics_port),
                         **{drain.STATE_DIR_VARIABLE: str(state)})
    ready = f"http://127.0.0.1:{metrics_port}/v2/health/ready"

    def readiness() -> int | None:
        try:
            with urllib.request.urlopen(ready, timeout=2) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
        except urllib.error.URLError:
            return None

    try:
        _wait(lambda: (tmp_path / "up").exists() and readiness() == 200, what="ready")
        assert drain.in_flight(state) == 1
        stopped = time.time()
        running.send_signal(signal.SIGTERM)
        _wait(lambda: drain.draining(state), timeout=0.5, what="draining at once")
        assert readiness() == 503
        assert health.check(http_port, drain_state=state) == "draining: this replica is stopping"
        assert health.check(http_port, live=True, drain_state=state,
                            proc=_replica_proc(running.pid, tmp_path / "proc")) is None, \
            "alive meanwhile"
        assert not drain.closing(state), "closed before the drain period"
        _wait(lambda: drain.closing(state), timeout=5, what="closing")
        closed = time.time()
        assert closed - stopped >= 1.0
        assert running.wait(10) == 0
        exited = time.time()
    finally:
        log = _stop(running)
    answered = float((tmp_path / "answered").read_text())
    assert exited >= answered, "the server was killed before its request was answered"
    assert "draining: not ready any more, serving on for 1s" in log, log
    assert "closing: new requests are answered UNAVAILABLE; 1 in flight" in log, log
    assert "every request in flight answered" in log and "exiting 0" in log, log


def test_a_dead_stub_is_reloaded_marked_healed_and_counted(repository, tmp_path):
    from builder.tritonserver.host_process import free_ports

    (port, metrics_port) = free_ports(2)
    healed_file = tmp_path / "healed.json"
    running = _supervise(_server_command(repository, port, f"--http-port={port}",
                                         "--model-control-mode=explicit"),
                         TRITON_BUILDER_METRICS_PORT=str(metrics_port),
                         TRITON_BUILDER_HEALED_STUBS=str(healed_file))
    try:
        server = _wait(lambda: [p for p in health.processes() if p.parent == running.pid],
                       what="the server")[0]
        first = _wait(lambda: len(_stubs_of(server.pid)) == 2 and _stubs_of(server.pid),
                      what="two stubs")
        time.sleep(0.5)  # the supervisor has read their command lines
        (victim,) = [p for p in first
                     if b"/pipeline/" in Path(f"/proc/{p.pid}/cmdline").read_bytes()]
        os.kill(victim.pid, signal.SIGKILL)
        _wait(lambda: len([p for p in _stubs_of(server.pid) if p.state != "Z"]) == 2,
              what="a new pipeline stub")
        _wait(lambda: health.healed_stubs(healed_file) == {victim.identity},
              what="the healed stub listed")
        # the health check's view, with the stand-in named as the server it stands for
        table = [*_stubs_of(server.pid), health.Process(server.pid, health.SERVER, "S", 1)]
        assert health.dead_stubs(table) != [] and health.dead_stubs(
            table, health.healed_stubs(healed_file)) == [], "healed: no longer dead"
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as response:
            metrics = response.read().decode()
        assert 'triton_builder_stub_restarts_total{model="pipeline"} 1' in metrics
        assert 'triton_builder_stub_restarts_total{model="text_encoder"} 0' in metrics
        running.send_signal(signal.SIGTERM)
        assert running.wait(10) == 0, "a stop drains, then exits 0"
    finally:
        log = _stop(running)
    assert "model 'pipeline': stub pid" in log and "killed by SIGKILL" in log
    assert "model 'pipeline': reloaded in" in log


def test_a_model_that_keeps_failing_makes_it_give_up_and_exit_75(repository):
    from builder.tritonserver.host_process import free_ports

    (port,) = free_ports(1)
    (repository / "models" / "text_encoder" / "broken").touch()  # every reload is refused
    running = _supervise(_server_command(repository, port, f"--http-port={port}",
                                         "--model-control-mode=explicit"),
                         TRITON_BUILDER_HEAL_MAX_FAILURES="2")
    try:
        server = _wait(lambda: [p for p in health.processes() if p.parent == running.pid],
                       what="the server")[0]
        _wait(lambda: len(_stubs_of(server.pid)) == 2, what="two stubs")
        time.sleep(0.5)
        (victim,) = [p for p in _stubs_of(server.pid)
                     if b"/text_encoder/" in Path(f"/proc/{p.pid}/cmdline").read_bytes()]
        started = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        assert running.wait(30) == supervisor.GAVE_UP
        elapsed = time.monotonic() - started
    finally:
        log = _stop(running)
    # death (1), reload refused at once (2), again after 1 s (3 > 2): give up
    assert 1.0 <= elapsed < 10, elapsed
    assert log.count("model 'text_encoder': reload failed "
                     "(repository/models/text_encoder/load answered 400)") == 1, log
    assert "giving up: model 'text_encoder' failed more than 2 times within 60s" in log
    assert "exiting 75" in log


def _server_of(running: subprocess.Popen, other_than: int | None = None) -> health.Process:
    return _wait(lambda: [p for p in health.processes() if p.parent == running.pid
                          and p.name != health.STUB and p.state != "Z" and p.pid != other_than],
                 timeout=15, what="the server")[0]


def _live_stub(server: health.Process, model: str) -> health.Process:
    def found():
        return [p for p in _stubs_of(server.pid) if p.state != "Z"
                and f"/{model}/".encode() in Path(f"/proc/{p.pid}/cmdline").read_bytes()]
    return _wait(found, what=f"a live {model} stub")[0]


def test_without_explicit_model_control_a_dead_stub_heals_by_restarting_the_server(repository):
    """Where the repository API stays closed (a Triton that cannot restrict it), the supervisor
    heals by starting the server again; the model's failures still count."""
    from builder.tritonserver.host_process import free_ports

    (metrics_port,) = free_ports(1)
    running = _supervise(_server_command(repository, 0),
                         TRITON_BUILDER_METRICS_PORT=str(metrics_port),
                         TRITON_BUILDER_HEAL_MAX_FAILURES="2")
    try:
        first = _server_of(running)
        _wait(lambda: len(_stubs_of(first.pid)) == 2, what="two stubs")
        time.sleep(0.5)  # the supervisor has read their command lines
        os.kill(_live_stub(first, "text_encoder").pid, signal.SIGKILL)
        second = _server_of(running, other_than=first.pid)
        _wait(lambda: len([p for p in _stubs_of(second.pid) if p.state != "Z"]) == 2,
              what="the new server's stubs")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as response:
            metrics = response.read().decode()
        assert 'triton_builder_stub_restarts_total{model="text_encoder"} 1' in metrics, metrics
        assert "triton_builder_server_restarts_total 1" in metrics, metrics
        time.sleep(0.5)
        os.kill(_live_stub(second, "text_encoder").pid, signal.SIGKILL)  # failure 2 of 2
        third = _server_of(running, other_than=second.pid)
        time.sleep(0.5)
        os.kill(_live_stub(third, "text_encoder").pid, signal.SIGKILL)  # 3 > 2: give up
        assert running.wait(30) == supervisor.GAVE_UP
    finally:
        log = _stop(running)
    assert "healing by restarting the server: it runs with --model-control-mode=none" in log
    assert "restarting the server to heal it (the repository API is closed" in log, log
    assert log.count("stopped (status 143) to heal its stubs; starting it again") == 2, log
    assert "giving up: model 'text_encoder' failed more than 2 times within 60s" in log


def test_when_shared_memory_runs_short_a_heal_restarts_the_server(repository, tmp_path):
    """Triton 2.51 keeps a stub's region mapped when the stub dies holding requests: a dozen
    heals fill Docker's 64 MB /dev/shm. With less room than SHM_RESERVE regions, the heal is a
    server restart (which frees them) instead of a reload that would fail. The stand-in's stubs
    claim regions larger than any disk here, so the room is always short."""
    from builder.tritonserver.host_process import free_ports

    (port,) = free_ports(1)
    running = _supervise(_server_command(repository, port, f"--http-port={port}",
                                         "--model-control-mode=explicit"),
                         FAKE_REGION_BYTES=str(2**60), TRITON_BUILDER_SHM_DIR=str(tmp_path))
    try:
        first = _server_of(running)
        _wait(lambda: len(_stubs_of(first.pid)) == 2, what="two stubs")
        time.sleep(0.5)
        os.kill(_live_stub(first, "text_encoder").pid, signal.SIGKILL)
        second = _server_of(running, other_than=first.pid)
        _wait(lambda: len([p for p in _stubs_of(second.pid) if p.state != "Z"]) == 2,
              what="the new server's stubs")
        running.send_signal(signal.SIGTERM)
        assert running.wait(10) == 0
    finally:
        log = _stop(running)
    assert "is nearly full of the dead stubs' regions, which only a new server frees" in log, log
    assert "reloaded in" not in log


def test_locked_apis_reach_the_server_behind_a_key_its_reloads_carry(repository, tmp_path):
    """``--lock-admin-apis``: the server gets the restrictions for ADMIN_APIS over HTTP and gRPC
    with a key made at start (never logged, not in the server's environment), and a heal's
    reload sends it (the stand-in refuses the load with 403 without it)."""
    from builder.tritonserver.host_process import free_ports

    (port,) = free_ports(1)
    healed_file = tmp_path / "healed.json"
    running = _supervise(["--lock-admin-apis", *_server_command(
        repository, port, f"--http-port={port}", "--model-control-mode=explicit")],
        TRITON_BUILDER_HEALED_STUBS=str(healed_file))
    try:
        server = _server_of(running)
        command = Path(f"/proc/{server.pid}/cmdline").read_bytes().decode().split("\0")
        (http,) = [arg for arg in command if arg.startswith("--http-restricted-api=")]
        (grpc,) = [arg for arg in command if arg.startswith("--grpc-restricted-protocol=")]
        apis, _, header = http.split("=", 1)[1].partition(":")
        assert apis.split(",") == list(supervisor.ADMIN_APIS)
        name, key = header.split("=", 1)
        assert name == supervisor.ADMIN_KEY_HEADER and len(key) >= 32
        assert grpc == f"--grpc-restricted-protocol={apis}:{header}"
        assert supervisor.ADMIN_KEY_VARIABLE.encode() not in Path(
            f"/proc/{server.pid}/environ").read_bytes()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v2/repository/models/pipeline/load", data=b"{}",
            method="POST")

        def answer() -> int | None:
            try:
                urllib.request.urlopen(request)
            except urllib.error.HTTPError as error:
                return error.code
            except urllib.error.URLError:
                return None
            return 200
        assert _wait(answer, what="the server's answer") == 403, "a load without the key"
        _wait(lambda: len(_stubs_of(server.pid)) == 2, what="two stubs")
        time.sleep(0.5)
        victim = _live_stub(server, "pipeline")
        os.kill(victim.pid, signal.SIGKILL)
        _wait(lambda: health.healed_stubs(healed_file) == {victim.identity},
              what="the stub healed by a reload with the key")
        running.send_signal(signal.SIGTERM)
        running.wait(10)
    finally:
        log = _stop(running)
    assert "model 'pipeline': reloaded in" in log, log
    assert "locked over HTTP and gRPC behind the header 'triton-builder-admin-key', with a key " \
        "made at start" in log, log
    assert key not in log


def test_an_operators_key_is_used_and_a_key_that_cannot_travel_is_refused(repository):
    key = "operator-key.0123456789"
    running = _supervise(["--lock-admin-apis", *_server_command(repository, 0)],
                         TRITON_BUILDER_ADMIN_KEY=key)
    try:
        server = _server_of(running)
        command = Path(f"/proc/{server.pid}/cmdline").read_bytes().decode()
        assert f"--http-restricted-api=model-repository,shared-memory,trace,logging:" \
            f"triton-builder-admin-key={key}" in command
    finally:
        log = _stop(running)
    assert "with the operator's key (TRITON_BUILDER_ADMIN_KEY)" in log
    refused = _supervise(["--lock-admin-apis", *_server_command(repository, 0)],
                         TRITON_BUILDER_ADMIN_KEY="short:key=x")
    assert refused.wait(10) == 2
    assert "TRITON_BUILDER_ADMIN_KEY must be 16 to 256 characters" in refused.communicate()[1]


def test_restrictions_of_the_locked_apis_in_the_servers_flags_are_refused_by_name():
    with pytest.raises(ValueError, match="restrict logging, trace already"):
        supervisor.locked_command(["tritonserver", "--http-restricted-api=trace,logging:k=v"],
                                  "k" * 32)
    command = ["tritonserver", "--grpc-restricted-protocol=inference:k=v"]
    assert supervisor.locked_command(command, "k" * 32)[:2] == command, \
        "other APIs may be restricted by the operator"


def test_a_reload_that_never_ends_gives_up_at_once(repository):
    from builder.tritonserver.host_process import free_ports

    (port,) = free_ports(1)
    (repository / "models" / "pipeline" / "hangs").touch()
    running = _supervise(_server_command(repository, port, f"--http-port={port}",
                                         "--model-control-mode=explicit"),
                         TRITON_BUILDER_HEAL_LOAD_TIMEOUT_S="1")
    try:
        server = _wait(lambda: [p for p in health.processes() if p.parent == running.pid],
                       what="the server")[0]
        _wait(lambda: len(_stubs_of(server.pid)) == 2, what="two stubs")
        time.sleep(0.5)
        (victim,) = [p for p in _stubs_of(server.pid)
                     if b"/pipeline/" in Path(f"/proc/{p.pid}/cmdline").read_bytes()]
        os.kill(victim.pid, signal.SIGKILL)
        assert running.wait(30) == supervisor.GAVE_UP
    finally:
        log = _stop(running)
    assert ("giving up: model 'pipeline': the server is stuck loading it (no answer to the load "
            "within 1s)") in log


def test_a_crashed_server_is_started_again_in_place_and_its_regions_removed(repository):
    """The server aborts once (as Triton 2.51 does when a stub is killed holding a lock in its
    shared memory): the supervisor starts it again with the same command, removes the shared
    memory regions of the dead server's stubs (and no other), and counts the restart."""
    from builder.tritonserver.host_process import free_ports

    (port, metrics_port) = free_ports(2)
    (repository / "models" / "crashes").write_text("1")
    regions = [Path("/dev/shm") / f"{repository.name}-{model}"
               for model in ("pipeline", "text_encoder")]
    other = Path("/dev/shm") / f"{repository.name}-another-server"
    for region in (*regions, other):
        region.write_bytes(b"region")
    running = _supervise(_server_command(repository, port, f"--http-port={port}",
                                         "--model-control-mode=explicit"),
                         TRITON_BUILDER_METRICS_PORT=str(metrics_port))
    try:
        first = _wait(lambda: [p for p in health.processes() if p.parent == running.pid
                               and p.name != health.STUB], what="the server")[0]
        second = _wait(lambda: [p for p in health.processes() if p.parent == running.pid
                                and p.name != health.STUB and p.pid != first.pid],
                       timeout=15, what="the server started again")[0]
        _wait(lambda: len([p for p in _stubs_of(second.pid) if p.state != "Z"]) == 2,
              what="the new server's stubs")
        assert running.poll() is None, "the supervisor exited with the server"
        assert not any(region.exists() for region in regions), "its stubs' regions are left"
        assert other.exists(), "a region that was not its stubs' was removed"
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as response:
            assert "triton_builder_server_restarts_total 1" in response.read().decode()
        running.send_signal(signal.SIGTERM)
        assert running.wait(10) == 0, "a stop is not a crash"
    finally:
        log = _stop(running)
        for region in (*regions, other):
            region.unlink(missing_ok=True)
    assert "the server was killed by SIGABRT; starting it again (server restart 1" in log, log
    assert "2 shared memory regions of its stubs removed" in log, log


def test_a_server_that_keeps_crashing_ends_the_supervisor_with_its_status(repository):
    from builder.tritonserver.host_process import free_ports

    (port,) = free_ports(1)
    (repository / "models" / "crashes").write_text("99")
    running = _supervise(_server_command(repository, port, f"--http-port={port}",
                                         "--model-control-mode=explicit"),
                         TRITON_BUILDER_HEAL_MAX_FAILURES="2")
    try:
        assert running.wait(30) == 128 + signal.SIGABRT
    finally:
        log = _stop(running)
    assert log.count("starting it again") == 2, log
    assert "server exited with status 134" in log, log
