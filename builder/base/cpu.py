"""The CPU Triton base image: what ``nvcr.io/nvidia/tritonserver`` is to GPU builds.

It holds Triton 2.51 from the ``nvidia-pytriton`` wheel in the NGC layout, the python backend for
the image's Python, and our Python-based onnxruntime backend with its packages — installed from
wheels fetched on the host, so ``docker build`` needs no network. The base OS image is a
parameter: ``python:3.11-slim-bookworm`` where Docker Hub is reachable, or the Debian image that
:mod:`builder.base.os_image` makes without any registry.

Builds are cached by content: the inputs are hashed before any work is done, and an image whose
label carries the same hash is reused as it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

import docker
import docker.errors
from packaging.requirements import Requirement

from builder.cache import cache_dir, content_hash
from builder.engine.dockerfile import render, template_source
from builder.engine.image_build import CONTENT_HASH_LABEL, BuiltImage, build_image, find_built
from builder.errors import TritonBuilderError
from builder.progress import Log
from builder.tritonserver.wheel import ONNXRUNTIME_BACKEND, TRITON_VERSION, triton_distribution

DEFAULT_OS_IMAGE = "python:3.11-slim-bookworm"
TEMPLATE = "tritonserver-cpu.Dockerfile.j2"
REQUIREMENTS = "tritonserver-cpu.txt"
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                   "manylinux2014_x86_64")

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


def default_os_image() -> str:
    """``$TRITON_BUILDER_OS_IMAGE`` where set (air-gapped machines), else the Docker Hub image."""
    return os.environ.get("TRITON_BUILDER_OS_IMAGE") or DEFAULT_OS_IMAGE


def cpu_base_tag(python_version: str = "3.11") -> str:
    return f"triton-builder/tritonserver-cpu:{TRITON_VERSION}-py{python_version}"


def build_cpu_base(
    client: docker.DockerClient,
    *,
    os_image: str | None = None,
    python_version: str = "3.11",
    tag: str | None = None,
    rebuild: bool = False,
    on_log: Log | None = None,
) -> BuiltImage:
    """Build (or reuse) the CPU Triton base image and return it.

    ``rebuild`` builds it from scratch: no content-hash reuse, no layer cache.
    """
    os_image = os_image or default_os_image()
    tag = tag or cpu_base_tag(python_version)
    os_image_id = base_os_image_id(client, os_image)
    distribution = triton_distribution()
    requirements = (resources.files("builder.envs") / REQUIREMENTS).read_text()
    dockerfile = render(
        TEMPLATE, os_image=os_image, triton_version=TRITON_VERSION,
        check_python=_CHECK_PYTHON.format(python_version), register_packages=_REGISTER_PACKAGES,
    )
    digest = content_hash(
        dockerfile, template_source(TEMPLATE), requirements, os_image_id, python_version,
        distribution.root.name, ONNXRUNTIME_BACKEND,
    )
    cached = None if rebuild else find_built(client, tag, digest)
    if cached is not None:
        return cached
    packages = _python_packages(requirements_for(requirements, python_version), python_version)
    with tempfile.TemporaryDirectory(prefix="tritonserver-cpu-") as workdir:
        context = Path(workdir)
        (context / "Dockerfile").write_text(dockerfile)
        shutil.copytree(packages, context / "python", symlinks=True)
        distribution.install_layout(context / "tritonserver", python_version)
        labels = {
            CONTENT_HASH_LABEL: digest,
            "ai.triton-builder.triton-version": TRITON_VERSION,
            "ai.triton-builder.python-version": python_version,
            "ai.triton-builder.os-image": os_image,
            "org.opencontainers.image.title": "tritonserver-cpu",
            "org.opencontainers.image.version": TRITON_VERSION,
            "org.opencontainers.image.base.name": os_image,
            "org.opencontainers.image.base.digest": os_image_id,
        }
        return build_image(client, context, [tag], labels=labels, nocache=rebuild,
                           on_log=on_log)


def base_os_image_id(client: docker.DockerClient, os_image: str) -> str:
    """The ID of ``os_image`` on this engine, pulled where it is missing (a base's FROM)."""
    try:
        return client.images.get(os_image).id
    except docker.errors.ImageNotFound:
        pass
    try:
        return client.images.pull(os_image).id
    except docker.errors.APIError as error:
        raise BaseImageError(
            f"base OS image {os_image!r} is not on this engine and cannot be pulled "
            f"({error.explanation or error}). Without Docker Hub, make one from Debian's "
            f"packages with `triton-builder base os` and pass --os-image (or set "
            f"TRITON_BUILDER_OS_IMAGE)."
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


def _python_packages(requirements: str, python_version: str) -> Path:
    """Install ``requirements`` for the image's Python and platform into a cached directory."""
    target = cache_dir("base-python", content_hash(requirements, python_version)[:16])
    if (target / ".complete").exists():
        return target / "site-packages"
    staging = target / "site-packages"
    shutil.rmtree(staging, ignore_errors=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as spec:
        spec.write(requirements)
        spec.flush()
        command = [
            sys.executable, "-m", "pip", "install", "--quiet", "--no-compile",
            "--only-binary=:all:", "--implementation", "cp",
            "--python-version", python_version, "--target", str(staging),
            *(arg for platform in WHEEL_PLATFORMS for arg in ("--platform", platform)),
            "-r", spec.name,
        ]
        result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise BaseImageError(
            f"could not fetch the base image's Python packages for Python {python_version}:\n"
            f"{result.stderr.strip()[-3000:]}"
        )
    (target / ".complete").touch()
    return staging


def cpu_backend_requirements(python_version: str) -> tuple[str, ...]:
    """The pinned packages of the CPU base's onnxruntime backend, for ``python_version``."""
    return tuple(requirements_for(
        (resources.files("builder.envs") / REQUIREMENTS).read_text(), python_version).split())
