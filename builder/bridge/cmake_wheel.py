"""CMake for the stub's build stage, from PyPI's ``cmake`` wheel rather than the distribution.

Release images come with distributions whose CMake can be older than a python_backend branch
asks for: Ubuntu 20.04 (22.12, the CUDA 11.8 release) has 3.16, r22.12's ``CMakeLists.txt``
says ``cmake_minimum_required(VERSION 3.17)``. The wheel's binaries are manylinux2014 (glibc
2.17), so they run on every release image. CMake 4 refuses ``cmake_minimum_required`` below 3.5,
which dependencies of the older branches still declare: the newest 3.x it is.
"""

from __future__ import annotations

from pathlib import Path

from builder.bridge.errors import CMakeDownloadError
from builder.cache import DownloadError, cache_dir, cached_download
from builder.tritonserver.wheel import unpack_wheel

CMAKE_REQUIREMENT = "cmake==3.31.6"
"""The newest CMake 3 on PyPI (the 3.31 series)."""
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}
"""Docker's architecture names → the wheel's platform tags."""


def cmake_directory(architecture: str = "amd64") -> Path:
    """A directory with ``bin/cmake`` and ``share/cmake-3.31`` for ``architecture``, cached."""
    machine = MACHINES.get(architecture)
    if machine is None:
        raise CMakeDownloadError(f"no CMake wheel for the {architecture} architecture "
                                 f"(known: {', '.join(MACHINES)})")
    version = CMAKE_REQUIREMENT.split("==")[1]
    root = cache_dir("tools") / f"cmake-{version}-{machine}"
    if not (root / ".complete").exists():
        try:
            wheel = cached_download(
                CMAKE_REQUIREMENT, "wheels", f"cmake-{version}-*manylinux2014_{machine}.whl",
                "--only-binary=:all:", "--platform", f"manylinux2014_{machine}",
                "--python-version", "3.8")
        except DownloadError as error:
            raise CMakeDownloadError(f"could not download {CMAKE_REQUIREMENT} for {machine} "
                                     f"(the stub build's CMake):\n{error.output[-2000:]}"
                                     ) from error
        unpack_wheel(wheel, root, ("cmake/data/",))
    return root / "cmake" / "data"
