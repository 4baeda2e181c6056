"""Compile a python backend stub for another Python from the release's python_backend branch.

The stub and the server's python backend talk through shared memory whose layout changes between
branches, so a stub for the builder's Python must come from exactly the release's branch
(``r<YY.MM>``). Where no ``nvidia-pytriton`` wheel bundles one, :func:`compile_stub` builds it in a
Docker build stage on ``build_image`` (the release image itself: the stub links its glibc), with
that distribution's compiler and Boost headers, CMake from PyPI's wheel
(:mod:`builder.bridge.cmake_wheel`) and Python's development files from the release's
``pythonX.Y-dev`` — or, for a bridged image, from the interpreter image whose Python the
environment carries (``python_image``), which also serves releases whose distribution packages
no such Python (``dockerfiles/python-backend-stub.Dockerfile.j2``).

Sources are fetched by the build (``git clone`` of the branch; CMake's FetchContent fetches
common, core, backend, pybind11 and dlpack) unless ``sources`` names a directory of ``git
archive`` tarballs — ``python_backend-r24.10.tar.gz``, ``common-r24.10.tar.gz``, …,
``pybind11-<tag>.tar.gz``, ``dlpack-<tag>.tar.gz`` — for builders that reach no source host.
Boost comes from the distribution in both cases (the branch's own Boost download is patched out;
the stub uses Boost's headers only). The result is cached by everything that went into it.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

import docker
import docker.errors

from builder.bridge.cmake_wheel import CMAKE_REQUIREMENT, cmake_directory
from builder.bridge.errors import StubBuildError
from builder.bridge.interpreter import COPY_SCRIPT
from builder.cache import DownloadError, cache_dir, cached_download, content_hash, staged
from builder.engine.container_lifecycle import throwaway_container
from builder.engine.dockerfile import render, template_source
from builder.engine.image_build import build_image
from builder.engine.platforms import platform_of_machine, platform_option
from builder.interrupts import deferred_interrupts
from builder.progress import Log

TEMPLATE = "python-backend-stub.Dockerfile.j2"
STUB_PATH = "/triton_python_backend_stub"
CUDA_ROOT = "/usr/local/cuda"
"""Where the NGC release images keep the CUDA toolkit a GPU-on stub is compiled with."""
CUDA_HOST_COMPILER_SCRIPT = Path(__file__).with_name("cuda_host_compiler.py")
"""Run in the stage (GPU on): picks the host compiler the image's nvcc accepts."""
UNITY_MAKE_SCRIPT = Path(__file__).with_name("unity_make.py")
"""Run in the stage: makes the targets as unity builds, file by file where that fails."""
BACKEND_PATH = "/python_backend"
"""With ``backend=True``, where the stage leaves the branch's :data:`BACKEND_FILES`."""
BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")
SOURCE_DIRECTORY_VARIABLE = "TRITON_BUILDER_TRITON_SOURCES"
"""A directory of source tarballs used instead of fetching (as ``sources=``)."""

PATCH_BOOST = (
    "import pathlib, re, sys; p = pathlib.Path(sys.argv[1]); s = p.read_text(); "
    "s = re.sub(r'ExternalProject_Add\\(\\s*boostorg.*?\\n\\)\\n', "
    "'add_custom_target(boostorg)\\n', s, flags=re.S); "
    "s = s.replace('set(boostorg_INCLUDE_DIRS \"${CMAKE_BINARY_DIR}/boost/\")', "
    "'set(boostorg_INCLUDE_DIRS \"/usr/include\")'); p.write_text(s)"
)
"""Drop the branch's Boost download (unreachable offline) for the distribution's headers."""


def compile_stub(
    client: docker.DockerClient,
    *,
    branch: str,
    python_version: str,
    build_image_name: str,
    python_image: str | None = None,
    pybind11: str | None = None,
    sources: str | os.PathLike | None = None,
    gpu: bool = False,
    backend: bool = False,
    jobs: int = 2,
    unity: bool = True,
    on_log: Log | None = None,
) -> Path:
    """Build ``triton_python_backend_stub`` of ``branch`` for ``python_version``; return its path.

    ``python_image`` holds the Python to build against (a bridged image's interpreter image);
    without it, ``build_image_name``'s own ``pythonX.Y-dev``. ``pybind11`` is a version whose
    PyPI source replaces the branch's pin (which cannot build newer Pythons). ``sources`` (default
    ``$TRITON_BUILDER_TRITON_SOURCES``) is a directory of source tarballs; without it the build
    fetches the sources. ``gpu`` builds with ``TRITON_ENABLE_GPU`` (NGC releases: the CUDA
    toolkit is in their image, at :data:`CUDA_ROOT`). ``backend`` builds the branch's backend
    library as well: ``libtriton_python.so`` and the branch's ``triton_python_backend_utils.py``
    then lie beside the returned stub, a whole python backend of that branch (the tests load it
    into the host Triton to run each release's python backend API). The stage is built for
    ``build_image_name``'s platform (an arm64 release image: an arm64 stub, compiled under
    emulation on an amd64 machine). ``unity`` compiles the targets as unity builds
    (:mod:`builder.bridge.unity_make`); off, file by file as python_backend's own build does
    (``benchmarks/bench_stub_compile.py`` times the two).
    """
    log = on_log or (lambda line: None)
    sources = sources or os.environ.get(SOURCE_DIRECTORY_VARIABLE)
    archives = (source_archives(Path(sources), branch, pinned_pybind11=not pybind11)
                if sources else [])
    dockerfile = render_stub_dockerfile(branch=branch, python_version=python_version,
                                        build_image_name=build_image_name,
                                        python_image=python_image, pybind11=pybind11,
                                        local_sources=bool(archives), gpu=gpu,
                                        backend=backend, jobs=jobs, unity=unity)
    images = [_image(client, build_image_name, "the image to build the stub on")]
    scripts = [UNITY_MAKE_SCRIPT]  # what the stages run
    if python_image:
        images.append(_image(client, python_image, f"the image holding Python {python_version}"))
        scripts.append(COPY_SCRIPT)
    if gpu:
        scripts.append(CUDA_HOST_COMPILER_SCRIPT)
    key = content_hash(dockerfile, template_source(TEMPLATE), CMAKE_REQUIREMENT,
                       *(script.read_bytes() for script in scripts),
                       *(image.id for image in images), *(archive.name for archive in archives))
    entry = cache_dir("stubs") / key[:32]
    stub = entry / "triton_python_backend_stub"
    produced = (stub.name, *(BACKEND_FILES if backend else ()))
    if all((entry / name).is_file() for name in produced):
        log(f"python_backend {branch} stub for Python {python_version} is cached: {stub}")
        return stub
    with tempfile.TemporaryDirectory(prefix="stub-build-") as workdir:
        context = Path(workdir)
        (context / "Dockerfile").write_text(dockerfile)
        (context / "sources").mkdir()
        shutil.copytree(cmake_directory(images[0].attrs.get("Architecture", "amd64")),
                        context / "cmake", symlinks=True)
        for script in scripts:
            shutil.copyfile(script, context / script.name)
        if pybind11:
            _unpack_source(pybind11_source(pybind11), context / "pybind11")
        for archive in archives:
            shutil.copyfile(archive, context / "sources" / archive.name)
        log(f"compiling the python_backend {branch} stub for Python {python_version} on "
            f"{build_image_name}" + (f" from {sources}" if archives else " (fetching sources)"))
        made: list[str] = []
        built = None
        platform = platform_of_machine(images[0].attrs.get("Architecture", "amd64"))
        try:
            built = build_image(client, context, [], network_mode="host", on_log=log,
                                made=made, platform=platform_option(platform))
            _copy_out(client, built.id, entry, backend)
        finally:
            _remove_stage(client, [built.id] if built is not None else made[-1:])
    return stub


def _remove_stage(client: docker.DockerClient, image_ids: list[str]) -> None:
    """Remove the stage's image, also when the build was stopped as it ended and never
    returned it (then: the last image it made, if any). Docker prunes the layers below that no
    other image holds with it: a compile is cached as its stub, not as some hundreds of MB of
    compilers and sources (so the next compile installs its packages again)."""
    for image_id in image_ids:
        with deferred_interrupts():
            try:
                client.images.remove(image_id, force=True)
            except docker.errors.APIError:
                pass


def render_stub_dockerfile(*, branch: str, python_version: str, build_image_name: str,
                           local_sources: bool, gpu: bool, python_image: str | None = None,
                           pybind11: str | None = None, backend: bool = False,
                           jobs: int = 2, unity: bool = True) -> str:
    """The Dockerfile of the stub's build stage (``dockerfiles/python-backend-stub``)."""
    return render(TEMPLATE, branch=branch, python_version=python_version,
                  build_image=build_image_name, python_image=python_image, pybind11=pybind11,
                  local_sources=local_sources, patch_boost=PATCH_BOOST,
                  gpu="ON" if gpu else "OFF", cuda_root=CUDA_ROOT if gpu else None,
                  backend=backend, jobs=jobs, unity="ON" if unity else "OFF")


def source_archives(directory: Path, branch: str, *, pinned_pybind11: bool = True) -> list[Path]:
    """The tarballs of ``branch`` and the pybind11 (unless replaced) and dlpack its
    ``CMakeLists.txt`` pins."""
    if not directory.is_dir():
        raise StubBuildError(f"the source directory {directory} does not exist")
    own = [directory / f"{name}-{branch}.tar.gz"
           for name in ("python_backend", "common", "core", "backend")]
    missing = [path.name for path in own if not path.is_file()]
    if missing:
        raise StubBuildError(f"{directory} lacks {', '.join(missing)} (python_backend {branch} "
                             f"and the common, core and backend repositories of that branch)")
    with tarfile.open(own[0]) as archive:
        member = archive.extractfile("python_backend/CMakeLists.txt")
        cmake = io.TextIOWrapper(member).read() if member else ""
    pinned = []
    for name in ("pybind11", "dlpack") if pinned_pybind11 else ("dlpack",):
        found = re.search(rf'FetchContent_Declare\(\s*{name}.*?GIT_TAG\s+"?([^"\s)]+)', cmake,
                          re.S)
        tag = found.group(1) if found else ""
        matches = sorted(directory.glob(f"{name}-{tag[:7]}*.tar.gz")) if tag else []
        if not matches:
            raise StubBuildError(f"{directory} has no {name}-{tag[:7]}*.tar.gz ({name} {tag!r} "
                                 f"is what python_backend {branch} pins)")
        pinned.append(matches[-1])
    return own + pinned


def pybind11_source(version: str) -> Path:
    """PyPI's source distribution of pybind11 ``version``, cached: headers and the CMake
    package (``pybind11/share/cmake/pybind11``), as ``pip install pybind11`` would install."""
    try:
        return cached_download(f"pybind11=={version}", "sources", f"pybind11-{version}.tar.gz",
                               "--no-binary=:all:")
    except DownloadError as error:
        raise StubBuildError(f"could not download pybind11 {version}'s source from PyPI "
                             f"(the stub's Python needs it):\n{error.output[-2000:]}") from error


def _unpack_source(archive: Path, destination: Path) -> None:
    """Unpack a source tarball's single top directory as ``destination``."""
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            _, _, inner = member.name.partition("/")
            if inner:
                member.name = inner
                members.append(member)
        tar.extractall(destination, members=members, filter="data")


def stub_python(stub: Path) -> str | None:
    """The ``X.Y`` of the ``libpythonX.Y`` a stub links."""
    found = re.search(rb"libpython(3\.\d+)\.so", stub.read_bytes())
    return found.group(1).decode() if found else None


def _image(client: docker.DockerClient, name: str, what: str) -> docker.models.images.Image:
    try:
        return client.images.get(name)
    except docker.errors.ImageNotFound as error:
        raise StubBuildError(f"{what}, {name}, is not on this engine") from error


def _copy_out(client: docker.DockerClient, image_id: str, entry: Path, backend: bool) -> None:
    with throwaway_container(client, image_id, command=["true"]) as container:
        archives = [b"".join(container.get_archive(path)[0])
                    for path in (STUB_PATH, *((BACKEND_PATH,) if backend else ()))]
    _place(archives, entry, backend)


def _place(archives: list[bytes], entry: Path, backend: bool) -> None:
    """Unpack the stage's archives (the stub's, then with ``backend`` the backend's) as the
    cache ``entry`` (:func:`builder.cache.staged`); an entry is whole when it has every file."""
    produced = ("triton_python_backend_stub", *(BACKEND_FILES if backend else ()))
    with staged(entry, lambda at: all((at / name).is_file() for name in produced)) as staging:
        for data in archives:
            with tarfile.open(fileobj=io.BytesIO(data)) as archive:
                archive.extractall(staging, filter="tar")
        if backend:
            for name in BACKEND_FILES:
                (staging / Path(BACKEND_PATH).name / name).rename(staging / name)
            (staging / Path(BACKEND_PATH).name).rmdir()
        (staging / "triton_python_backend_stub").chmod(0o755)
