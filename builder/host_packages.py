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


class HostError(TritonBuilderError, RuntimeError):
    """A program the build needs is missing and cannot be installed here."""


def ensure_program(program: str, package: str) -> str:
    """Return the path of ``program``, installing Debian's ``package`` first if needed."""
    found = shutil.which(program)
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise HostError(f"{program} is not installed: install the '{package}' package")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "--no-install-recommends", package]):
        result = subprocess.run(command, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            raise HostError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    found = shutil.which(program)
    if not found:
        raise HostError(f"installed '{package}' but {program} is still not on PATH")
    return found
