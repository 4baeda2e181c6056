"""``supervisor.py``: start the server, supervise it, and stop as the container must."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

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



def main(argv: list[str] | None = None) -> int:  # noqa: C901 - issue 68: to be split
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
        print("usage: supervisor.py [--lock-admin-apis] [--] tritonserver [FLAG...]\n"
              "       supervisor.py --drain\n"
              "       supervisor.py --fetch-weights", file=sys.stderr)
        return 2
    failed = put_weights_in_place(environ)
    if failed is not None:
        return failed
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
        forward_signal(server.pid, received)

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
        status = reap_until(server.pid)
        if stopping.is_set() or supervisor.given_up() is not None:
            break
        if supervisor.restart_pending():
            removed = supervisor.forget_regions()
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
    supervisor.stop()
    code = exit_code(status)
    if supervisor.given_up() is not None:
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
