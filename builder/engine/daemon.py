"""The Docker engine: connect to the one that answers, or start Debian's ``dockerd``.

Every image operation goes through the Docker SDK. :func:`docker_client` only connects;
:func:`ensure_engine` is for fresh machines (CI, the demo), where as root it installs
``docker.io`` and starts ``dockerd`` detached, then waits for it to answer.

An engine is started only on a machine that has none: not when ``DOCKER_HOST`` names one (a
second daemon would not be the one the user meant, and dies on the first one's pid file), and
not when a ``dockerd`` already runs (it may still be starting: wait for it; or be unhealthy:
say so).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import docker
import docker.errors

from builder.errors import TritonBuilderError
from builder.host_lock import host_lock, machine_lock_directory
from builder.host_packages import ensure_program

PING_TIMEOUT = 5
"""Seconds an engine gets to answer the first ping, whatever the client's timeout for builds."""
DEFAULT_SOCKET = Path("/var/run/docker.sock")


class EngineError(TritonBuilderError, RuntimeError):
    """No Docker engine answers, and none could be started."""


def configured_host() -> str | None:
    """``DOCKER_HOST`` when set (and not empty)."""
    return os.environ.get("DOCKER_HOST") or None


def docker_client(timeout: int = 600) -> docker.DockerClient:
    """Connect to the engine named by the environment (``DOCKER_HOST``) or the local socket."""
    host = configured_host()
    if host is not None:
        socket = _unix_socket(host)
        if socket is not None and not socket.exists():
            raise EngineError(f"DOCKER_HOST={host} names the socket {socket}, which does not "
                              "exist: start that engine, or unset DOCKER_HOST for the local one")
    try:
        client = docker.from_env(timeout=PING_TIMEOUT)
        client.ping()
    except docker.errors.DockerException as error:
        where = f"DOCKER_HOST={host}" if host is not None else f"the local socket {DEFAULT_SOCKET}"
        raise EngineError(f"no Docker engine answers at {where}: {error}") from error
    client.api.timeout = timeout
    return client


def ensure_engine(wait: float = 60.0, log: Path = Path("/tmp/dockerd.log")) -> docker.DockerClient:
    """Return a client, starting (and if needed installing) ``dockerd`` on a machine with none.

    Where none answers, the rest happens under the machine's lock ``dockerd``
    (:mod:`builder.host_lock`), looking again once it is held: two builds starting at once
    start one ``dockerd``, and the second waits for it. A ``dockerd`` already running but not
    answering yet (starting, for another build or at boot) is waited for as ours would be,
    ``wait`` seconds."""
    try:
        return docker_client()
    except EngineError:
        if configured_host() is not None:
            raise
    with host_lock("dockerd", machine_lock_directory()):
        try:
            return docker_client()
        except EngineError as error:
            first = str(error)
        running = running_dockerd()
        if running is None:
            if os.geteuid() != 0:
                raise EngineError(f"{first}; start dockerd (or run as root to let us)")
            dockerd = ensure_program("dockerd", "docker.io")
            with open(log, "ab") as stream:
                subprocess.Popen([dockerd], stdout=stream, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + wait
        while True:
            try:
                return docker_client()
            except EngineError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
    if running is not None:
        raise EngineError(f"{first}; a dockerd (pid {running}) is running but did not answer "
                          f"within {wait:.0f}s: see its log")
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise EngineError(f"dockerd did not answer within {wait:.0f}s:\n{tail}")


def running_dockerd(proc: Path = Path("/proc")) -> int | None:
    """The pid of a running ``dockerd`` on this machine (any user), or None."""
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() == "dockerd":
                return int(entry.name)
        except OSError:
            continue
    return None


def _unix_socket(host: str) -> Path | None:
    url = urlparse(host)
    return Path(url.path) if url.scheme == "unix" else None
