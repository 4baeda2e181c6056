"""The test bed: a real Docker engine, a real registry and real Triton servers, set up unattended.

* ``docker_client`` — the engine that answers; else, as root on Debian, ``docker.io`` is
  installed and ``dockerd`` started; else the tests that need it are skipped, saying why.
* ``registry`` — Debian's ``docker-registry`` on 127.0.0.1, started and stopped here.
* ``triton_server`` — a factory of host-process ``tritonserver``\\ s (no image needed).
* ``os_image`` / ``cpu_base_image`` / ``slim_base_image`` — the base OS image (Debian via
  mmdebstrap unless ``TRITON_BUILDER_OS_IMAGE`` names one), the CPU Triton base and the slim GPU
  base, built once per session.
* ``text_embedding_image`` — the example text-embedding pipeline's serving image, once per
  session (the reliability and deployment tests share it).
* ``python_source_image`` / ``glibc_2_31_release_image`` — stand-ins for what only Docker Hub and
  NGC hold (``tests/images/``): Python 3.11 built from Debian's source on bullseye, as
  ``python:3.11-slim-bullseye`` is; an image with Ubuntu 20.04's glibc 2.31 and no Python 3.11
  packages, as the 22.12 release image is when a stub is compiled on it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from builder.tritonserver.host_process import TritonServer
from tests.support import shared_bases
from tests.support.concurrency import MARKER, kind_of, once_per_run, one_at_a_time
from tests.support.gpu import gpu_missing
from tests.support.paths import IMAGES
from tests.support.testbed import LocalRegistry

TEST_IMAGES = os.environ.get("TRITON_BUILDER_TEST_IMAGES", "triton-builder-test")
"""Where the session's shared images are tagged: checkouts that test side by side on one engine
each set their own, so that neither retags the other's."""
pytest_plugins = ["tests.support.concurrency", "pytester"]
NEEDS = {"docker_client": "docker", "registry": "registry", "triton_server": "tritonserver"}
"""Fixture → the marker of what a test that uses it (at any depth) needs of the machine."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with what it needs (``docker``, ``registry``, ``tritonserver``), read from
    the fixtures it uses, every test under ``tests/e2e`` as ``e2e`` and every one under
    ``tests/gpu`` as ``gpu``: ``nox -s unit``
    deselects them all, ``nox -s tests`` runs everything. A ``gpu`` test is skipped, saying why,
    on a machine without a usable GPU (:func:`tests.support.gpu.gpu_missing`)."""
    missing: list[str | None] = []
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            if fixture in NEEDS:
                item.add_marker(NEEDS[fixture])
        if "e2e" in item.path.parts:
            item.add_marker("e2e")
        if "gpu" in item.path.parts:
            item.add_marker("gpu")
        if item.get_closest_marker("gpu") is not None:
            if not missing:
                missing.append(gpu_missing())
            if missing[0]:
                item.add_marker(pytest.mark.skip(reason=missing[0]))


_MAKING_BASES: list = []


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under xdist, the first worker starts making the OS image and the CPU base beside the
    first tests (:mod:`tests.support.shared_bases`), where the run begins with ``alongside``
    tests and some test needs the base."""
    if (os.environ.get("PYTEST_XDIST_WORKER") == "gw0" and session.items
            and kind_of(session.items[0]) == MARKER
            and any("cpu_base_image" in item.fixturenames for item in session.items)):
        _MAKING_BASES.append(shared_bases.make_beside())


def pytest_sessionfinish(session: pytest.Session) -> None:
    """What is still making the bases when this worker's tests have ended is stopped (a worker
    that still needs them then makes them itself)."""
    for process in _MAKING_BASES:
        if process.poll() is None:
            process.terminate()
            process.wait(120)


@pytest.fixture(scope="session")
def docker_client():
    from builder.engine import EngineError
    from builder.host_packages import HostError

    try:
        client = shared_bases.engine()
    except (EngineError, HostError) as error:
        pytest.skip(f"no Docker engine: {error}")
    yield client
    client.close()


@pytest.fixture(scope="session")
def os_image(docker_client) -> str:
    return shared_bases.os_image(docker_client)


@pytest.fixture(scope="session")
def cpu_base_image(docker_client, os_image) -> str:
    return shared_bases.cpu_base_image(docker_client, os_image)


@pytest.fixture(scope="session")
def arm64_emulation(docker_client) -> None:
    """linux/arm64 containers run here: natively, or under qemu-user the test bed enables."""
    from builder.engine.emulation import platform_support
    from builder.engine.platforms import ARM64
    from builder.host_packages import HostError
    from tests.support.testbed import enable_emulation

    try:
        with one_at_a_time("arm64_emulation"):
            if platform_support(docker_client, ARM64).problem is None:
                return
            enable_emulation(ARM64)
    except HostError as error:
        pytest.skip(f"no linux/arm64 emulation: {error}")


@pytest.fixture(scope="session")
def arm64_cpu_base_image(docker_client, arm64_emulation) -> str:
    """The CPU base for linux/arm64 on Debian's arm64 packages (mmdebstrap under emulation)."""
    from builder.base.cpu import build_cpu_base
    from builder.base.os_image import debian_os_image
    from builder.engine.platforms import ARM64

    def make() -> str:
        os_image = (os.environ.get("TRITON_BUILDER_OS_IMAGE_ARM64")
                    or debian_os_image(docker_client, platform=ARM64))
        return build_cpu_base(docker_client, os_image=os_image, platform=ARM64).tags[0]

    return once_per_run("arm64_cpu_base_image", make)


@pytest.fixture(scope="session")
def slim_base_image(docker_client, os_image) -> str:
    """The slim GPU base (the wheel's Triton 2.51 on the OS image), for the builder's Python."""
    from builder.base.gpu_slim import build_slim_base
    from builder.base.releases import builder_python

    return once_per_run("slim_base_image", lambda: build_slim_base(
        docker_client, builder_python(), os_image=os_image).tags[0])


@pytest.fixture(scope="session")
def registry(tmp_path_factory) -> Iterator[LocalRegistry]:
    with LocalRegistry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture
def triton_server() -> Iterator[Callable[..., TritonServer]]:
    """Start ``tritonserver`` on a repository: ``server = triton_server(path, **options)``."""
    started: list[TritonServer] = []

    def start(model_repository: str | Path, **options) -> TritonServer:
        server = TritonServer(model_repository, **options)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.close()


@pytest.fixture(scope="session")
def trixie_base_image(docker_client) -> str:
    """The CPU base on Debian trixie (Python 3.13): a release whose Python is not the builder's."""
    from builder.base.cpu import build_cpu_base
    from builder.base.os_image import debian_os_image

    def make() -> str:
        os_image = debian_os_image(docker_client, suite="trixie")
        return build_cpu_base(docker_client, os_image=os_image, python_version="3.13").tags[0]

    return once_per_run("trixie_base_image", make)


def _stand_in(client, dockerfile: str, tag: str, buildargs: dict[str, str]) -> str:
    """Build ``tests/images/<dockerfile>`` as ``tag`` unless the engine has it."""
    import docker.errors

    from builder.engine.image_build import build_image

    with one_at_a_time(tag):
        try:
            client.images.get(tag)
        except docker.errors.ImageNotFound:
            build_image(client, IMAGES, [tag], dockerfile=dockerfile, buildargs=buildargs,
                        network_mode="host")
    return tag


@pytest.fixture(scope="session")
def bullseye_image(docker_client) -> str:
    from builder.base.os_image import debian_os_image

    return once_per_run("bullseye_image", lambda: debian_os_image(docker_client, suite="bullseye"))


@pytest.fixture(scope="session")
def python_source_image(docker_client, bullseye_image) -> str:
    """Python 3.11 on glibc 2.31 with headers and a shared libpython in /usr/local (2 minutes)."""
    return _python_from_source(docker_client, bullseye_image, "3.11", "bookworm")


@pytest.fixture(scope="session")
def python_3_13_source_image(docker_client, bullseye_image) -> str:
    """Python 3.13 (trixie's source) on glibc 2.31, for ``python:3.13-slim-bullseye``."""
    return _python_from_source(docker_client, bullseye_image, "3.13", "trixie")


def _python_from_source(client, base: str, python: str, source_suite: str) -> str:
    return _stand_in(client, "python-from-source.Dockerfile",
                     f"triton-builder-test/python-source:{python}-bullseye",
                     {"BASE": base, "PYTHON": python, "SOURCE_SUITE": source_suite})


@pytest.fixture(scope="session")
def glibc_2_31_release_image(docker_client, bullseye_image) -> str:
    return _stand_in(docker_client, "glibc-2.31-release.Dockerfile",
                     "triton-builder-test/glibc-2.31-release:1", {"BASE": bullseye_image})


CUDA_WHEELS = {
    "11.8": ("nvidia-cuda-nvcc-cu11==11.8.89", "nvidia-cuda-runtime-cu11==11.8.89"),
    "12.4": ("nvidia-cuda-nvcc-cu12==12.4.131", "nvidia-cuda-runtime-cu12==12.4.127"),
    "13.0": ("nvidia-cuda-nvcc==13.0.88", "nvidia-nvvm==13.0.88", "nvidia-cuda-crt==13.0.88",
             "nvidia-cuda-runtime==13.0.96", "nvidia-cuda-cccl==13.0.85"),
}
"""PyPI's part of each CUDA stand-in, of the CUDA release of its toolkit: 11.8.89 and 12.4.131
as Debian bookworm's and trixie's nvidia-cuda-toolkit (runtime headers, libcudart, ptxas, crt/,
libnvvm); 13.0 Update 2 (25.11's CUDA) entire, nvcc included (the cccl wheel numbers its own
releases)."""


@pytest.fixture(scope="session")
def cuda_11_8_release_image(docker_client) -> str:
    """Stands in for 22.12's image, GPU on: bookworm + CUDA 11.8 (Debian's nvcc, PyPI's runtime)."""
    from builder.base.os_image import debian_os_image

    return _cuda_stand_in(docker_client, "cuda-debian-release.Dockerfile", "11.8",
                          {"BASE": debian_os_image(docker_client, suite="bookworm"),
                           "SUITE": "bookworm", "HOST_GXX": "g++-11",
                           "BOOST_TOO_NEW": "libboost1.81-dev"})


@pytest.fixture(scope="session")
def cuda_12_4_release_image(docker_client) -> str:
    """Stands in for 24.12's image (CUDA 12.6), GPU on: trixie + CUDA 12.4 (Debian's newest)."""
    from builder.base.os_image import debian_os_image

    return _cuda_stand_in(docker_client, "cuda-debian-release.Dockerfile", "12.4",
                          {"BASE": debian_os_image(docker_client, suite="trixie"),
                           "SUITE": "trixie", "HOST_GXX": "g++-13", "GLIBC_2_41_MATH": "1",
                           "STATIC_CUDART": "1"})


@pytest.fixture(scope="session")
def cuda_13_0_release_image(docker_client) -> str:
    """Stands in for 25.11's image, GPU on: trixie + CUDA 13.0 from PyPI's wheels."""
    from builder.base.os_image import debian_os_image

    return _cuda_stand_in(docker_client, "cuda-pypi-release.Dockerfile", "13.0",
                          {"BASE": debian_os_image(docker_client, suite="trixie")})


def _cuda_stand_in(client, dockerfile: str, cuda: str, buildargs: dict[str, str]) -> str:
    """Build ``tests/images/<dockerfile>`` with :data:`CUDA_WHEELS` ``[cuda]`` in its context's
    ``wheels/``, as ``triton-builder-test/cuda-<cuda>-release``, unless the engine has it."""
    import docker.errors

    tag = f"triton-builder-test/cuda-{cuda}-release:1"
    with one_at_a_time(tag):
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        _build_cuda_stand_in(client, dockerfile, cuda, buildargs, tag)
    return tag


def _build_cuda_stand_in(client, dockerfile: str, cuda: str, buildargs: dict[str, str],
                         tag: str) -> None:
    import shutil
    import tempfile

    from builder.cache import cached_download
    from builder.engine.image_build import build_image

    with tempfile.TemporaryDirectory(prefix="cuda-stand-in-") as workdir:
        context = Path(workdir)
        (context / "wheels").mkdir()
        shutil.copyfile(IMAGES / dockerfile, context / "Dockerfile")
        for requirement in CUDA_WHEELS[cuda]:
            name, version = requirement.split("==")
            wheel = cached_download(requirement, "wheels",
                                    f"{name.replace('-', '_')}-{version}-*x86_64*.whl",
                                    "--only-binary=:all:", "--platform", "manylinux2014_x86_64",
                                    "--python-version", "3.11")
            shutil.copyfile(wheel, context / "wheels" / wheel.name)
        build_image(client, context, [tag], buildargs=buildargs, network_mode="host")


@pytest.fixture(scope="session")
def text_embedding_image(docker_client, cpu_base_image) -> str:
    """The example text-embedding pipeline's serving image (built and verified once)."""
    from builder import build_docker_image
    from pipelines.text_embedding import pipeline

    reference = f"{TEST_IMAGES}/text-embedding-serving:1"

    def make() -> str:
        build_docker_image(pipeline, reference, client=docker_client)
        return reference

    return once_per_run("text_embedding_image", make)
