"""Who made a container: a build's own id, and the process, host and boot it ran in, as labels.

Why: a build that fails or is interrupted finds its containers by its id and removes them; a
build killed with SIGKILL runs no cleanup, and ``triton-builder doctor`` must then tell its
leftovers from the containers of builds still running beside it (CI, another terminal). A pid
alone cannot say that — pids are reused — so the process's start time and the machine's boot id
go with it, read from ``/proc``.
"""

from __future__ import annotations

import functools
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

BUILD_LABEL = "ai.triton-builder.build"
HOST_LABEL = "ai.triton-builder.build.host"
PID_LABEL = "ai.triton-builder.build.pid"
STARTED_LABEL = "ai.triton-builder.build.started"
"""``<boot id>/<start time in clock ticks since boot>`` of the process (``/proc/<pid>/stat``)."""

PROC = Path("/proc")


@dataclass(frozen=True)
class BuildOwner:
    """A build (``build_id``) and the process that runs it."""

    build_id: str
    host: str
    pid: int
    started: str
    """Where ``/proc`` cannot say (not Linux): empty, and liveness rests on the pid alone."""

    @classmethod
    def here(cls) -> BuildOwner:
        """A new build id, owned by this process."""
        host, pid, started = _this_process()
        return cls(uuid.uuid4().hex, host, pid, started)

    def labels(self) -> dict[str, str]:
        return {BUILD_LABEL: self.build_id, HOST_LABEL: self.host, PID_LABEL: str(self.pid),
                STARTED_LABEL: self.started}

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> BuildOwner | None:
        """The owner a container's labels name; None for one made without (not ours, or by an
        older builder)."""
        try:
            return cls(labels[BUILD_LABEL], labels[HOST_LABEL], int(labels[PID_LABEL]),
                       labels[STARTED_LABEL])
        except (KeyError, ValueError):
            return None

    def alive(self) -> bool | None:
        """Whether the owning process still runs; None when it ran on another host (from here
        nothing can tell)."""
        if self.host != socket.gethostname():
            return None
        if not self.started or not PROC.is_dir():
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        return process_started(self.pid) == self.started

    def container_name(self, role: str) -> str:
        """A name fixed before the container exists: ``triton-builder-<role>-<build id>``."""
        return f"triton-builder-{role}-{self.build_id}"


@functools.lru_cache(maxsize=1)
def _this_process_cached(pid: int) -> tuple[str, int, str]:
    return socket.gethostname(), pid, process_started(pid) or ""


def _this_process() -> tuple[str, int, str]:
    return _this_process_cached(os.getpid())


def process_started(pid: int, proc: Path = PROC) -> str | None:
    """``<boot id>/<start ticks>`` of a running process; None when it is gone or a zombie (dead,
    not yet reaped)."""
    try:
        boot = (proc / "sys/kernel/random/boot_id").read_text().strip()
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    state, start_ticks = fields[0], fields[19]
    if state in ("Z", "X"):
        return None
    return f"{boot}/{start_ticks}"
