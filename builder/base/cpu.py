"""The CPU Triton base image: what ``nvcr.io/nvidia/tritonserver`` is to GPU builds.

It holds Triton 2.51 from the ``nvidia-pytriton`` wheel in the NGC layout, the python backend for
the image's Python, and our Python-based onnxruntime backend with its packages — installed from
wheels fetched on the host, so ``docker build`` needs no network. The base OS image is a
parameter: ``python:3.11-slim-bookworm`` where Docker Hub is reachable, or the Debian image that
:mod:`builder.base.os_image` makes without any registry.

Builds are cached by content: the inputs are hashed before any work is done, and an image whose
label carries the same hash is reused as it is.

Each platform (:mod:`builder.engine.platforms`) has its own base, tagged apart (the engine holds
one platform per tag): the same Triton from the wheel for its machine (``nvidia-pytriton`` 0.7.0
has ``manylinux_2_35_aarch64`` beside ``x86_64``), the backend's packages for its machine, on an
OS image of its architecture.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

import docker
import docker.errors
from packaging.requirements import Requirement

from builder.base.os_choice import os_image_for, os_image_variable
from builder.cache import cache_dir, content_hash, staged
from builder.engine.dockerfile import render, template_source
from builder.engine.image_build import CONTENT_HASH_LABEL, BuiltImage, build_image, find_built
from builder.engine.platforms import (
    DEFAULT_PLATFORM,
    Platform,
    image_platform_name,
    per_platform_tag,
)
from builder.errors import TritonBuilderError
from builder.host_lock import image_lock
from builder.progress import Log
from builder.tritonserver.wheel import ONNXRUNTIME_BACKEND, TRITON_VERSION, triton_distribution

TEMPLATE = "tritonserver-cpu.Dockerfile.j2"
REQUIREMENTS = "tritonserver-cpu.txt"
MACHINE_REQUIREMENTS = {"aarch64": "tritonserver-cpu-aarch64.txt"}
"""Pins that replace those of :data:`REQUIREMENTS` of the same name on a machine (why: in the
file)."""
WHEEL_PLATFORMS = ("manylinux_2_28_{machine}", "manylinux_2_27_{machine}",
                   "manylinux_2_17_{machine}", "manylinux2014_{machine}")
"""The wheel platform tags of the base's packages, for the platform's machine (PEP 600)."""
PLATFORM_LABEL = "ai.triton-builder.platform"
OS_IMAGE_LABEL = "ai.triton-builder.os-image"
"""The OS image a base of ours was built on (the slim GPU base is rebuilt on the same one)."""

_CHECK_PYTHON = (
    "import sys; v = '%d.%d' % sys.version_info[:2]; "
    "sys.exit(0 if v == '{0}' else 'the base OS image has Python ' + v + ', the CPU base "
    "was asked for Python {0}: pick an OS image with Python {0}')"
)
_REGISTER_PACKAGES = (
    "import pathlib, site; d = pathlib.Path(site.getsitepackages()[0]); "
    "d.mkdir(parents=True, exist_ok=True); "
    "(d / 'tritonserver.pth').write_text('/opt/tritonserver/python\\n')"
)


class BaseImageError(TritonBuilderError, RuntimeError):
    """The CPU base image cannot be built from these inputs."""


def cpu_base_tag(python_version: str = "3.11", platform: Platform = DEFAULT_PLATFORM) -> str:
    """``triton-builder/tritonserver-cpu:2.51.0-py3.11``; another platform's base carries its
    architecture (``…-py3.11-arm64``)."""
    tag = f"{TRITON_VERSION}-py{python_version}"
    if platform != DEFAULT_PLATFORM:
        tag = per_platform_tag(tag, platform)
    return f"triton-builder/tritonserver-cpu:{tag}"


def build_cpu_base(
    client: docker.DockerClient,
    *,
    os_image: str | None = None,
    python_version: str = "3.11",
    tag: str | None = None,
    rebuild: bool = False,
    platform: Platform = DEFAULT_PLATFORM,
    on_log: Log | None = None,
) -> BuiltImage:
    """Build (or reuse) the CPU Triton base image for ``platform`` and return it.

    ``rebuild`` builds it from scratch: no content-hash reuse, no layer cache. The look for
    a built one and the build hold the tag's lock (:func:`builder.host_lock.image_lock`): a
    second process asking for the same base meanwhile waits, then finds it, rather than
    building it again.
    """
    os_image = os_image or os_image_for(client, python_version, platform)
    tag = tag or cpu_base_tag(python_version, platform)
    os_image_id = base_os_image_id(client, os_image, platform)
    distribution = triton_distribution(machine=platform.machine)
    requirements = base_requirements_text(platform.machine)
    dockerfile = render(
        TEMPLATE, os_image=os_image, triton_version=TRITON_VERSION,
        check_python=_CHECK_PYTHON.format(python_version), register_packages=_REGISTER_PACKAGES,
    )
    digest = content_hash(
        dockerfile, template_source(TEMPLATE), requirements, os_image_id, python_version,
        distribution.root.name, ONNXRUNTIME_BACKEND,
        *([platform.name] if platform != DEFAULT_PLATFORM else []),
    )
    with image_lock(tag):
        cached = None if rebuild else find_built(client, tag, digest)
        if cached is not None:
            return cached
        packages = _python_packages(requirements_for(requirements, python_version), python_version,
                                    platform)
        with tempfile.TemporaryDirectory(prefix="tritonserver-cpu-") as workdir:
            context = Path(workdir)
            (context / "Dockerfile").write_text(dockerfile)
            shutil.copytree(packages, context / "python", symlinks=True)
            distribution.install_layout(context / "tritonserver", python_version)
            labels = base_labels("tritonserver-cpu", digest, python_version, os_image, os_image_id,
                                 {PLATFORM_LABEL: platform.name} if platform != DEFAULT_PLATFORM
                                 else {})
            return build_image(client, context, [tag], labels=labels, nocache=rebuild,
                               platform=platform.name, on_log=on_log)


def base_labels(title: str, digest: str, python_version: str, os_image: str, os_image_id: str,
                more: dict[str, str]) -> dict[str, str]:
    """The labels of each base of ours (CPU, slim GPU): the content hash it is found by, the
    Triton and Python it runs, the OS image it is built on; ``more`` a base's own."""
    return {
        CONTENT_HASH_LABEL: digest,
        "ai.triton-builder.triton-version": TRITON_VERSION,
        "ai.triton-builder.python-version": python_version,
        OS_IMAGE_LABEL: os_image,
        "org.opencontainers.image.title": title,
        "org.opencontainers.image.version": TRITON_VERSION,
        "org.opencontainers.image.base.name": os_image,
        "org.opencontainers.image.base.digest": os_image_id,
        **more,
    }


def base_os_image_id(client: docker.DockerClient, os_image: str,
                     platform: Platform = DEFAULT_PLATFORM) -> str:
    """The ID of ``os_image`` on this engine (a base's FROM), pulled where it is missing;
    refused where it is another platform's (the engine holds one platform per tag: a
    multi-platform name pulled here is the engine's own)."""
    try:
        found = client.images.get(os_image)
    except docker.errors.ImageNotFound:
        found = None
    if found is not None:
        if not platform.matches(found.attrs):
            raise BaseImageError(
                f"the base OS image {os_image} is {image_platform_name(found.attrs)}, not "
                f"{platform}: make one with `triton-builder base os --platform {platform}` "
                f"(builds find it by its label; --os-image or {os_image_variable(platform)} "
                f"name another)")
        return found.id
    if platform != DEFAULT_PLATFORM:
        raise BaseImageError(
            f"the base OS image {os_image} for {platform} is not on this engine: make one with "
            f"`triton-builder base os --platform {platform}` (builds find it by its label; "
            f"--os-image or {os_image_variable(platform)} name another)")
    try:
        return client.images.pull(os_image).id
    except docker.errors.APIError as error:
        raise BaseImageError(
            f"base OS image {os_image!r} is not on this engine and cannot be pulled "
            f"({error.explanation or error}). Without Docker Hub, make one from Debian's "
            f"packages with `triton-builder base os`: builds find it by its label."
        ) from error


def requirements_for(requirements: str, python_version: str) -> str:
    """The lines of ``requirements`` whose markers hold for the image's Python.

    ``pip install --python-version`` evaluates markers against the running interpreter, not the
    target, so they are resolved here.
    """
    kept = []
    for raw in requirements.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(
                {"python_version": python_version, "python_full_version": f"{python_version}.0"}):
            requirement.marker = None
            kept.append(str(requirement))
    return "".join(f"{line}\n" for line in kept)


def _python_packages(requirements: str, python_version: str, platform: Platform) -> Path:
    """Install ``requirements`` for the image's Python and platform into a cached directory.

    pip installs into a temporary directory beside it, marked complete there and renamed into
    place: ``pip --target`` skips what the directory already holds, so two processes sharing
    one would each take the other's half-written packages for installed."""
    tags = [tag.format(machine=platform.machine) for tag in WHEEL_PLATFORMS]
    target = cache_dir("base-python") / content_hash(requirements, python_version, *tags)[:16]
    if (target / ".complete").exists():
        return target / "site-packages"
    with staged(target) as staging, tempfile.NamedTemporaryFile("w", suffix=".txt") as spec:
        spec.write(requirements)
        spec.flush()
        command = [
            sys.executable, "-m", "pip", "install", "--quiet", "--no-compile",
            "--only-binary=:all:", "--implementation", "cp",
            "--python-version", python_version,
            "--target", str(staging / "site-packages"),
            *(arg for tag in tags for arg in ("--platform", tag)),
            "-r", spec.name,
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise BaseImageError(
                f"could not fetch the base image's Python packages for Python {python_version} "
                f"on {platform}:\n"
                f"{result.stderr.strip()[-3000:]}"
            )
    return target / "site-packages"


def cpu_backend_requirements(python_version: str,
                             machine: str = "x86_64") -> tuple[str, ...]:
    """The pinned packages of the CPU base's onnxruntime backend, for ``python_version`` on
    ``machine``."""
    return tuple(requirements_for(base_requirements_text(machine), python_version).split())


def base_requirements_text(machine: str = "x86_64") -> str:
    """:data:`REQUIREMENTS`, with the pins of :data:`MACHINE_REQUIREMENTS` for ``machine`` in
    place of those of the same name (the default machine's text is the file as it is)."""
    text = (resources.files("builder.envs") / REQUIREMENTS).read_text()
    if machine not in MACHINE_REQUIREMENTS:
        return text
    overrides = (resources.files("builder.envs") / MACHINE_REQUIREMENTS[machine]).read_text()
    replaced = {Requirement(line.split(" #", 1)[0]).name
                for line in overrides.splitlines() if line.strip() and not line.startswith("#")}
    kept = [line for line in text.splitlines()
            if not line.strip() or line.lstrip().startswith("#") or line.startswith(" ")
            or Requirement(line.split(" #", 1)[0].split(";")[0].strip()).name not in replaced]
    return "\n".join(kept) + "\n" + overrides
