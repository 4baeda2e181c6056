"""What this host can add to itself: Debian packages, installed as root when missing.

The build needs a Docker engine and, without Docker Hub, ``mmdebstrap`` for a base OS image. On a
Debian machine where we are root we install them rather than fail; anywhere else we say exactly
what to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from builder.errors import TritonBuilderError
from builder.host_lock import host_lock, machine_lock_directory

APT_LOCK_WAIT = 300
"""Seconds apt-get waits for apt's own lock (``DPkg::Lock::Timeout``; its default is 0)."""


class HostError(TritonBuilderError, RuntimeError):
    """A program the build needs is missing and cannot be installed here."""


def ensure_program(program: str, package: str) -> str:
    """Return the path of ``program``, installing Debian's ``package`` first if needed.

    Installs hold the machine's lock ``apt`` (:mod:`builder.host_lock`), and look again once
    they hold it: apt takes its own lock without waiting, so a second build installing at the
    same time would fail, where it can use what the first installed. apt-get still waits (up
    to :data:`APT_LOCK_WAIT` seconds) for a program not ours that holds apt's lock."""
    found = shutil.which(program)
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise HostError(f"{program} is not installed: install the '{package}' package")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    wait = ["-o", f"DPkg::Lock::Timeout={APT_LOCK_WAIT}"]
    with host_lock("apt", machine_lock_directory()):
        found = shutil.which(program)
        if found:
            return found
        for command in (["apt-get", *wait, "update", "-qq"],
                        ["apt-get", *wait, "install", "-y", "-qq", "--no-install-recommends",
                         package]):
            result = subprocess.run(command, capture_output=True, text=True, env=env)
            if result.returncode != 0:
                raise HostError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    found = shutil.which(program)
    if not found:
        raise HostError(f"installed '{package}' but {program} is still not on PATH")
    return found
