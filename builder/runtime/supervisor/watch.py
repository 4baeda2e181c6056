"""Which stub serves which model, and which of them died.

The backend forks each stub from ``tritonserver`` and never reaps one that died, so a dead stub
stays a zombie child of the server (see :mod:`builder.runtime.health`). A zombie has no command
line left, so each live stub's command line is read while it runs and its model remembered under
the stub's identity (pid and start time). A remembered stub that turns zombie died; one that
vanishes was reaped by the backend (an orderly unload), not a death.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path

from .log import log

try:  # builder.runtime.supervisor
    from .. import health
except ImportError:  # in the image: health.py beside the package
    import health  # type: ignore[no-redef]

SHARED_MEMORY = Path(os.environ.get("TRITON_BUILDER_SHM_DIR", "/dev/shm"))

SHM_RESERVE = 4
"""Free region sizes below which a heal restarts the server (see
:func:`shared_memory_short`): room for the new stubs of two models with a region
each, and their growth."""


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
                served = stub_model(cmdline)
                if served is not None:
                    self.live[identity] = (served, cmdline[8])
                    self.regions.add(cmdline[2])
                    if cmdline[3].isdigit():
                        self.region_bytes = max(self.region_bytes, int(cmdline[3]))
        for identity in set(self.live) - set(stubs):  # reaped by the backend: an unload
            del self.live[identity]
        return deaths

    def models(self) -> set[str]:
        return {model for model, _ in self.live.values()}


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


def shared_memory_short(directory: Path, region_bytes: int) -> bool:
    """Whether ``directory`` (``/dev/shm``) may lack room for the new stubs of a reload.

    Why: when a stub is killed while it holds requests, Triton 2.51's python backend keeps
    the dead stub's region mapped for good (measured: one 4 MiB region more in use after
    each such heal under load; its name removed, the memory stays taken). Under Docker's
    default 64 MB ``/dev/shm`` about a dozen such heals leave no room, and every reload then
    fails ("Unable to initialize shared memory key ... No space left on device"). A server
    started again maps only what its new stubs need, so below :data:`SHM_RESERVE` region
    sizes of free space (``region_bytes``: the largest a stub starts with) the heal restarts
    the server instead of reloading one model."""
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return False
    return free < SHM_RESERVE * max(region_bytes, 1 << 20)


def write_healed(healed: set[tuple[int, int]], path: Path, proc: Path) -> set[tuple[int, int]]:
    """Write the healed stubs that are still zombies (a reaped pid may come back) to ``path``,
    the file the health check reads; return them."""
    kept = healed & {p.identity for p in health.processes(proc) if p.state == "Z"}
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        temporary.write_text(json.dumps(sorted(kept)))
        os.replace(temporary, path)
    except OSError as error:
        log(f"cannot write {path} ({error}): the health check will count the healed stubs as "
            "dead")
    return kept
