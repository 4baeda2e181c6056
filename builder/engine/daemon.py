"""The Docker engine: connect to the one that answers, or start Debian's ``dockerd``.

Every image operation goes through the Docker SDK. :func:`docker_client` only connects;
:func:`ensure_engine` is for fresh machines (CI, the demo), where as root it installs
``docker.io`` and starts ``dockerd`` detached, then waits for it to answer.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import docker
import docker.errors

from builder.errors import TritonBuilderError
from builder.host_packages import ensure_program


class EngineError(TritonBuilderError, RuntimeError):
    """No Docker engine answers, and none could be started."""


def docker_client(timeout: int = 600) -> docker.DockerClient:
    """Connect to the engine named by the environment (``DOCKER_HOST``) or the local socket."""
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except docker.errors.DockerException as error:
        raise EngineError(f"no Docker engine answers: {error}") from error
    return client


def ensure_engine(wait: float = 60.0, log: Path = Path("/tmp/dockerd.log")) -> docker.DockerClient:
    """Return a client, starting (and if needed installing) ``dockerd`` when none answers."""
    try:
        return docker_client()
    except EngineError as first:
        if os.geteuid() != 0:
            raise EngineError(f"{first}; start dockerd (or run as root to let us)") from None
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
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                raise EngineError(f"dockerd did not answer within {wait:.0f}s:\n{tail}") from None
            time.sleep(0.5)
