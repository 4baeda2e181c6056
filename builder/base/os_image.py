"""A base OS image made without any registry: Debian via ``mmdebstrap``, ``docker import``-ed.

Users with Docker Hub start from ``python:3.11-slim-bookworm``. Air-gapped machines (and this
project's CI) cannot pull it, so we make the equivalent from Debian's own packages: Python 3.11,
``libpython3.11`` (the python backend stub links it) and CA certificates.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import docker
import docker.errors

from builder.base.releases import DEBIAN_SUITES
from builder.errors import TritonBuilderError
from builder.host_packages import ensure_program

DEBIAN_OS_IMAGE = "triton-builder/debian-bookworm:python3.11"
DEBIAN_OS_IMAGE_TAG = "triton-builder/debian-{suite}:python{python}"


def debian_packages(suite: str) -> tuple[str, ...]:
    """Python, its shared ``libpython`` (the python backend stub links it) and CA certificates."""
    python = DEBIAN_SUITES[suite][0]
    return ("python3", f"libpython{python}", "ca-certificates")


def debian_os_image_tag(suite: str) -> str:
    return DEBIAN_OS_IMAGE_TAG.format(suite=suite, python=DEBIAN_SUITES[suite][0])


class RootfsError(TritonBuilderError, RuntimeError):
    """mmdebstrap or the import failed."""


def debian_os_image(client: docker.DockerClient, tag: str | None = None,
                    suite: str = "bookworm", rebuild: bool = False) -> str:
    """Return ``tag`` (default :func:`debian_os_image_tag`), made with mmdebstrap unless it
    exists. ``trixie`` (Python 3.13) is the OS of the CPU base that stands in for a release
    whose Python is not the builder's."""
    if suite not in DEBIAN_SUITES:
        raise RootfsError(f"unknown Debian suite {suite!r}: one of {', '.join(DEBIAN_SUITES)}")
    tag = tag or debian_os_image_tag(suite)
    if not rebuild:
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
    mmdebstrap = ensure_program("mmdebstrap", "mmdebstrap")
    with tempfile.TemporaryDirectory(prefix="rootfs-") as workdir:
        tarball = Path(workdir) / "rootfs.tar"
        command = [mmdebstrap, "--variant=minbase", f"--include={','.join(debian_packages(suite))}",
                   suite, str(tarball)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RootfsError(f"mmdebstrap failed:\n{result.stderr[-3000:]}")
        repository, _, version = tag.rpartition(":")
        with open(tarball, "rb") as stream:
            client.api.import_image_from_data(stream, repository=repository, tag=version)
    client.images.get(tag)
    return tag
