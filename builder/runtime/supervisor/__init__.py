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

Ready means warm (:mod:`.ready_gate`): where the image carries a ready gate (its server under
explicit model control), the server starts with the gate's repository beside the image's and
``--exit-on-error=false``, and is not ready until the supervisor has sent the pipeline's
examples through Triton's HTTP front end and opened the gate; a model that failed to load, or
an example that failed, stops the server and the supervisor exits 1, naming it.

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
endpoint off), ``TRITON_BUILDER_HEALED_STUBS`` (the file shared with the health check),
``TRITON_BUILDER_READY_GATE`` (the ready gate's repository; a path without one: no gate).
Copied into the image as ``/opt/triton-builder/supervisor/`` beside ``health.py`` and
``drain.py``, with its ``__main__`` as ``/opt/triton-builder/supervisor.py``, and run with the
image's own ``python3`` (standard library only, Python 3.8 and later)::

    python3 /opt/triton-builder/supervisor.py --lock-admin-apis tritonserver \\
        --model-repository=/models --model-control-mode=explicit --load-model=* ...

The modules, one concern each: ``watch`` (which stub serves which model, which died),
``policy`` (when to reload, when to give up), ``admin_api`` (the repository API, readiness, the
key that locks the administrative APIs), ``healer`` (:class:`Supervisor`, the one owner of the
healing's state), ``metrics`` (the endpoint on port 8003), ``stop_drain`` (a stop that drains),
``reaper`` (PID 1: signals, orphans, exit status), ``ready_gate`` (readiness held until the
pipeline's examples went through the front end), ``main`` (the process).
"""

from .admin_api import (
    ADMIN_APIS,
    ADMIN_KEY,
    ADMIN_KEY_HEADER,
    ADMIN_KEY_VARIABLE,
    GRPC_ADMIN_KEY_HEADER,
    READY_PATH,
    RELOAD_PARAMETER,
    LoadTimeout,
    admin_key,
    load_model,
    locked_command,
    server_option,
)
from .healer import GAVE_UP, HEAL_STOP_GRACE_S, SCAN_INTERVAL_S, STOP_GRACE_S, Supervisor
from .main import SUPERVISOR_OPTIONS, main
from .metrics import METRICS_PORT, serve_metrics
from .policy import ModelRecord, RestartPolicy
from .ready_gate import GATE_MODEL, READY_GATE_DIR, READY_GATE_VARIABLE, GateError, ReadyGate
from .reaper import CRASH_SIGNALS, FORWARDED_SIGNALS, crash_signal, exit_code
from .stop_drain import DRAIN_S, FINISH_S, Drain, drain_periods, request_drain
from .watch import Death, StubWatch, describe_exit, remove_regions, stub_model

__all__ = [
    "ADMIN_APIS", "ADMIN_KEY", "ADMIN_KEY_HEADER", "ADMIN_KEY_VARIABLE", "CRASH_SIGNALS",
    "DRAIN_S", "FINISH_S", "FORWARDED_SIGNALS", "GATE_MODEL", "GAVE_UP", "GRPC_ADMIN_KEY_HEADER",
    "HEAL_STOP_GRACE_S", "METRICS_PORT", "READY_GATE_DIR", "READY_GATE_VARIABLE", "READY_PATH",
    "RELOAD_PARAMETER", "SCAN_INTERVAL_S", "STOP_GRACE_S", "SUPERVISOR_OPTIONS", "Death", "Drain",
    "GateError", "LoadTimeout", "ModelRecord", "ReadyGate", "RestartPolicy", "StubWatch",
    "Supervisor", "admin_key", "crash_signal", "describe_exit", "drain_periods", "exit_code",
    "load_model", "locked_command", "main", "remove_regions", "request_drain", "serve_metrics",
    "server_option", "stub_model",
]
