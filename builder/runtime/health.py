"""The serving container's health check: Triton answers *and* no python backend stub is dead.

Why more than ``/v2/health/ready``: since 24.06 the python backend does not restart a stub that
died (killed, OOM): every request to its model then fails with "Stub process '…' is not
healthy" while the server, and the model, still report ready — so no orchestrator would replace
the container. The backend starts each stub with fork/exec and waits for it only when the model
unloads, so a stub that died stays a zombie child of ``tritonserver`` (state ``Z`` in
``/proc``): that is the signal read here, without touching the models (no inference, nothing
that slows down or times out under load).

A stub that died stays a zombie even after it is healed: the image's supervisor
(:mod:`builder.runtime.supervisor`) reloads its model through Triton's repository API, which
starts a new stub, but the backend never reaps the old one. So the supervisor lists the dead
stubs it has healed in :data:`HEALED_STUBS` (pid and start time, which a reused pid does not
share), and only a zombie *not* listed there counts as dead: a stub that is healing, that cannot
heal, or that died in a container started without the supervisor.

Copied into the image as ``/opt/triton-builder/health.py`` and run with the image's own
``python3`` (standard library only; it imports nothing from ``builder``) by Docker's
``HEALTHCHECK``, a Swarm service's health check and a Kubernetes liveness probe::

    python3 /opt/triton-builder/health.py [--http-port 8000] [--live]

Exit 0 healthy, 1 unhealthy; the reason is printed (``docker inspect`` shows it). A replica
that is draining (:mod:`builder.runtime.drain`) is unhealthy at once: Swarm and a balancer that
reads the health check stop sending to it.
``--live`` asks ``/v2/health/live`` instead of ``/v2/health/ready``: for a liveness probe,
which must not restart a server that is still loading its models.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

if __package__:  # imported from the repository (builder.runtime.health)
    from . import drain
else:  # run as /opt/triton-builder/health.py, drain.py beside it
    import drain  # type: ignore[no-redef]  # the same module, run as a script

SERVER = "tritonserver"
STUB = "triton_python_backend_stub"[:15]
"""The stub's name as ``/proc/PID/comm`` holds it (the kernel keeps 15 characters)."""
HEALED_STUBS = Path(os.environ.get("TRITON_BUILDER_HEALED_STUBS",
                                   "/tmp/triton-builder-healed-stubs.json"))
"""The dead stubs whose model the supervisor has reloaded: ``[[pid, start time], ...]``."""


@dataclass(frozen=True)
class Process:
    pid: int
    name: str
    state: str
    parent: int
    started: int = 0
    """Start time in clock ticks after boot (``/proc/PID/stat`` field 22): with the pid, it
    names one process even after its pid is reused."""
    exit_status: int = 0
    """For a zombie, its status as ``waitpid`` would report it (field 52; 0 if unreadable)."""

    @property
    def identity(self) -> tuple[int, int]:
        return self.pid, self.started


def processes(proc: Path = Path("/proc")) -> list[Process]:
    """Every process ``/proc`` shows, from ``/proc/PID/stat`` (name, state, parent)."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()  # fields 3, 4, ... of proc(5)
        started = int(fields[19]) if len(fields) > 19 else 0
        exit_status = int(fields[49]) if len(fields) > 49 else 0
        found.append(Process(int(entry.name), name, fields[0], int(fields[1]), started,
                             exit_status))
    return found


def dead_stubs(table: list[Process],
               healed: frozenset[tuple[int, int]] = frozenset()) -> list[Process]:
    """The python backend stubs of a ``tritonserver`` that have died (zombies), less those
    whose model was reloaded since (``healed``: their identities)."""
    servers = {p.pid for p in table if p.name == SERVER}
    return [p for p in table if p.parent in servers and p.name == STUB and p.state == "Z"
            and p.identity not in healed]


def healed_stubs(path: Path = HEALED_STUBS) -> frozenset[tuple[int, int]]:
    """The identities the supervisor wrote to ``path``; none if it wrote nothing."""
    try:
        return frozenset((int(pid), int(started)) for pid, started in json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return frozenset()


def server_answers(http_port: int, path: str, timeout: float = 4.0) -> str | None:
    """None if ``GET path`` answers 200, else why not."""
    url = f"http://127.0.0.1:{http_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return None if response.status == 200 else f"{url} answered {response.status}"
    except urllib.error.HTTPError as error:
        return f"{url} answered {error.code}"
    except (urllib.error.URLError, OSError) as error:
        return f"{url}: {getattr(error, 'reason', error)}"


def check(http_port: int = 8000, live: bool = False, proc: Path = Path("/proc"),
          healed: Path = HEALED_STUBS, drain_state: Path | None = None) -> str | None:
    """None when healthy, else the reason. A draining replica is not ready (but alive)."""
    if not live and drain.draining(drain_state):
        return "draining: this replica is stopping"
    problem = server_answers(http_port, "/v2/health/live" if live else "/v2/health/ready")
    if problem is not None:
        return problem
    dead = dead_stubs(processes(proc), healed_stubs(healed))
    if dead:
        pids = ", ".join(str(p.pid) for p in dead)
        return (f"{len(dead)} python backend stub process(es) died (pid {pids}) and are not "
                "healed: their models fail every request")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--live", action="store_true",
                        help="ask /v2/health/live (liveness) instead of /v2/health/ready")
    args = parser.parse_args(argv)
    problem = check(args.http_port, args.live)
    print(f"unhealthy: {problem}" if problem else "healthy")
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
