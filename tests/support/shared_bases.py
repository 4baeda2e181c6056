"""The OS image and the CPU base most end-to-end tests build on, made once per run.

Why made ahead, in a process of its own: on a fresh machine they take minutes, much of it a
download. When a run's workers both reach a test that needs them, one makes them and the other
waits idle; so the first worker starts this module as the run begins (:func:`make_beside`),
and both run the ``alongside`` tests that need no engine meanwhile (the ini option
``alongside_first_without``). It holds a turn as an ``alongside`` test does, so no ``alone``
or ``light`` test runs beside it, and makes each image through :func:`once_per_run` under the
name the fixtures use: a fixture that asks meanwhile waits for it, and where it failed or was
stopped, the fixture makes the image itself and reports what went wrong.
"""

from __future__ import annotations

import os
import subprocess
import sys

import docker

from tests.support.concurrency import (
    beside_alongside_tests,
    once_per_run,
    one_at_a_time,
    run_directory,
)
from tests.support.paths import REPO_ROOT


def engine() -> docker.DockerClient:
    """The engine the tests use, started (and installed) here where none answers."""
    from builder.engine import ensure_engine

    with one_at_a_time("engine"):
        return ensure_engine()


def os_image(client: docker.DockerClient) -> str:
    """``TRITON_BUILDER_OS_IMAGE``, or Debian's made by mmdebstrap."""
    from builder.base.os_image import debian_os_image

    return os.environ.get("TRITON_BUILDER_OS_IMAGE") or once_per_run(
        "os_image", lambda: debian_os_image(client))


def cpu_base_image(client: docker.DockerClient, os_image: str) -> str:
    from builder.base.cpu import build_cpu_base

    return once_per_run("cpu_base_image",
                        lambda: build_cpu_base(client, os_image=os_image).tags[0])


def make_beside() -> subprocess.Popen:
    """Start making both in a process of this run (its output in the run's directory)."""
    with open(run_directory() / "shared_bases.log", "w") as stream:
        return subprocess.Popen([sys.executable, "-m", __name__], cwd=REPO_ROOT,
                                stdout=stream, stderr=subprocess.STDOUT)


def main() -> None:
    with beside_alongside_tests():
        client = engine()
        print(cpu_base_image(client, os_image(client)), flush=True)


if __name__ == "__main__":
    main()
