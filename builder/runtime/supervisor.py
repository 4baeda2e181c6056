"""The serving container's first process: runs ``tritonserver`` and heals a python backend stub
that died, in place, without an orchestrator.

Why: since 24.06 the python backend does not restart a stub that died (killed, OOM, a segfault in
user code); every later request to its model fails with "Stub process '…' is not healthy" while
Triton still says ready. Reloading that one model through Triton's repository API
(``POST /v2/repository/models/<name>/load``, which needs ``--model-control-mode=explicit``)
starts a new stub in about a second and a half; models that call it over BLS find it again by
name, without being reloaded themselves.

How it sees a death: the backend forks each stub from ``tritonserver`` and never reaps one that
died, so a dead stub stays a zombie child of the server (see :mod:`builder.runtime.health`).
A zombie has no command line left, so the supervisor reads each live stub's command line while
it runs (``triton_python_backend_stub <repository>/<model>/<version>/model.py … <instance>``)
and remembers its model under the stub's identity (pid and start time). A remembered stub that
turns zombie died; one that vanishes was reaped by the backend (an orderly unload), not a death.

What it does then: reload the model at once; if the stub dies again (or the load fails), wait
before the next reload — 1 s, 2 s, 4 s … up to :attr:`RestartPolicy.max_delay_s` — and when one
model fails more than :attr:`RestartPolicy.max_failures` times within
:attr:`RestartPolicy.window_s`, give up: stop the server (SIGTERM) and exit with
:data:`GAVE_UP` (75), so a restart policy (``docker run --restart=on-failure``, Swarm,
Kubernetes) starts a fresh container. Every healed stub is written to
:data:`builder.runtime.health.HEALED_STUBS`, so the health check tells it from one that is not.

When the server itself crashes: Triton 2.51's python backend aborts the whole server now and
then when a stub is killed while it holds a lock in its shared memory (``terminate called after
throwing an instance of 'boost::interprocess::lock_exception'``: seen here 5 times in about
220 kills under load, every time with both stubs of the example killed together; upstream
triton-inference-server/server#8882). A
server ended by a crash signal (:data:`CRASH_SIGNALS`) that the supervisor did not send is
started again in place, with the same command, after the shared memory regions of its stubs are
removed; the same policy counts the crashes (more than ``max_failures`` within ``window_s``:
the supervisor exits with the server's status). Models come back as at any start, in seconds.

Where the repository API must stay closed (a Triton before 2.40, which cannot restrict it over
HTTP, so the image runs without explicit model control), a dead stub is healed by starting the
whole server again in place instead: SIGTERM, SIGKILL after :data:`HEAL_STOP_GRACE_S`, the dead
server's shared memory regions removed, the same command again. It costs every model's load
time instead of one model's, and counts against the same policy.

Locked administrative APIs (``--lock-admin-apis``, set by images whose Triton can restrict
APIs): the server is started with ``--http-restricted-api`` and ``--grpc-restricted-protocol``
for :data:`ADMIN_APIS`, behind the header :data:`ADMIN_KEY_HEADER`. Its value is
``TRITON_BUILDER_ADMIN_KEY`` when the operator sets one (to use those APIs themselves), else a
key made at start from :mod:`secrets`, never printed, known only to this process and the
server. The server's environment does not carry it; its command line does (Triton takes
the key no other way), which only processes of the container can read. Inference, health,
metadata, model configuration and statistics stay public: see :data:`ADMIN_APIS`.

A stop that drains (SIGTERM: ``docker stop``, Swarm, Kubernetes after the ``preStop`` hook
``supervisor.py --drain``, which starts it early and waits for it): readiness fails at once
(:data:`drain.DRAINING`: the health check, and ``/v2/health/ready`` on the supervisor's port)
while the server serves on for :data:`DRAIN_S`, so that load balancers stop sending; then the
pipeline model refuses new requests with ``UNAVAILABLE`` (:data:`drain.CLOSING`) and the
supervisor waits until the requests it holds are answered (at most :data:`FINISH_S`), kills the
server and exits 0. Triton's own SIGTERM is never used for a stop: it unloads the models while
its endpoints answer ``NOT_FOUND`` (see :mod:`builder.runtime.drain`). Healing pauses meanwhile.

PID 1 duties: forwards SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the server (SIGINT and
SIGQUIT stop it at once, without a drain), reaps every orphan, and exits with the server's
status (128 + the signal if a signal ended it), or 0 after a drain.

Metrics: Prometheus text at ``http://<container>:8003/metrics`` (:data:`METRICS_PORT`),
``triton_builder_stub_restarts_total{model=…}`` (stubs healed),
``triton_builder_stub_deaths_total{model=…}`` (stubs seen dead) and
``triton_builder_server_restarts_total`` (servers started again after a crash). Triton's own
metrics port cannot carry them: custom metrics can only be registered from inside a model.

Settings (environment variables): ``TRITON_BUILDER_HEAL`` (``off`` only supervises),
``TRITON_BUILDER_HEAL_MAX_FAILURES`` (5), ``TRITON_BUILDER_HEAL_WINDOW_S`` (60),
``TRITON_BUILDER_HEAL_MAX_DELAY_S`` (16), ``TRITON_BUILDER_DRAIN_S`` (the drain period, 5 s
unless the image was built with another), ``TRITON_BUILDER_DRAIN_FINISH_S`` (20),
``TRITON_BUILDER_ADMIN_KEY`` (the operator's key
for the locked APIs; unset: one made at start), ``TRITON_BUILDER_METRICS_PORT`` (8003; 0 turns the
endpoint off), ``TRITON_BUILDER_HEALED_STUBS`` (the file shared with the health check).
Copied into the image beside ``health.py`` and run with the image's own ``python3`` (standard
library only)::

    python3 /opt/triton-builder/supervisor.py --lock-admin-apis tritonserver \\
        --model-repository=/models --model-control-mode=explicit --load-model=* ...
"""

from __future__ import annotations

import http.server
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

if __package__:  # imported from the repository (builder.runtime.supervisor)
    from . import drain, health
else:  # run as /opt/triton-builder/supervisor.py, drain.py and health.py beside it
    import drain
    import health

GAVE_UP = 75
"""The exit status after giving up (EX_TEMPFAIL: a fresh container may well do better)."""
METRICS_PORT = 8003
READY_PATH = "/v2/health/ready"
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                     signal.SIGUSR2)
DRAIN_S = 5.0
"""How long a stopping replica goes on serving after its readiness failed: long enough for a
Kubernetes Service's endpoints and a balancer's health checks to drop it (a few seconds), short
enough that Docker's default 10 s before SIGKILL still fits the whole stop."""
FINISH_S = 20.0
"""How long the requests a closing replica holds may take to be answered before the server is
killed anyway. The grace periods of the manifests cover ``DRAIN_S + FINISH_S``."""
SCAN_INTERVAL_S = 0.25
"""How often ``/proc`` is read. At 0.1 s the supervisor took 0.7 % of a core in the example's
container (measured from ``/proc/1/stat`` over 30 s idle); a death is seen at most this late,
against 2–4 s for the reload itself."""
RELOAD_PARAMETER = "triton_builder_reloaded"
"""The model parameter a heal sets (when it reloaded the model): see :func:`load_model`."""
CRASH_SIGNALS = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
                           signal.SIGILL, signal.SIGKILL})
"""Signals that end a server by a crash (SIGKILL: the kernel's OOM killer) and not by a stop:
a server they end is started again, unless the supervisor forwarded a stop signal."""
STOPPING_SIGNALS = frozenset({signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})
SHARED_MEMORY = Path(os.environ.get("TRITON_BUILDER_SHM_DIR", "/dev/shm"))
SHM_RESERVE = 4
"""Free region sizes below which a heal restarts the server (see
:meth:`Supervisor._shared_memory_short`): room for the new stubs of two models with a region
each, and their growth."""
ADMIN_APIS = ("model-repository", "shared-memory", "trace", "logging")
"""What only the key opens, over HTTP and gRPC: loading (with uploaded files: code), unloading and
reconfiguring models; registering shared memory regions the server then reads and writes;
trace and log settings, which name files the server writes. Left public, read-only and needed by
clients: inference, health, metadata, ``model-config`` (a model's batching and shapes: our
clients and NVIDIA's perf_analyzer read it) and ``statistics`` (the counts the public metrics
port already serves; perf_analyzer reads them)."""
ADMIN_KEY_HEADER = "triton-builder-admin-key"
"""The header that carries the key. Over gRPC Triton prefixes restricted protocols' headers: the
metadata key is :data:`GRPC_ADMIN_KEY_HEADER`."""
GRPC_ADMIN_KEY_HEADER = f"triton-grpc-protocol-{ADMIN_KEY_HEADER}"
ADMIN_KEY_VARIABLE = "TRITON_BUILDER_ADMIN_KEY"
ADMIN_KEY = re.compile(r"[A-Za-z0-9._~+/-]{16,256}")
"""What an operator's key may be: 16 characters or more that travel unchanged in an HTTP header
and a gRPC metadata value, and that Triton's ``<apis>:<header>=<value>`` option parses."""
HEAL_STOP_GRACE_S = 5.0
"""How long a server stopped to heal a stub (the repository API closed) may take to exit before
SIGKILL: the requests in flight on its healthy models finish meanwhile."""
STOP_GRACE_S = 10.0
"""After giving up, how long the server may take to stop before SIGKILL (Triton waits up to its
``--exit-timeout-secs``, 30 s, for models that will not unload)."""


def log(message: str) -> None:
    """One line on stderr, beside Triton's own log: UTC time, who speaks, what happened."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    print(f"{stamp}Z triton-builder supervisor: {message}", file=sys.stderr, flush=True)


# -- which stub serves which model -----------------------------------------------------------
def stub_model(cmdline: list[str]) -> str | None:
    """The model a *model instance* stub serves, from its command line; None for anything else.

    The backend starts ``stub <repository>/<model>/<version>/<file> <shm region> <size> <growth>
    <parent pid> <python lib> <ipc handle> <stub name> <runtime model dir>`` (python_backend
    ``src/stub_launcher.cc``). The stub name is the instance's (``pipeline_0_0``) for a model
    instance, and the model's own for the short-lived stub that completes a model's
    configuration while it loads — that one exits on purpose and is not watched.
    """
    if len(cmdline) < 9 or not cmdline[0].endswith("triton_python_backend_stub"):
        return None
    parts = Path(cmdline[1]).parts
    if len(parts) < 3:
        return None
    model = parts[-3]
    return None if cmdline[8] == model else model


def read_cmdline(pid: int, proc: Path) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")[:-1]


def describe_exit(status: int) -> str:
    """A zombie's ``waitpid`` status in words."""
    if status == 0:
        return "exited with status 0 without being unloaded"
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        hint = " (a kill, or the kernel's OOM killer)" if number == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    if os.WIFEXITED(status):
        return f"exited with status {os.WEXITSTATUS(status)}"
    return f"ended with wait status {status}"


@dataclass(frozen=True)
class Death:
    model: str
    stub: health.Process
    instance: str
    why: str


@dataclass
class StubWatch:
    """The stubs of one ``tritonserver``: remembers each live one's model, reports deaths."""

    server_pid: int
    proc: Path = Path("/proc")
    live: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)
    """Identity → (model, instance) of every model instance stub seen alive."""
    regions: set[str] = field(default_factory=set)
    """The shared memory regions of the stubs seen (their third argument), removed after a
    crash of the server: a server that aborts leaves them behind in ``/dev/shm``."""
    region_bytes: int = 0
    """The largest region a stub of this server starts with (its fourth argument)."""

    def scan(self) -> list[Death]:
        """Read ``/proc`` once: learn new stubs, return the remembered ones that turned zombie."""
        stubs = {p.identity: p for p in health.processes(self.proc)
                 if p.parent == self.server_pid and p.name == health.STUB}
        deaths = []
        for identity, stub in stubs.items():
            if stub.state == "Z":
                if identity in self.live:
                    model, instance = self.live.pop(identity)
                    deaths.append(Death(model, stub, instance, describe_exit(stub.exit_status)))
            elif identity not in self.live:
                cmdline = read_cmdline(stub.pid, self.proc)
                model = stub_model(cmdline)
                if model is not None:
                    self.live[identity] = (model, cmdline[8])
                    self.regions.add(cmdline[2])
                    if cmdline[3].isdigit():
                        self.region_bytes = max(self.region_bytes, int(cmdline[3]))
        for identity in set(self.live) - set(stubs):  # reaped by the backend: an unload
            del self.live[identity]
        return deaths

    def models(self) -> set[str]:
        return {model for model, _ in self.live.values()}


# -- when to reload, when to give up ---------------------------------------------------------
@dataclass(frozen=True)
class RestartPolicy:
    """Reload at once after a death; back off when a model keeps failing; give up when it fails
    more than ``max_failures`` times within ``window_s`` (a death and a failed load each count).
    """

    max_failures: int = 5
    window_s: float = 60.0
    first_delay_s: float = 1.0
    """The wait before the second reload within the window; it doubles with each failure."""
    max_delay_s: float = 16.0
    load_timeout_s: float = 300.0
    """A reload still running after this long gives up at once: Triton 2.51 never finishes a
    load whose stub cannot start at all (a model file gone), and queues later loads behind it."""

    def delay(self, failures: int) -> float:
        """Seconds to wait before reloading, after the ``failures``-th failure in the window."""
        if failures <= 1:
            return 0.0
        return min(self.max_delay_s, self.first_delay_s * 2 ** (failures - 2))

    @classmethod
    def from_environment(cls, environ: dict[str, str] | os._Environ) -> RestartPolicy:
        default = cls()
        try:
            return cls(
                max_failures=int(environ.get("TRITON_BUILDER_HEAL_MAX_FAILURES",
                                             default.max_failures)),
                window_s=float(environ.get("TRITON_BUILDER_HEAL_WINDOW_S", default.window_s)),
                max_delay_s=float(environ.get("TRITON_BUILDER_HEAL_MAX_DELAY_S",
                                              default.max_delay_s)),
                load_timeout_s=float(environ.get("TRITON_BUILDER_HEAL_LOAD_TIMEOUT_S",
                                                 default.load_timeout_s)))
        except ValueError as error:
            raise SystemExit(f"triton-builder supervisor: bad TRITON_BUILDER_HEAL_* setting: "
                             f"{error}") from None


@dataclass
class ModelRecord:
    """One model's failures in the window and its next reload."""

    failures: deque = field(default_factory=deque)
    dead: list[tuple[int, int]] = field(default_factory=list)
    """Identities of its stubs that died since the last successful reload."""
    due: float | None = None
    """When to reload (monotonic seconds), None when nothing is pending."""
    loading: bool = False
    died_at: float | None = None
    """When the first death of the pending heal was seen (monotonic), for the log."""

    def fail(self, now: float, policy: RestartPolicy) -> float | None:
        """Count a failure at ``now``; the reload's due time, or None to give up."""
        self.failures.append(now)
        while self.failures and self.failures[0] < now - policy.window_s:
            self.failures.popleft()
        if len(self.failures) > policy.max_failures:
            return None
        return now + policy.delay(len(self.failures))


# -- talking to Triton -----------------------------------------------------------------------
class LoadTimeout(Exception):
    """Triton did not answer a load within the policy's ``load_timeout_s``."""


def load_model(http_port: int, model: str, timeout: float,
               admin_key: str | None = None) -> str | None:
    """Reload ``model`` with the configuration it runs with: None once loaded, else Triton's
    reason (its first line). Raises :class:`LoadTimeout` when Triton does not answer within
    ``timeout``.

    Why the configuration goes along, stamped: Triton turns a ``load`` of a loaded model into a
    reload only when something changed — its files (the python backend's ``__pycache__`` made
    the pipeline model look changed once; an ONNX model never does, and its load returned at
    once with the dead stub in place) or the configuration the load carries, compared with the
    previous load's. So the supervisor sends the model's own configuration with one parameter
    added, :data:`RELOAD_PARAMETER`, whose value differs on every reload. Until the new
    instances are ready the old version keeps its place, so the model never becomes unknown to
    its BLS callers. ``admin_key`` opens the repository API where it is locked."""
    base = f"http://127.0.0.1:{http_port}/v2"
    try:
        config = json.loads(_http(f"{base}/models/{model}/config", None, timeout, admin_key))
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + f" {time.monotonic_ns()}"
        config.setdefault("parameters", {})[RELOAD_PARAMETER] = {"string_value": stamp}
        body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
        _http(f"{base}/repository/models/{model}/load", body, timeout, admin_key)
    except urllib.error.HTTPError as error:
        try:
            detail = json.loads(error.read() or b"{}").get("error", "")
        except ValueError:
            detail = ""
        first = detail.splitlines()[0] if detail else ""
        return f"{error.url.split('/v2/', 1)[-1]} answered {error.code}: {first}".rstrip(": ")
    except TimeoutError:
        raise LoadTimeout(f"no answer to the load within {timeout:g}s") from None
    except (urllib.error.URLError, OSError) as error:
        if isinstance(getattr(error, "reason", None), TimeoutError):
            raise LoadTimeout(f"no answer to the load within {timeout:g}s") from None
        return f"load failed: {getattr(error, 'reason', error)}"
    return None


def _http(url: str, body: bytes | None, timeout: float, admin_key: str | None) -> bytes:
    headers = {"Content-Type": "application/json"}
    if admin_key:
        headers[ADMIN_KEY_HEADER] = admin_key
    request = urllib.request.Request(url, data=body, method="POST" if body else "GET",
                                     headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def locked_command(command: list[str], key: str) -> list[str]:
    """``command`` with :data:`ADMIN_APIS` restricted to the header :data:`ADMIN_KEY_HEADER`
    carrying ``key``, over HTTP and gRPC. Raises ValueError, naming them, where the command
    restricts one of those APIs already (Triton refuses an API in two groups)."""
    taken = sorted({api for arg in command
                    for option in ("--http-restricted-api", "--grpc-restricted-protocol")
                    if arg.startswith(f"{option}=")
                    for api in arg.split("=", 1)[1].split(":", 1)[0].split(",")
                    if api in ADMIN_APIS})
    if taken:
        raise ValueError(f"the server's flags restrict {', '.join(taken)} already, which the "
                         f"image locks itself: drop those from the flags and set "
                         f"{ADMIN_KEY_VARIABLE} to choose the key")
    apis = ",".join(ADMIN_APIS)
    return [*command, f"--http-restricted-api={apis}:{ADMIN_KEY_HEADER}={key}",
            f"--grpc-restricted-protocol={apis}:{ADMIN_KEY_HEADER}={key}"]


def admin_key(environ: dict[str, str] | os._Environ) -> tuple[str, str]:
    """The key of the locked APIs and where it came from: the operator's
    :data:`ADMIN_KEY_VARIABLE`, else a new random one."""
    chosen = environ.get(ADMIN_KEY_VARIABLE, "")
    if not chosen:
        return secrets.token_urlsafe(32), "a key made at start"
    if not ADMIN_KEY.fullmatch(chosen):
        raise ValueError(f"{ADMIN_KEY_VARIABLE} must be 16 to 256 characters of letters, digits "
                         f"and ._~+/- (it travels in a header)")
    return chosen, f"the operator's key ({ADMIN_KEY_VARIABLE})"


def server_option(command: list[str], name: str) -> str | None:
    """The value of ``--name=value`` (or ``--name value``) in the server's command."""
    for index, arg in enumerate(command):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name and index + 1 < len(command):
            return command[index + 1]
    return None


# -- the supervisor --------------------------------------------------------------------------
class Supervisor:
    """Watches one server's stubs and heals them; :meth:`run` is the watching thread."""

    def __init__(self, server_pid: int, http_port: int, policy: RestartPolicy, *,
                 heal: bool = True, reload: bool = True, admin_key: str | None = None,
                 proc: Path = Path("/proc"), healed_path: Path = health.HEALED_STUBS,
                 shared_memory: Path = SHARED_MEMORY) -> None:
        self.watch = StubWatch(server_pid, proc)
        self.http_port = http_port
        self.policy = policy
        self.heal = heal
        self.reload = reload
        """Heal by reloading the model (explicit model control), else by restarting the server."""
        self.shared_memory = shared_memory
        self.admin_key = admin_key
        self.restart_requested = False
        """A server stopped to heal its stubs (``reload`` off): start it again when it exits."""
        self.draining = False
        """The replica is stopping: no more heals."""
        self.kill_timer: threading.Timer | None = None
        """SIGKILL for a server stopped to heal that does not exit in time; cancelled by
        :meth:`follow` (its pid may be another process's by then)."""
        self.healed_path = healed_path
        self.records: dict[str, ModelRecord] = {}
        self.restarts: dict[str, int] = {}
        self.deaths: dict[str, int] = {}
        self.healed: set[tuple[int, int]] = set()
        self.server_crashes: deque = deque()
        self.server_restarts = 0
        self.generation = 0
        """Counts the servers followed: a reload started for an earlier one is dropped."""
        self.gave_up: str | None = None
        """Why the supervisor gave up, once it has."""
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def follow(self, server_pid: int) -> None:
        """Watch a server started again: its stubs start afresh. After a crash its models do
        too; after a restart that healed stubs, each model keeps its failures in the window
        (a model that kills its stub again and again still makes the supervisor give up)."""
        with self.lock:
            if self.kill_timer is not None:
                self.kill_timer.cancel()
                self.kill_timer = None
            healing = self.restart_requested
            self.watch = StubWatch(server_pid, self.watch.proc)
            if healing:
                for model, record in self.records.items():
                    if record.dead:
                        self.restarts[model] = self.restarts.get(model, 0) + 1
                    record.dead, record.due, record.loading, record.died_at = [], None, False, None
            else:
                self.records.clear()
            self.restart_requested = False
            self.healed.clear()
            self.generation += 1
            self._write_healed()

    def server_crashed(self, why: str, now: float) -> bool:
        """Count a crash of the server at ``now``: True to start it again, False to give up."""
        with self.lock:
            self.server_crashes.append(now)
            while self.server_crashes and self.server_crashes[0] < now - self.policy.window_s:
                self.server_crashes.popleft()
            if not self.heal or len(self.server_crashes) > self.policy.max_failures:
                return False
            self.server_restarts += 1
        removed = remove_regions(self.watch.regions)
        log(f"the server {why}; starting it again (server restart {self.server_restarts}, "
            f"crash {len(self.server_crashes)} of {self.policy.max_failures} allowed within "
            f"{self.policy.window_s:g}s; {removed} shared memory regions of its stubs removed)")
        return True

    def run(self) -> None:
        while not self.stopped.is_set() and self.gave_up is None:
            self.step(time.monotonic())
            self.stopped.wait(SCAN_INTERVAL_S)

    def step(self, now: float) -> None:
        """One scan: record deaths, start the reloads (or the server restart) that are due."""
        if self.restart_requested or self.draining:  # its stubs end with it
            return
        deaths = self.watch.scan()
        with self.lock:
            for model in self.watch.models():
                self.restarts.setdefault(model, 0)
                self.deaths.setdefault(model, 0)
            for death in deaths:
                self._died(death, now)
            if not self.heal:
                return
            due = [model for model, record in self.records.items()
                   if record.due is not None and record.due <= now and not record.loading]
            if due and self.gave_up is None and (not self.reload or self._shared_memory_short()):
                self._restart_server(due)
                return
            for model in due:
                record = self.records[model]
                record.loading, record.due = True, None
                threading.Thread(target=self._reload,
                                 args=(model, list(record.dead), self.generation),
                                 daemon=True).start()

    def _shared_memory_short(self) -> bool:
        """Whether ``/dev/shm`` may lack room for the new stubs of a reload.

        Why: when a stub is killed while it holds requests, Triton 2.51's python backend keeps
        the dead stub's region mapped for good (measured: one 4 MiB region more in use after
        each such heal under load; its name removed, the memory stays taken). Under Docker's
        default 64 MB ``/dev/shm`` about a dozen such heals leave no room, and every reload then
        fails ("Unable to initialize shared memory key ... No space left on device"). A server
        started again maps only what its new stubs need, so below :data:`SHM_RESERVE` region
        sizes of free space the heal restarts the server instead of reloading one model."""
        try:
            free = shutil.disk_usage(self.shared_memory).free
        except OSError:
            return False
        return free < SHM_RESERVE * max(self.watch.region_bytes, 1 << 20)

    def _restart_server(self, models: list[str]) -> None:
        """Heal where the repository API is closed: stop the server (SIGTERM, then SIGKILL after
        :data:`HEAL_STOP_GRACE_S`) so that :func:`main` starts it again and calls
        :meth:`follow`."""
        self.restart_requested = True
        self.server_restarts += 1
        why = ("the repository API is closed" if not self.reload else
               f"{self.shared_memory} is nearly full of the dead stubs' regions, which only a "
               f"new server frees")
        log(f"model{'s' if len(models) > 1 else ''} {', '.join(map(repr, sorted(models)))}: "
            f"restarting the server to heal {'them' if len(models) > 1 else 'it'} ({why}; "
            f"server restart {self.server_restarts})")
        pid = self.watch.server_pid
        _forward(pid, signal.SIGTERM)
        self.kill_timer = threading.Timer(HEAL_STOP_GRACE_S, _forward, (pid, signal.SIGKILL))
        self.kill_timer.daemon = True
        self.kill_timer.start()

    def _died(self, death: Death, now: float) -> None:
        self.deaths[death.model] = self.deaths.get(death.model, 0) + 1
        record = self.records.setdefault(death.model, ModelRecord())
        record.dead.append(death.stub.identity)
        record.died_at = record.died_at or now
        if not self.heal:
            log(f"model {death.model!r}: stub pid {death.stub.pid} ({death.instance}) "
                f"{death.why}; healing is off")
            return
        due = record.fail(now, self.policy)
        if due is None:
            self._give_up(death.model, f"its stub died again ({death.why})")
            return
        if not record.loading:
            record.due = due if record.due is None else min(record.due, due)
        else:  # the reload in flight may have started before this death: reload once more
            record.due = due
        log(f"model {death.model!r}: stub pid {death.stub.pid} ({death.instance}) {death.why}; "
            f"{'reloading' if self.reload else 'restarting the server'} {self._when(due, now)} "
            f"(failure {len(record.failures)} of {self.policy.max_failures} allowed within "
            f"{self.policy.window_s:g}s)")

    def _reload(self, model: str, dead: list[tuple[int, int]], generation: int) -> None:
        """Reload ``model``; on success its stubs in ``dead`` (dead before the load) are healed."""
        started = time.monotonic()
        try:
            problem = load_model(self.http_port, model, self.policy.load_timeout_s,
                                 self.admin_key)
        except LoadTimeout as stuck:
            with self.lock:
                if generation == self.generation:
                    self._give_up(model, f"the server is stuck loading it ({stuck})",
                                  at_once=True)
            return
        now = time.monotonic()
        with self.lock:
            if generation != self.generation:  # the server crashed meanwhile
                return
            record = self.records[model]
            record.loading = False
            if problem is None:
                self.restarts[model] = self.restarts.get(model, 0) + 1
                record.dead = [identity for identity in record.dead if identity not in dead]
                self.healed.update(dead)
                self._write_healed()
                since = now - (record.died_at or started)
                record.died_at = None if not record.dead else record.died_at
                log(f"model {model!r}: reloaded in {now - started:.1f}s, serving again "
                    f"{since:.1f}s after its stub was seen dead "
                    f"(restart {self.restarts[model]})")
                return
            due = record.fail(now, self.policy)
            if due is None:
                self._give_up(model, f"reloading it failed ({problem})")
                return
            record.due = due if record.due is None else min(record.due, due)
            log(f"model {model!r}: reload failed ({problem}); next try {self._when(due, now)} "
                f"(failure {len(record.failures)} of {self.policy.max_failures} allowed within "
                f"{self.policy.window_s:g}s)")

    def _give_up(self, model: str, why: str, at_once: bool = False) -> None:
        self.gave_up = (f"model {model!r}: {why}" if at_once else
                        f"model {model!r} failed more than {self.policy.max_failures} times "
                        f"within {self.policy.window_s:g}s, last: {why}")
        log(f"giving up: {self.gave_up}; stopping the server so that a restart policy starts "
            f"a fresh container (exit status {GAVE_UP})")
        _forward(self.watch.server_pid, signal.SIGTERM)
        timer = threading.Timer(STOP_GRACE_S, _forward, (self.watch.server_pid, signal.SIGKILL))
        timer.daemon = True
        timer.start()

    def _write_healed(self) -> None:
        """Keep only the healed stubs that are still zombies (a reaped pid may come back)."""
        current = {p.identity for p in health.processes(self.watch.proc) if p.state == "Z"}
        self.healed &= current
        temporary = self.healed_path.with_name(f".{self.healed_path.name}.{os.getpid()}")
        try:
            temporary.write_text(json.dumps(sorted(self.healed)))
            os.replace(temporary, self.healed_path)
        except OSError as error:
            log(f"cannot write {self.healed_path} ({error}): the health check will count the "
                "healed stubs as dead")

    @staticmethod
    def _when(due: float, now: float) -> str:
        return "now" if due <= now else f"in {due - now:.1f}s"

    def readiness(self) -> tuple[int, str]:
        """What ``/v2/health/ready`` answers: 503 while draining, else Triton's answer."""
        if self.draining:
            return 503, "draining: this replica is stopping\n"
        try:
            _http(f"http://127.0.0.1:{self.http_port}{READY_PATH}", None, 2.0, None)
        except urllib.error.HTTPError as error:
            return 503, f"not ready: Triton answered {error.code}\n"
        except OSError as error:
            return 503, f"not ready: {error}\n"
        return 200, "ready\n"

    def metrics(self) -> str:
        """Prometheus text exposition of the restart and death counters."""
        with self.lock:
            restarts, deaths = dict(self.restarts), dict(self.deaths)
            server_restarts = self.server_restarts
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


def remove_regions(regions: set[str], directory: Path = SHARED_MEMORY) -> int:
    """Remove the named shared memory regions a crashed server's stubs used; how many were
    there. Only those: with ``--ipc=host`` other servers' regions share the directory."""
    removed = 0
    for region in regions:
        try:
            (directory / region.lstrip("/")).unlink()
            removed += 1
        except OSError:
            pass
    regions.clear()
    return removed


def serve_metrics(supervisor: Supervisor, port: int) -> http.server.ThreadingHTTPServer:
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


def exit_code(wait_status: int) -> int:
    """A shell's ``$?`` for a child's wait status: its exit code, or 128 + the signal.
    (Not ``os.waitstatus_to_exitcode``: the Python of an Ubuntu 20.04 release image is 3.8.)"""
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


SUPERVISOR_OPTIONS = {"--lock-admin-apis": "start the server with ADMIN_APIS behind a key"}
"""The supervisor's own flags, before the server's command."""


def drain_periods(environ: dict[str, str] | os._Environ) -> tuple[float, float]:
    """``(drain, finish)`` seconds: :data:`DRAIN_S` and :data:`FINISH_S` unless set."""
    try:
        periods = (float(environ.get("TRITON_BUILDER_DRAIN_S", DRAIN_S)),
                   float(environ.get("TRITON_BUILDER_DRAIN_FINISH_S", FINISH_S)))
    except ValueError as error:
        raise SystemExit(f"triton-builder supervisor: bad TRITON_BUILDER_DRAIN_* setting: "
                         f"{error}") from None
    if min(periods) < 0:
        raise SystemExit("triton-builder supervisor: TRITON_BUILDER_DRAIN_* settings are "
                         "seconds, 0 or more")
    return periods


class Drain:
    """A stop that drains (see the module's docstring), run once in a thread of its own; when
    it is done the server is killed and :attr:`done` is set."""

    def __init__(self, supervisor: Supervisor, drain_s: float, finish_s: float,
                 directory: Path | None = None) -> None:
        self.supervisor, self.drain_s, self.finish_s = supervisor, drain_s, finish_s
        self.directory = directory
        self.started = threading.Event()
        self.done = threading.Event()

    def start(self) -> None:
        if self.started.is_set():
            return
        self.started.set()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        began = time.monotonic()
        self.supervisor.draining = True
        drain.announce(drain.DRAINING, self.directory)
        log(f"draining: not ready any more, serving on for {self.drain_s:g}s")
        time.sleep(self.drain_s)
        drain.announce(drain.CLOSING, self.directory)
        held = drain.in_flight(self.directory)
        log(f"closing: new requests are answered UNAVAILABLE; {held} in flight")
        deadline = time.monotonic() + self.finish_s
        while held > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
            held = drain.in_flight(self.directory)
        log(("every request in flight answered" if held == 0 else
             f"{held} requests still in flight after {self.finish_s:g}s")
            + f"; stopping the server {time.monotonic() - began:.1f}s after the stop began")
        self.done.set()
        _forward(self.supervisor.watch.server_pid, signal.SIGKILL)


def request_drain(environ: dict[str, str] | os._Environ, pid: int = 1) -> int:
    """``supervisor.py --drain``, a Kubernetes ``preStop`` hook: start the drain of the
    supervisor at ``pid`` and return when the replica closes (its drain period is over), so
    that the kubelet's SIGTERM, which follows, finds it closing already."""
    drain_s, _ = drain_periods(environ)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return 0
    deadline = time.monotonic() + drain_s + 10
    while not drain.closing() and time.monotonic() < deadline:
        time.sleep(0.1)
    return 0


def main(argv: list[str] | None = None) -> int:
    command = list(sys.argv[1:] if argv is None else argv)
    environ = os.environ
    if command == ["--drain"]:
        return request_drain(environ)
    own = []
    while command and command[0] in SUPERVISOR_OPTIONS:
        own.append(command.pop(0))
    if command[:1] == ["--"]:
        command = command[1:]
    if not command or command[0].startswith("--"):
        print("usage: supervisor.py [--lock-admin-apis] [--] tritonserver [FLAG...]\n"
              "       supervisor.py --drain", file=sys.stderr)
        return 2
    policy = RestartPolicy.from_environment(environ)
    drain_s, finish_s = drain_periods(environ)
    key = None
    if "--lock-admin-apis" in own:
        try:
            key, whose = admin_key(environ)
            command = locked_command(command, key)
        except ValueError as error:
            log(f"cannot start: {error}")
            return 2
        log(f"administrative APIs ({', '.join(ADMIN_APIS)}) locked over HTTP and gRPC behind "
            f"the header {ADMIN_KEY_HEADER!r}, with {whose}")
    drain.reset()
    server_environment = {name: value for name, value in environ.items()
                          if name != ADMIN_KEY_VARIABLE}
    server_environment[drain.STATE_DIR_VARIABLE] = str(drain.STATE_DIR)
    mode = server_option(command, "--model-control-mode")
    heal = environ.get("TRITON_BUILDER_HEAL", "on").lower() not in ("off", "0", "false", "no")
    reload = mode == "explicit"
    if heal and not reload:
        log(f"healing by restarting the server: it runs with --model-control-mode="
            f"{mode or 'none'}, and only 'explicit' lets one model be reloaded")
    http_port = int(server_option(command, "--http-port") or 8000)

    server = subprocess.Popen(command, env=server_environment)
    stopping = threading.Event()
    supervisor = Supervisor(server.pid, http_port, policy, heal=heal, reload=reload,
                            admin_key=key)
    stop = Drain(supervisor, drain_s, finish_s)

    def forward(received: int, frame: object) -> None:
        if received in STOPPING_SIGNALS:
            stopping.set()
        _forward(server.pid, received)

    def drain_then_stop(received: int, frame: object) -> None:
        stopping.set()
        stop.start()

    for number in FORWARDED_SIGNALS:
        signal.signal(number, forward)
    signal.signal(signal.SIGTERM, drain_then_stop)
    metrics_port = int(environ.get("TRITON_BUILDER_METRICS_PORT", METRICS_PORT))
    if metrics_port:
        try:
            serve_metrics(supervisor, metrics_port)
        except OSError as error:
            log(f"no metrics endpoint on port {metrics_port}: {error}")
    threading.Thread(target=supervisor.run, daemon=True).start()
    log(f"started {command[0]} (pid {server.pid}); healing "
        + (f"on: {policy.max_failures} failures allowed per model within {policy.window_s:g}s"
           if heal else "off")
        + f"; a stop drains for {drain_s:g}s"
        + (f"; metrics and readiness on :{metrics_port}" if metrics_port else ""))

    while True:
        status = _reap_until(server.pid)
        if stopping.is_set() or supervisor.gave_up is not None:
            break
        if supervisor.restart_requested:
            removed = remove_regions(supervisor.watch.regions)
            log(f"the server stopped (status {exit_code(status)}) to heal its stubs; starting "
                f"it again ({removed} shared memory regions of its stubs removed)")
        else:
            crash = crash_signal(status)
            if crash is None or not supervisor.server_crashed(f"was killed by {crash.name}",
                                                              time.monotonic()):
                break
        drain.reset()
        server = subprocess.Popen(command, env=server_environment)
        supervisor.follow(server.pid)
        log(f"started {command[0]} again (pid {server.pid})")
    supervisor.stopped.set()
    code = exit_code(status)
    if supervisor.gave_up is not None:
        log(f"server stopped (status {code}) after giving up; exiting {GAVE_UP}")
        return GAVE_UP
    if stop.started.is_set() and not stop.done.is_set():  # it ended before the drain did
        log(f"server exited with status {code} while draining")
        return code
    if stop.done.is_set():
        log("server stopped after draining; exiting 0")
        return 0
    log(f"server exited with status {code}")
    return code


def crash_signal(wait_status: int) -> signal.Signals | None:
    """The crash signal that ended a server (see :data:`CRASH_SIGNALS`), else None."""
    if os.WIFSIGNALED(wait_status) and os.WTERMSIG(wait_status) in CRASH_SIGNALS:
        return signal.Signals(os.WTERMSIG(wait_status))
    return None


def _forward(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def _reap_until(pid: int) -> int:
    """Reap every child (orphans are ours as PID 1) until ``pid`` exits; its wait status."""
    while True:
        try:
            reaped, status = os.waitpid(-1, 0)
        except ChildProcessError:  # gone without our wait: cannot happen, but never spin
            return 0
        if reaped == pid:
            return status


if __name__ == "__main__":
    sys.exit(main())
