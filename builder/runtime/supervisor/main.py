"""``supervisor.py``: start the server, supervise it, and stop as the container must."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .admin_api import (
    ADMIN_APIS,
    ADMIN_KEY_HEADER,
    ADMIN_KEY_VARIABLE,
    admin_key,
    locked_command,
    server_option,
)
from .healer import GAVE_UP, Supervisor
from .log import log
from .metrics import METRICS_PORT, serve_metrics
from .policy import RestartPolicy
from .ready_gate import GateError, ReadyGate, gate_directory, gated_command, why_not_gated
from .reaper import (
    FORWARDED_SIGNALS,
    STOPPING_SIGNALS,
    crash_signal,
    exit_code,
    forward_signal,
    reap_until,
)
from .stop_drain import Drain, drain_periods, request_drain
from .weights_fetch import ensure_weights
from .weights_lock import (
    CACHE_DIR,
    CACHE_VARIABLE,
    LOCK_PATH,
    LOCK_VARIABLE,
    WeightsError,
    read_lock,
)

try:  # builder.runtime.supervisor
    from .. import drain
except ImportError:  # in the image: drain.py beside the package
    import drain  # type: ignore[no-redef]

SUPERVISOR_OPTIONS = {"--lock-admin-apis": "start the server with ADMIN_APIS behind a key"}
"""The supervisor's own flags, before the server's command."""
WEIGHTS_FAILED = 78
"""The exit status when the weights could not be put in place (``EX_CONFIG``)."""


def put_weights_in_place(environ: Mapping[str, str]) -> int | None:
    """Fill the weights cache from the image's lock, if it has one (an image whose weights
    travel beside it), before anything listens: the container is not ready until every file
    is in place and checked. A stop meanwhile ends the container at once. Returns the exit
    status of a failure, None when the server may start."""
    lock_path = environ.get(LOCK_VARIABLE, LOCK_PATH)
    if not os.path.exists(lock_path):
        return None
    previous = signal.signal(signal.SIGTERM, lambda received, frame: sys.exit(128 + received))
    try:
        ensure_weights(read_lock(lock_path), cache=environ.get(CACHE_VARIABLE, CACHE_DIR),
                       environ=environ, log=log)
    except WeightsError as error:
        log(f"cannot start: {error}")
        return WEIGHTS_FAILED
    finally:
        signal.signal(signal.SIGTERM, previous)
    return None


USAGE = ("usage: supervisor.py [--lock-admin-apis] [--] tritonserver [FLAG...]\n"
         "       supervisor.py --drain\n"
         "       supervisor.py --fetch-weights")


def main(argv: list[str] | None = None) -> int:
    """The container's entrypoint. ``--drain`` (a ``preStop`` hook) and ``--fetch-weights``
    (an init container) do that and exit. Otherwise: the weights in place, the server's
    command and environment prepared (:class:`ServerLaunch`), then the server started and
    supervised until it stops for good; the status is the container's."""
    command = list(sys.argv[1:] if argv is None else argv)
    environ = os.environ
    if command == ["--drain"]:
        return request_drain(environ)
    if command == ["--fetch-weights"]:
        return put_weights_in_place(environ) or 0
    own = []
    while command and command[0] in SUPERVISOR_OPTIONS:
        own.append(command.pop(0))
    if command[:1] == ["--"]:
        command = command[1:]
    if not command or command[0].startswith("--"):
        print(USAGE, file=sys.stderr)
        return 2
    failed = put_weights_in_place(environ)
    if failed is not None:
        return failed
    try:
        launch = ServerLaunch.prepare(command, own, environ)
    except ValueError as error:
        log(f"cannot start: {error}")
        return 2
    return ServerRun(launch).run()


@dataclass(frozen=True)
class ServerLaunch:
    """How the server runs: its command (the administrative APIs locked where asked), its
    environment (without the key), how it heals, drains and reports."""

    command: list[str]
    environment: dict[str, str]
    policy: RestartPolicy
    drain_s: float
    finish_s: float
    key: str | None
    heal: bool
    reload: bool
    http_port: int
    metrics_port: int
    gate: ReadyGate | None = None

    @classmethod
    def prepare(cls, command: list[str], own: list[str],
                environ: Mapping[str, str]) -> ServerLaunch:
        """``ValueError`` for settings the server cannot start with."""
        policy = RestartPolicy.from_environment(environ)
        drain_s, finish_s = drain_periods(environ)
        key = None
        if "--lock-admin-apis" in own:
            key, whose = admin_key(environ)
            command = locked_command(command, key)
            log(f"administrative APIs ({', '.join(ADMIN_APIS)}) locked over HTTP and gRPC "
                f"behind the header {ADMIN_KEY_HEADER!r}, with {whose}")
        http_port = port_number("--http-port", server_option(command, "--http-port") or "8000")
        gate = None
        directory = gate_directory(environ)
        if directory is not None:
            why = why_not_gated(command)
            if why is None:
                command = gated_command(command, directory)
                gate = ReadyGate.prepare(directory, command, http_port, key, environ,
                                         policy.load_timeout_s)
            else:
                log(f"readiness is not held for the warm-up requests: {why}")
        environment = {name: value for name, value in environ.items()
                       if name != ADMIN_KEY_VARIABLE}
        environment[drain.STATE_DIR_VARIABLE] = str(drain.STATE_DIR)
        mode = server_option(command, "--model-control-mode")
        heal = environ.get("TRITON_BUILDER_HEAL", "on").lower() not in ("off", "0", "false",
                                                                          "no")
        reload = mode == "explicit"
        if heal and not reload:
            log(f"healing by restarting the server: it runs with --model-control-mode="
                f"{mode or 'none'}, and only 'explicit' lets one model be reloaded")
        return cls(command=command, environment=environment, policy=policy, drain_s=drain_s,
                   finish_s=finish_s, key=key, heal=heal, reload=reload, http_port=http_port,
                   metrics_port=port_number("TRITON_BUILDER_METRICS_PORT", environ.get(
                       "TRITON_BUILDER_METRICS_PORT", str(METRICS_PORT))), gate=gate)


def port_number(name: str, value: str) -> int:
    """``value`` as a TCP port (0: none, for the metrics port); ``ValueError`` naming ``name``
    for anything else."""
    if not value.isdigit() or int(value) > 65535:
        raise ValueError(f"{name} must be a port number (0 to 65535), not {value!r}")
    return int(value)


class ServerRun:
    """The server's process, started again in place when it stops to heal or crashes, and
    what decides: the healer (:class:`Supervisor`), the stop (:class:`Drain`), the signals."""

    def __init__(self, launch: ServerLaunch) -> None:
        self.launch = launch
        self.stopping = threading.Event()
        self.gate_failed = False
        drain.reset()
        self.server = self._start()
        self.supervisor = Supervisor(self.server.pid, launch.http_port, launch.policy,
                                     heal=launch.heal, reload=launch.reload,
                                     admin_key=launch.key)
        self.stop = Drain(self.supervisor, launch.drain_s, launch.finish_s)

    def run(self) -> int:
        """Supervise until the server stops for good; the container's exit status."""
        self._listen()
        status = self._until_stopped()
        self.supervisor.stop()
        return self._exit_status(exit_code(status))

    def _start(self) -> subprocess.Popen:
        """The server, and where its readiness is gated, the thread that opens it."""
        server = self.server = subprocess.Popen(self.launch.command, env=self.launch.environment)
        if self.launch.gate is not None:
            threading.Thread(target=self._open_gate, args=(server,), daemon=True).start()
        return server

    def _open_gate(self, server: subprocess.Popen) -> None:
        """Open the readiness of ``server`` (:mod:`ready_gate`); a failure is a failed start:
        the server stopped, the container's status 1, as Triton's own exit on a failed load."""
        assert self.launch.gate is not None
        try:
            sent = self.launch.gate.open(lambda: self._serving(server))
        except (GateError, OSError) as error:
            if not self._serving(server):
                return
            log(f"cannot start: {error}")
            self.gate_failed = True
            self.stopping.set()
            forward_signal(server.pid, signal.SIGTERM)
            return
        if sent is not None:
            log(f"ready: {sent}")

    def _serving(self, server: subprocess.Popen) -> bool:
        """``server`` is still the one supervised, runs (no zombie: it is reaped by the main
        thread alone) and is not being stopped."""
        if self.server is not server or self.stopping.is_set():
            return False
        try:
            stat = Path(f"/proc/{server.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")

    def _listen(self) -> None:
        """Signals, the metrics and readiness endpoint, the healer's thread."""
        launch, server = self.launch, self.server

        def forward(received: int, frame: object) -> None:
            if received in STOPPING_SIGNALS:
                self.stopping.set()
            forward_signal(self.server.pid, received)

        def drain_then_stop(received: int, frame: object) -> None:
            self.stopping.set()
            self.stop.start()

        for number in FORWARDED_SIGNALS:
            signal.signal(number, forward)
        signal.signal(signal.SIGTERM, drain_then_stop)
        if launch.metrics_port:
            try:
                serve_metrics(self.supervisor, launch.metrics_port)
            except OSError as error:
                log(f"no metrics endpoint on port {launch.metrics_port}: {error}")
        threading.Thread(target=self.supervisor.run, daemon=True).start()
        policy = launch.policy
        log(f"started {launch.command[0]} (pid {server.pid}); healing "
            + (f"on: {policy.max_failures} failures allowed per model within "
               f"{policy.window_s:g}s" if launch.heal else "off")
            + f"; a stop drains for {launch.drain_s:g}s"
            + (f"; metrics and readiness on :{launch.metrics_port}"
               if launch.metrics_port else ""))

    def _until_stopped(self) -> int:
        """Reap the server; start it again where it stopped to heal, or crashed and may be
        started again. The wait status it stopped for good with."""
        while True:
            status = reap_until(self.server.pid)
            if self.stopping.is_set() or self.supervisor.given_up() is not None:
                return status
            if self.supervisor.restart_pending():
                removed = self.supervisor.forget_regions()
                log(f"the server stopped (status {exit_code(status)}) to heal its stubs; "
                    f"starting it again ({removed} shared memory regions of its stubs "
                    "removed)")
            else:
                crash = crash_signal(status)
                if crash is None or not self.supervisor.server_crashed(
                        f"was killed by {crash.name}", time.monotonic()):
                    return status
            drain.reset()
            self.server = self._start()
            self.supervisor.follow(self.server.pid)
            log(f"started {self.launch.command[0]} again (pid {self.server.pid})")

    def _exit_status(self, code: int) -> int:
        if self.gate_failed:
            log(f"server stopped (status {code}) after a failed start; exiting 1")
            return 1
        if self.supervisor.given_up() is not None:
            log(f"server stopped (status {code}) after giving up; exiting {GAVE_UP}")
            return GAVE_UP
        if self.stop.started.is_set() and not self.stop.done.is_set():  # ended mid-drain
            log(f"server exited with status {code} while draining")
            return code
        if self.stop.done.is_set():
            log("server stopped after draining; exiting 0")
            return 0
        log(f"server exited with status {code}")
        return code
