"""The decision table: builder Python × CUDA → release, native or bridged, stub, interpreter."""

from __future__ import annotations

import pytest

from builder.base.releases import RELEASES, resolve
from builder.bridge import (
    BridgeOptions,
    PythonBridgeError,
    plan_python,
    require_buildable,
    stub_route,
)
from builder.bridge.interpreter import interpreter_image_for
from builder.bridge.plan import alternatives

W, C, N = "pytriton-wheel", "compile", "release"
BULLSEYE, BOOKWORM = "bullseye", "bookworm"

# builder Python, CUDA -> release, stub route (None: refused), interpreter image suite
TABLE = {
    ("3.10", "11.8"): ("22.12", C, BULLSEYE),
    ("3.10", "12.1"): ("23.07", N, None),
    ("3.10", "12.4"): ("24.05", N, None),
    ("3.10", "12.6"): ("24.10", N, None),
    ("3.10", "12.8"): ("25.03", C, BOOKWORM),
    ("3.10", "13.0"): ("25.11", C, BOOKWORM),
    ("3.11", "11.8"): ("22.12", C, BULLSEYE),
    ("3.11", "12.1"): ("23.07", W, BULLSEYE),
    ("3.11", "12.4"): ("24.05", W, BULLSEYE),
    ("3.11", "12.6"): ("24.12", C, BOOKWORM),
    ("3.11", "12.8"): ("25.03", C, BOOKWORM),
    ("3.11", "13.0"): ("25.11", C, BOOKWORM),
    ("3.12", "11.8"): ("22.12", C, BULLSEYE),
    ("3.12", "12.1"): ("23.07", C, BULLSEYE),
    ("3.12", "12.4"): ("24.05", W, BULLSEYE),
    ("3.12", "12.6"): ("24.12", N, None),
    ("3.12", "12.8"): ("25.03", N, None),
    ("3.12", "13.0"): ("25.11", N, None),
    ("3.13", "11.8"): ("22.12", C, BULLSEYE),
    ("3.13", "12.1"): ("23.07", C, BULLSEYE),
    ("3.13", "12.4"): ("24.05", C, BULLSEYE),
    ("3.13", "12.6"): ("24.12", C, BOOKWORM),
    ("3.13", "12.8"): ("25.03", C, BOOKWORM),
    ("3.13", "13.0"): ("25.11", C, BOOKWORM),
}


@pytest.mark.parametrize("python, cuda", sorted(TABLE))
def test_decision_table(python, cuda):
    release_name, route, suite = TABLE[python, cuda]
    release = resolve(cuda, python_version=python)
    assert release.release == release_name
    if route is None:
        with pytest.raises(PythonBridgeError) as refused:
            plan_python(release, python, conda=False)
        message = str(refused.value)
        assert f"Python {python}" in message and "natively on" in message
        assert "through the bridge on" in message
        return
    plan = plan_python(release, python, conda=False)
    assert plan.stub.kind == route
    assert plan.bridged == (route != N)
    if route == N:
        assert plan.interpreter.kind == "release" and release.python_version == python
    else:
        assert plan.interpreter.kind == "interpreter-image"
        assert plan.interpreter.image == f"python:{python}-slim-{suite}"
        assert plan_python(release, python, conda=True).interpreter.kind == "conda-pack"
    if route == W:
        assert plan.stub.requirement.startswith("nvidia-pytriton==")
    if route == C:
        assert plan.stub.branch == f"r{release_name}"


def test_the_native_release_is_preferred_over_a_newer_bridged_one():
    assert resolve("12.6", python_version="3.10").release == "24.10"
    assert resolve("12.6", python_version="3.12").release == "24.12"


def test_a_bridgeable_release_is_preferred_over_a_newer_one_without_a_bridge():
    # 3.12 on CUDA 12.4: every release is 3.10; the wheels of 2.44-2.46 carry 3.12 stubs.
    assert resolve("12.4", python_version="3.12").release == "24.05"


def test_the_stub_wheel_bundles_the_releases_own_triton():
    for release in RELEASES:
        route = stub_route(release, "3.11")
        if route is not None and route.kind == W:
            assert release.pytriton_wheel in route.requirement
            assert "23.07" <= release.release <= "24.10"


def test_bridge_off_refuses_before_anything_with_the_alternatives():
    release = resolve("11.8", python_version="3.11")
    with pytest.raises(PythonBridgeError, match="bridge is turned off") as refused:
        plan_python(release, "3.11", BridgeOptions(enabled=False))
    native, bridged = str(refused.value).split("through the bridge")
    assert "natively on none" in native  # no NGC release runs Python 3.11
    assert "CUDA 11.8 (22.09–22.12)" in bridged


def test_native_needs_no_bridge_even_when_it_is_off():
    plan = plan_python(resolve("12.6", python_version="3.10"), "3.10", BridgeOptions(enabled=False))
    assert not plan.bridged


def test_alternatives_name_native_and_bridged_cuda_versions():
    text = alternatives("3.10")
    native, bridged = text.split("through the bridge")
    assert "CUDA 12.1 (23.05–23.07)" in native and "CUDA 11.8" in bridged


def test_the_interpreter_image_is_not_newer_than_the_releases_glibc():
    assert interpreter_image_for(resolve("11.8", python_version="3.11"), "3.11") == (
        "python:3.11-slim-bullseye")  # Ubuntu 20.04: glibc 2.31
    assert interpreter_image_for(resolve("13.0"), "3.11") == "python:3.11-slim-bookworm"


def test_the_trixie_cpu_base_stands_in_for_a_release_whose_python_is_not_ours():
    release = resolve(None, base_python="3.13")
    assert (release.python_version, release.glibc) == ("3.13", "2.41")
    plan = plan_python(release, "3.11", BridgeOptions(
        interpreter_image="triton-builder/debian-bookworm:python3.11"), conda=False)
    assert plan.bridged and plan.stub.kind == W
    assert plan.stub.requirement == "nvidia-pytriton==0.7.0"
    assert plan.interpreter.image == "triton-builder/debian-bookworm:python3.11"


def test_an_unknown_cpu_base_python_is_refused():
    with pytest.raises(ValueError, match="no CPU base with Python 3.9"):
        resolve(None, base_python="3.9")


def test_the_conda_route_is_refused_before_any_pull(monkeypatch, tmp_path):
    conda = plan_python(resolve("12.4", python_version="3.11"), "3.11", conda=True)
    with pytest.raises(PythonBridgeError, match="pass packer='venv'"):
        require_buildable(conda)
    (tmp_path / "conda").write_text("#!/bin/sh\n")
    (tmp_path / "conda").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    unasked = plan_python(resolve("12.4", python_version="3.11"), "3.11")
    assert unasked.interpreter.kind == "interpreter-image", "conda on PATH is not a request"
    require_buildable(unasked)
    require_buildable(plan_python(resolve("11.8", python_version="3.11"), "3.11", conda=False))
    require_buildable(plan_python(resolve("12.6", python_version="3.10"), "3.10",
                                  BridgeOptions(enabled=False)))


def test_the_compile_route_can_be_forced_where_pybind11_allows():
    native = plan_python(resolve(None), "3.11", BridgeOptions(compile_stub=True))
    assert not native.bridged and native.own_stub
    assert (native.stub.kind, native.stub.branch) == ("compile", "r24.10")
    assert plan_python(resolve("11.8", python_version="3.11"), "3.11",
                       BridgeOptions(compile_stub=True), conda=False).stub.branch == "r22.12"
    substituted = plan_python(resolve("12.4", python_version="3.12"), "3.12",
                              BridgeOptions(compile_stub=True))
    assert (substituted.stub.branch, substituted.stub.pybind11) == ("r24.05", "2.13.6")
    with pytest.raises(PythonBridgeError, match="pybind11 2.13.6 up to 3.13"):
        plan_python(resolve("12.4"), "3.14", BridgeOptions(compile_stub=True))


@pytest.mark.parametrize("python", ["3.12", "3.13"])
def test_python_newer_than_the_branchs_pybind11_compiles_with_pypis(python):
    """r22.12 pins pybind11 2.10 (Python up to 3.11): 3.12 and 3.13 get 2.13.6 instead."""
    plan = plan_python(resolve("11.8", python_version=python), python, conda=False)
    assert (plan.stub.kind, plan.stub.branch, plan.stub.pybind11) == (C, "r22.12", "2.13.6")
    assert "pybind11 2.13.6 from PyPI" in plan.describe()
    own = plan_python(resolve("11.8", python_version="3.11"), "3.11", conda=False)
    assert own.stub.pybind11 is None


def test_a_python_no_pybind11_supports_is_refused_with_the_alternatives():
    with pytest.raises(PythonBridgeError) as refused:
        plan_python(resolve("11.8"), "3.14", conda=False)
    message = str(refused.value)
    assert "no pybind11" in message and "supports Python 3.14" in message
    assert "natively on none" in message

