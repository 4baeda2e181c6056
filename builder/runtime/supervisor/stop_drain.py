"""A stop that drains: not ready at once, serving on for the drain period, then closing, the
requests in flight answered before the server is killed (see the package's docstring)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .log import log
from .reaper import forward_signal

try:  # builder.runtime.supervisor
    from .. import drain
except ImportError:  # in the image: drain.py beside the package
    import drain  # type: ignore[no-redef]

DRAIN_S = 5.0
"""How long a stopping replica goes on serving after its readiness failed: long enough for a
Kubernetes Service's endpoints and a balancer's health checks to drop it (a few seconds), short
enough that Docker's default 10 s before SIGKILL still fits the whole stop."""
FINISH_S = 20.0
"""How long the requests a closing replica holds may take to be answered before the server is
killed anyway. The grace periods of the manifests cover ``DRAIN_S + FINISH_S``."""
FLUSH_S = 0.3
"""After the last request in flight is answered, how long the server lives on before it is
killed: a model hands its responses to the server, whose frontends write them to the sockets
on threads of their own (a stream's last items and its final flag among them)."""


def drain_periods(environ: Mapping[str, str]) -> tuple[float, float]:
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

    def __init__(self, supervisor: Any, drain_s: float, finish_s: float,
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
        self.supervisor.start_draining()
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
        if held == 0:
            time.sleep(FLUSH_S)
        log(("every request in flight answered" if held == 0 else
             f"{held} requests still in flight after {self.finish_s:g}s")
            + f"; stopping the server {time.monotonic() - began:.1f}s after the stop began")
        self.done.set()
        forward_signal(self.supervisor.server_pid(), signal.SIGKILL)


def request_drain(environ: Mapping[str, str], pid: int = 1) -> int:
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
