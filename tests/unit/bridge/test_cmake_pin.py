"""The CMake the stub stage pins against what every python_backend branch it compiles requires.

The requirements are read from the branch tarballs in ``../shared/triton-sources`` where a branch
is kept there (r22.12, r23.05, r24.10, r24.12, r25.11); for the other branches of the release
table the test holds the pin against the table's value, which follows the documented rule
(3.17 up to r25.02, 3.31.8 from r25.08; :mod:`builder.bridge.python_backend_cmake`).
"""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import pytest

from builder.base.releases import RELEASES
from builder.bridge.cmake_wheel import CMAKE_REQUIREMENT
from builder.bridge.python_backend_cmake import (
    CMAKE_REQUIRED_FROM,
    cmake_required,
    newest_requirement,
    version_key,
)
from builder.bridge.routes import compiled_stub
from tests.support.paths import TRITON_SOURCES

SOURCES = TRITON_SOURCES
PIN = CMAKE_REQUIREMENT.split("==")[1]
PYTHONS = ("3.10", "3.11", "3.12", "3.13")


def _read_requirement(tarball: Path) -> str:
    with tarfile.open(tarball) as archive:
        member = archive.extractfile("python_backend/CMakeLists.txt")
        assert member is not None, f"{tarball.name} has no python_backend/CMakeLists.txt"
        text = io.TextIOWrapper(member).read()
    found = re.search(r"cmake_minimum_required\s*\(\s*VERSION\s+([\d.]+)", text, re.I)
    assert found, f"{tarball.name}'s CMakeLists.txt declares no cmake_minimum_required"
    return found.group(1)


def _compiled_branches() -> list[str]:
    """Every branch of the release table that the compile route takes for some Python."""
    return sorted({route.branch for release in RELEASES for python in PYTHONS
                   if (route := compiled_stub(release, python)) is not None and route.branch},
                  key=lambda branch: version_key(branch[1:]))


def test_the_pin_is_a_cmake_3_that_every_compiled_branch_accepts():
    branches = _compiled_branches()
    assert branches[0] == "r21.07" and branches[-1] == "r25.11"
    too_old = {branch: cmake_required(branch) for branch in branches
               if version_key(cmake_required(branch)) > version_key(PIN)}
    assert not too_old, f"cmake=={PIN} is older than these branches require: {too_old}"
    assert version_key(PIN) >= version_key(newest_requirement())
    assert version_key(PIN) < (4,), "CMake 4 refuses the old branches' dependencies"


@pytest.mark.skipif(not SOURCES.is_dir(), reason=f"no Triton source tarballs at {SOURCES}")
def test_the_table_says_what_each_branch_tarball_requires_and_the_pin_meets_it():
    tarballs = sorted(SOURCES.glob("python_backend-r*.tar.gz"))
    assert len(tarballs) >= 5, f"expected r22.12, r23.05, r24.10, r24.12, r25.11 in {SOURCES}"
    read = {path.name.removeprefix("python_backend-").removesuffix(".tar.gz"):
            _read_requirement(path) for path in tarballs}
    assert read["r25.11"] == "3.31.8" and read["r22.12"] == "3.17"
    assert {branch: cmake_required(branch) for branch in read} == read
    for branch, required in read.items():
        assert version_key(required) <= version_key(PIN), (
            f"python_backend {branch} requires CMake {required}; the stub stage pins {PIN}")


def test_the_table_names_a_source_for_every_row_and_refuses_unknown_branches():
    assert all(source for _, _, source in CMAKE_REQUIRED_FROM)
    assert cmake_required("r25.08") == "3.31.8" and cmake_required("r25.02") == "3.17"
    with pytest.raises(ValueError, match="r20.12"):
        cmake_required("r20.12")
