"""The stub stage's make (``builder/bridge/unity_make.py``), run as the stage runs it, on this
machine's CMake and g++ with a two-file project: a unity build where the sources combine, and
file by file where they do not (the stub compiles of every branch read here take the first path,
in ``tests/e2e/test_stub_build.py`` and beside it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from builder.bridge.stub_build import UNITY_MAKE_SCRIPT, render_stub_dockerfile
from builder.bridge.unity_make import FALLBACK
from builder.host_packages import ensure_program

CMAKELISTS = """cmake_minimum_required(VERSION 3.16)
project(unity_probe CXX)
add_executable(probe main.cc helper.cc)
"""
MAIN = "int helper();\nstatic int own() { return 40; }\nint main() { return own() + helper(); }\n"


def _project(root: Path, helper: str) -> Path:
    root.mkdir()
    (root / "CMakeLists.txt").write_text(CMAKELISTS)
    (root / "main.cc").write_text(MAIN)
    (root / "helper.cc").write_text(helper)
    build = root / "build"
    build.mkdir()
    cmake = ensure_program("cmake", "cmake")
    ensure_program("make", "make")
    ensure_program("g++", "g++")
    subprocess.run([cmake, "..", "-DCMAKE_UNITY_BUILD=ON"], cwd=build, check=True,
                   capture_output=True)
    return build


def _make(build: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["python3", str(UNITY_MAKE_SCRIPT), ensure_program("cmake", "cmake"),
                           "2", "probe"], cwd=build, capture_output=True, text=True)


@pytest.mark.parametrize("helper, unity", [
    ("int helper() { return 2; }\n", True),
    # a second file-local own(): one translation unit holding both files redefines it
    ("static int own() { return 1; }\nint helper() { return own() + 1; }\n", False),
], ids=["sources-combine", "sources-clash"])
def test_targets_are_made_as_one_unit_or_file_by_file(tmp_path, helper, unity):
    build = _project(tmp_path / "project", helper)
    made = _make(build)
    assert made.returncode == 0, made.stdout + made.stderr
    assert (FALLBACK in made.stdout) is not unity, made.stdout
    objects = {path.name for path in build.rglob("*.o")}
    if unity:
        assert objects == {"unity_0_cxx.cxx.o"}, objects
    else:
        assert "redefinition" in made.stderr, made.stderr
        assert {"main.cc.o", "helper.cc.o"} <= objects, objects
    assert subprocess.run([str(build / "probe")]).returncode == 42


def test_a_failure_of_the_file_by_file_build_too_is_the_scripts_failure(tmp_path):
    build = _project(tmp_path / "project", "int helper() { return missing(); }\n")
    made = _make(build)
    assert made.returncode != 0
    assert FALLBACK in made.stdout
    assert made.stderr.count("was not declared in this scope") == 2, made.stderr
    assert "helper.cc.o] Error" in made.stderr, "the second attempt compiled file by file"


def test_the_stage_configures_unity_builds_and_makes_through_the_script():
    common = dict(branch="r24.10", python_version="3.11", build_image_name="release",
                  local_sources=True, gpu=False)
    unity = render_stub_dockerfile(**common)
    assert "-DCMAKE_UNITY_BUILD=ON" in unity
    assert "COPY unity_make.py /unity_make.py" in unity
    assert "python3 /unity_make.py /opt/cmake/bin/cmake 2 triton-python-backend-stub" in unity
    assert "-DCMAKE_UNITY_BUILD=OFF" in render_stub_dockerfile(unity=False, **common)
