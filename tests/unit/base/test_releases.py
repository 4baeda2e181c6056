"""The CUDA → Triton release table and :func:`builder.base.releases.resolve`."""

from __future__ import annotations

import pytest

from builder.base.releases import (
    NOTES,
    RELEASES,
    TOOLKIT,
    UnsupportedCudaError,
    cpu_release,
    resolve,
    supported_cuda_versions,
)
from builder.engine.platforms import AMD64, ARM64
from builder.tritonserver.wheel import TRITON_VERSION


def test_the_table_covers_cuda_11_4_to_13_0():
    versions = supported_cuda_versions()
    assert versions[0] == "11.4" and versions[-1] == "13.0"
    assert {"11.4", "11.8", "12.4", "12.6", "13.0"} <= set(versions)


def test_every_release_is_complete_and_in_order():
    names = [r.release for r in RELEASES]
    assert names == sorted(names) and len(set(names)) == len(names)
    for release in RELEASES:
        assert release.image == f"nvcr.io/nvidia/tritonserver:{release.release}-py3"
        assert release.python_version in ("3.8", "3.10", "3.12")
        assert release.ubuntu in ("20.04", "22.04", "24.04")
        assert release.driver_source in (NOTES, TOOLKIT)
        assert release.min_driver >= 470
        assert release.safe_driver >= release.min_driver
        assert release.safe_driver >= release.toolkit_driver


@pytest.mark.parametrize("cuda, release, triton, python", [
    ("11.4", "21.10", "2.15.0", "3.8"),
    ("11.8", "22.12", "2.29.0", "3.8"),
    ("12.1", "23.07", "2.36.0", "3.10"),
    ("12.4", "24.05", "2.46.0", "3.10"),
    ("12.6", "24.10", "2.51.0", "3.10"),  # from 3.11: 24.10's wheel stub beats compiling 24.12
    ("13.0", "25.11", "2.63.0", "3.12"),
])
def test_cuda_resolves_to_the_newest_release(cuda, release, triton, python):
    resolved = resolve(cuda)
    assert (resolved.release, resolved.triton_version, resolved.python_version) == (
        release, triton, python)
    assert resolved.gpu and resolved.cuda == cuda


def test_the_release_notes_values_are_kept_beside_the_toolkit_minimum():
    r2410 = resolve("12.6", triton_version="2.51")
    assert (r2410.release, r2410.min_driver, r2410.driver_source) == ("24.10", 560, NOTES)
    r2403 = resolve("12.4", triton_version="24.03")
    assert (r2403.min_driver, r2403.toolkit_driver, r2403.safe_driver) == (545, 550, 550)


def test_a_release_with_a_known_defect_is_skipped_unless_asked_for():
    assert resolve("12.3").release == "24.01"
    assert resolve("12.3", triton_version="24.02").release == "24.02"
    assert "onnxruntime" in resolve("12.3", triton_version="2.43.0").known_issue


def test_versions_are_read_leniently():
    assert resolve("11.8.0").release == resolve(11.8).release == resolve("cuda11.8").release
    assert resolve("12.6", triton_version="2.51.0").release == "24.10"


def test_explicit_triton_version_and_base_image_override():
    release = resolve("11.8", triton_version="2.27")
    assert release.release == "22.10"
    mirrored = resolve("11.8", base_image="mirror.example.com/tritonserver:22.12-py3")
    assert mirrored.image == "mirror.example.com/tritonserver:22.12-py3"
    assert mirrored.python_version == "3.8"


@pytest.mark.parametrize("cuda", [None, "cpu", "CPU"])
def test_no_cuda_is_the_cpu_base(cuda):
    release = resolve(cuda)
    assert release == cpu_release()
    assert not release.gpu and release.triton_version == TRITON_VERSION
    assert release.image == "triton-builder/tritonserver-cpu:2.51.0-py3.11"
    assert resolve(cuda, base_image="my/cpu-base:1").image == "my/cpu-base:1"


def test_unknown_cuda_lists_the_supported_versions():
    with pytest.raises(UnsupportedCudaError, match=r"11\.4, 11\.5.*13\.0"):
        resolve("10.2")
    with pytest.raises(UnsupportedCudaError, match="supported"):
        resolve("twelve")


def test_a_triton_version_not_built_on_that_cuda_is_refused():
    with pytest.raises(UnsupportedCudaError, match="2.26.0 .22.09."):
        resolve("11.8", triton_version="2.51")
    with pytest.raises(UnsupportedCudaError, match="CPU base is Triton 2.51.0"):
        resolve(None, triton_version="2.45")


# The slim GPU route: our Debian base with the nvidia-pytriton wheel's Triton 2.51 (CUDA 12.6
# runtime), the environment's CUDA from NVIDIA's wheels.

@pytest.mark.parametrize(("cuda", "driver", "driver_cuda"), [
    ("12.0", 525, "12.0"), ("12.6", 525, "12.0"), ("12.9", 525, "12.0"), ("13.0", 580, "13.0")])
def test_the_slim_route_serves_cuda_12_and_13_natively_on_the_wheels_triton(cuda, driver,
                                                                             driver_cuda):
    from builder.base.releases import builder_python
    from builder.environment.unpacking import ships_unpacked

    release = resolve(cuda, slim=True)
    assert release.slim and release.gpu and not release.ngc
    assert (release.cuda, release.triton_version, release.python_version) == (
        cuda, TRITON_VERSION, builder_python())
    assert release.image == f"triton-builder/tritonserver-gpu-slim:2.51.0-py{builder_python()}"
    assert (release.min_driver, release.driver_cuda) == (driver, driver_cuda)
    assert release.safe_driver >= release.min_driver
    assert release.branch == "r24.10" and release.restricts_apis and ships_unpacked(release)
    assert release.stub_source(builder_python()).value == "release"


@pytest.mark.parametrize("cuda", ["11.4", "11.8"])
def test_the_slim_route_refuses_a_cuda_whose_drivers_may_not_run_its_server(cuda):
    """CUDA 11 machines run drivers from 450; the server's CUDA 12.6 runtime needs 525."""
    with pytest.raises(UnsupportedCudaError) as refused:
        resolve(cuda, slim=True)
    message = str(refused.value)
    assert f"cannot serve CUDA {cuda}" in message and "needs driver >= 525" in message
    assert f"use the NGC route: cuda='{cuda}' without slim" in message
    assert resolve(cuda).ngc  # the NGC route it names does serve it


def test_the_slim_route_is_refused_without_a_cuda_or_with_another_triton():
    with pytest.raises(UnsupportedCudaError, match="slim=True is a GPU route: pass cuda="):
        resolve(None, slim=True)
    with pytest.raises(UnsupportedCudaError, match="serves Triton 2.51.0"):
        resolve("12.6", triton_version="2.53", slim=True)
    with pytest.raises(UnsupportedCudaError, match="runs the builder's own Python"):
        resolve("12.6", base_python="3.13", slim=True)
    assert resolve("12.6", triton_version="2.51", slim=True).slim


def test_the_slim_route_is_refused_for_arm64_naming_the_ways_out():
    """The slim base is built from the x86_64 wheel only: an arm64 slim build would have
    nothing to run on, so it is refused before anything, with the NGC route and amd64 named."""
    with pytest.raises(UnsupportedCudaError, match="no linux/arm64 base yet") as refused:
        resolve("12.6", slim=True, platform=ARM64)
    assert "leave slim off" in str(refused.value) and "linux/amd64 alone" in str(refused.value)
    assert resolve("12.6", slim=True, platform=AMD64).slim
