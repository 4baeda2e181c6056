"""A replica's orderly stop, as the processes that take part in it see it.

Why: on SIGTERM Triton stops its schedulers, waits for the requests in flight, then unloads
every model while its endpoints still accept requests — for the seconds that takes, a client is
told ``NOT_FOUND: ... has no available versions`` (a client error, which no retry policy
retries), and a pipeline request in flight that calls another model over BLS is refused by that
model's stopped scheduler. So the image's supervisor (:mod:`builder.runtime.supervisor`) never
lets Triton stop by itself; it drains, in three steps that the other processes see through files
in :data:`STATE_DIR` (under ``/tmp``, which every container has writable, read-only ones too, and
which, unlike ``/dev/shm``, no other container shares):

1. *draining* (:data:`DRAINING`): readiness fails at once — the health check, the supervisor's
   readiness endpoint — while everything is still served, so that load balancers take the
   replica out of rotation;
2. *closing* (:data:`CLOSING`), after the drain period: the pipeline model answers each new
   request ``UNAVAILABLE`` (HTTP 503: send it again, elsewhere) and finishes the ones it holds,
   which count themselves in :class:`InFlight`;
3. when none is left, the supervisor kills the server: a request that still comes is refused
   by the closed port (``UNAVAILABLE`` again), never ``NOT_FOUND``.

Standard library only: copied into the image beside the supervisor and into the pipeline
model's directory (``triton_builder_drain.py``), and loaded on Python 3.8.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from pathlib import Path

STATE_DIR_VARIABLE = "TRITON_BUILDER_DRAIN_DIR"
STATE_DIR = Path(os.environ.get(STATE_DIR_VARIABLE, "/tmp/triton-builder-drain"))
"""Set by the supervisor for its server, whose stubs inherit it: a model that finds the variable
unset runs without a supervisor (a host ``tritonserver``), and takes no part in a drain."""
DRAINING = "triton-builder-draining"
CLOSING = "triton-builder-closing"
COUNTER_PREFIX = "triton-builder-in-flight-"
"""Followed by the pid of the process whose requests the file counts."""
_COUNT = struct.Struct("q")


def supervised() -> bool:
    """Whether this process runs under the supervisor, which drains it."""
    return STATE_DIR_VARIABLE in os.environ


def closing(directory: Path | None = None) -> bool:
    return ((directory or STATE_DIR) / CLOSING).exists()


def draining(directory: Path | None = None) -> bool:
    return ((directory or STATE_DIR) / DRAINING).exists()


def announce(name: str, directory: Path | None = None) -> None:
    """Enter a step (:data:`DRAINING`, :data:`CLOSING`): every process sees it from now on."""
    ((directory or STATE_DIR) / name).touch()


def reset(directory: Path | None = None) -> None:
    """An empty state: the directory made, a past stop's files and counts removed."""
    directory = directory or STATE_DIR
    directory.mkdir(parents=True, exist_ok=True)
    for path in directory.iterdir():
        path.unlink(missing_ok=True)


class InFlight:
    """The requests this process is executing, in an 8-byte file the supervisor reads.

    A shared mapping, so counting costs two memory writes per ``execute`` and no system call.
    The order that makes the stop exact: a model counts a request *before* it checks
    :func:`closing`, and the supervisor announces :data:`CLOSING` *before* it reads the counts;
    so a request is either counted where the supervisor looks, or refused.
    """

    def __init__(self, directory: Path | None = None) -> None:
        self.path = (directory or STATE_DIR) / f"{COUNTER_PREFIX}{os.getpid()}"
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(descriptor, _COUNT.size)
            self._map = mmap.mmap(descriptor, _COUNT.size)
        finally:
            os.close(descriptor)
        self._count = 0
        self._lock = threading.Lock()

    def add(self, requests: int) -> None:
        """``requests`` more (negative: fewer) in execution (streams end on threads of their
        own: under a lock)."""
        with self._lock:
            self._count += requests
            _COUNT.pack_into(self._map, 0, self._count)

    def close(self) -> None:
        self._map.close()
        self.path.unlink(missing_ok=True)


def in_flight(directory: Path | None = None) -> int:
    """The requests in execution in every live process that counts them. A file whose process
    is gone (it crashed, or was killed with its server) counts nothing and is removed."""
    total = 0
    for path in (directory or STATE_DIR).glob(f"{COUNTER_PREFIX}*"):
        pid = path.name[len(COUNTER_PREFIX):]
        if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
            path.unlink(missing_ok=True)
            continue
        try:
            total += _COUNT.unpack(path.read_bytes()[:_COUNT.size])[0]
        except (OSError, struct.error):
            continue
    return total
