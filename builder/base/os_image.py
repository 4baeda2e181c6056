"""A base OS image made without any registry: Debian via ``mmdebstrap``, ``docker import``-ed.

Users with Docker Hub start from ``python:3.11-slim-bookworm``. Air-gapped machines (and this
project's CI) cannot pull it, so we make the equivalent from Debian's own packages: Python 3.11,
``libpython3.11`` (the python backend stub links it) and CA certificates.

For another platform (``linux/arm64``) ``mmdebstrap --architectures=arm64`` installs that
architecture's packages, running their maintainer scripts under emulation
(:mod:`builder.engine.emulation`). ``docker import`` stamps the engine's own architecture on
what it imports, so the imported image's config is written again with the platform's
(:func:`builder.engine.image_config.load_config`: the same layer, another config).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import docker
import docker.errors

from builder.base.os_choice import DEBIAN_OS_IMAGE_TAG, OS_PYTHON_LABEL
from builder.base.releases import DEBIAN_SUITES
from builder.engine.image_config import load_config, restamp_platform
from builder.engine.platforms import DEFAULT_PLATFORM, Platform, per_platform_tag
from builder.errors import TritonBuilderError
from builder.host_lock import image_lock
from builder.host_packages import ensure_program

DEBIAN_OS_IMAGE = "triton-builder/debian-bookworm:python3.11"
def debian_packages(suite: str) -> tuple[str, ...]:
    """Python, its shared ``libpython`` (the python backend stub links it) and CA certificates."""
    python = DEBIAN_SUITES[suite][0]
    return ("python3", f"libpython{python}", "ca-certificates")


def debian_os_image_tag(suite: str, platform: Platform = DEFAULT_PLATFORM) -> str:
    """``triton-builder/debian-bookworm:python3.11``; another platform's tag carries its
    architecture (``…:python3.11-arm64``): the engine holds one platform per tag."""
    tag = DEBIAN_OS_IMAGE_TAG.format(suite=suite, python=DEBIAN_SUITES[suite][0])
    if platform == DEFAULT_PLATFORM:
        return tag
    repository, _, version = tag.rpartition(":")
    return f"{repository}:{per_platform_tag(version, platform)}"


class RootfsError(TritonBuilderError, RuntimeError):
    """mmdebstrap or the import failed."""


def debian_os_image(client: docker.DockerClient, tag: str | None = None,
                    suite: str = "bookworm", rebuild: bool = False,
                    platform: Platform = DEFAULT_PLATFORM) -> str:
    """Return ``tag`` (default :func:`debian_os_image_tag`), made with mmdebstrap unless it
    exists. ``trixie`` (Python 3.13) is the OS of the CPU base that stands in for a release
    whose Python is not the builder's; ``platform`` picks the Debian architecture.

    The look and the making hold the tag's lock (:func:`builder.host_lock.image_lock`): a
    second process asking for the same tag meanwhile waits, then finds it, rather than making
    it again."""
    if suite not in DEBIAN_SUITES:
        raise RootfsError(f"unknown Debian suite {suite!r}: one of {', '.join(DEBIAN_SUITES)}")
    tag = tag or debian_os_image_tag(suite, platform)
    with image_lock(tag):
        if not rebuild:
            try:
                client.images.get(tag)
                return tag
            except docker.errors.ImageNotFound:
                pass
        _make_os_image(client, tag, suite, platform)
    return tag


def _make_os_image(client: docker.DockerClient, tag: str, suite: str,
                   platform: Platform) -> None:
    """Make ``tag`` with mmdebstrap and ``docker import``."""
    mmdebstrap = ensure_program("mmdebstrap", "mmdebstrap")
    if platform != DEFAULT_PLATFORM:
        ensure_program("arch-test", "arch-test")  # mmdebstrap's check of foreign architectures
    with tempfile.TemporaryDirectory(prefix="rootfs-") as workdir:
        tarball = Path(workdir) / "rootfs.tar"
        command = [mmdebstrap, "--variant=minbase", f"--architectures={platform.debian}",
                   f"--include={','.join(debian_packages(suite))}", suite, str(tarball)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RootfsError(f"mmdebstrap failed:\n{result.stderr[-3000:]}")
        repository, _, version = tag.rpartition(":")
        label = [f"LABEL {OS_PYTHON_LABEL}={DEBIAN_SUITES[suite][0]}"]
        if platform == DEFAULT_PLATFORM:
            with open(tarball, "rb") as stream:
                client.api.import_image_from_data(stream, repository=repository, tag=version,
                                                  changes=label)
        else:
            with open(tarball, "rb") as stream:
                imported = client.api.import_image_from_data(stream, changes=label)
            image_id = _imported_id(imported)
            try:
                stamped = load_config(client, restamp_platform(client, image_id, platform))
                client.images.get(stamped).tag(repository, version)
            finally:
                client.images.remove(image_id, noprune=True)
    client.images.get(tag)


def _imported_id(answer: str) -> str:
    """The image ID in ``docker import``'s answer (``{"status":"sha256:…"}`` lines)."""
    for line in reversed(str(answer).strip().splitlines()):
        status = json.loads(line).get("status", "")
        if status.startswith("sha256:"):
            return status
    raise RootfsError(f"docker import answered no image ID: {str(answer)[-500:]}")
