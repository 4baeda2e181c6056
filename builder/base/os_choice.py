"""Which OS image our bases (CPU, slim GPU) are built on when none is named.

Users with Docker Hub build on ``python:X.Y-slim-bookworm``; machines without it make the
equivalent with ``triton-builder base os`` (:mod:`builder.base.os_image`), which labels it with
its Python, so that a build finds it with nothing to set. Its own module, below
:mod:`builder.base.os_image`, because the CPU base needs the choice and the release table needs
the CPU base.
"""

from __future__ import annotations

import os

import docker
import docker.errors

from builder.engine.image_listing import listed_images
from builder.engine.platforms import DEFAULT_PLATFORM, Platform, per_platform_tag

DEBIAN_OS_IMAGE_TAG = "triton-builder/debian-{suite}:python{python}"
"""What ``triton-builder base os`` tags the image it makes."""
OS_PYTHON_LABEL = "ai.triton-builder.os-python"
"""On an OS image ``triton-builder base os`` made: its Python (``3.11``), by which builds find
it."""
OS_IMAGE_VARIABLE = "TRITON_BUILDER_OS_IMAGE"
"""The OS image of the default platform's bases; ``…_ARM64`` (the architecture) another's."""


def os_image_variable(platform: Platform = DEFAULT_PLATFORM) -> str:
    """``TRITON_BUILDER_OS_IMAGE``, or ``TRITON_BUILDER_OS_IMAGE_ARM64`` for linux/arm64."""
    return (OS_IMAGE_VARIABLE if platform == DEFAULT_PLATFORM
            else f"{OS_IMAGE_VARIABLE}_{platform.architecture.upper()}")


def official_os_image(python_version: str) -> str:
    """The Docker Hub image our bases are built on by default: ``python:3.11-slim-bookworm``."""
    return f"python:{python_version}-slim-bookworm"


def os_image_for(client: docker.DockerClient, python_version: str,
                 platform: Platform = DEFAULT_PLATFORM) -> str:
    """The OS image a base of ours is built on when none is named.

    ``$TRITON_BUILDER_OS_IMAGE`` (``…_ARM64`` for arm64) where set; else the official image
    where the engine holds it for ``platform``; else one ``triton-builder base os`` made here for
    that Python and platform (found by :data:`OS_PYTHON_LABEL`, or by the tag it gave); else the
    official name, to be pulled — on a machine without Docker Hub that fails, naming
    ``base os``. Why in this order: a machine that cannot pull needs no setting once ``base os``
    has run, and one that has the official image keeps building on it."""
    named = os.environ.get(os_image_variable(platform))
    if named:
        return named
    official = official_os_image(python_version)
    try:
        if platform.matches(client.images.get(official).attrs):
            return official
    except docker.errors.ImageNotFound:
        pass
    return made_os_image(client, python_version, platform) or official


def made_os_image(client: docker.DockerClient, python_version: str,
                  platform: Platform = DEFAULT_PLATFORM) -> str | None:
    """A tag of an OS image :func:`builder.base.os_image.debian_os_image` made for
    ``python_version`` and ``platform``, if the engine holds one.

    Every image built on it inherits its label (the bases, the serving images: a ``LABEL``
    stays in each image ``FROM`` it), and is often newer. Of the labelled images, the OS image
    is the one with the fewest layers, each image built on it adding its own; the newest of
    those, where ``base os`` ran more than once."""
    labelled = listed_images(client, filters={"label": f"{OS_PYTHON_LABEL}={python_version}"})
    newest_first = sorted(labelled, key=lambda i: i.attrs.get("Created", ""), reverse=True)
    for image in sorted(newest_first, key=_layer_count):
        if image.tags and platform.matches(image.attrs):
            return sorted(image.tags)[0]
    version = f"python{python_version}"  # made before the label existed: by the tag it gave
    if platform != DEFAULT_PLATFORM:
        version = per_platform_tag(version, platform)
    tagged = listed_images(client, filters={"reference": DEBIAN_OS_IMAGE_TAG.format(
        suite="*", python=version.removeprefix("python"))})
    for image in tagged:
        if platform.matches(image.attrs):
            return sorted(t for t in image.tags if t.endswith(f":{version}"))[0]
    return None


def _layer_count(image: docker.models.images.Image) -> int:
    return len(image.attrs.get("RootFS", {}).get("Layers", ()))
