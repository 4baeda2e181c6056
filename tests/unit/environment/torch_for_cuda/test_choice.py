"""torch for the release's CUDA, shown from the chosen wheel's own metadata; CUDA runtimes in
environments held against the release's minimum driver.

These tests use the network: PyPI's simple index (listings, PEP 658 metadata files, range reads
of wheels whose metadata file is missing) and ``pip download --no-deps`` (about 1 MB each).
No wheel of torch is downloaded. Where PyTorch's own index (download.pytorch.org) is reachable
the default resolution uses it; ``pytorch_index=None`` forces the package-index path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from builder.base.releases import resolve
from builder.environment.archive_check import archive_cuda_runtime
from builder.environment.errors import SpecError
from builder.environment.spec import requirements_spec
from builder.environment.target import platform_tags
from builder.environment.torch_for_cuda.choice import (
    PICKLE_SOURCE,
    PYPI_SIMPLE,
    PYTHON_MODEL_SOURCE,
    pytorch_index_cuda,
    resolve_cuda_packages,
    wheel_cuda,
)
from builder.environment.torch_for_cuda.wheel_metadata import list_wheels, read_metadata
from builder.image.serving_image import EnvironmentMismatchError, check_environment_cuda


def _platforms(glibc: str) -> list[str]:
    return platform_tags(glibc, "x86_64")


def _resolve(cuda, triton, requirement="torch==2.13.0", source=PICKLE_SOURCE, **options):
    release = resolve(cuda, triton)
    glibc = release.glibc
    logged: list[str] = []
    resolution = resolve_cuda_packages(
        requirements_spec([requirement], source), release, python_version=release.python_version,
        platforms=_platforms(glibc), on_log=logged.append, **options)
    return release, resolution, logged


def _runtime_line(metadata: str) -> str:
    return next(line for line in metadata.splitlines() if line.startswith("Requires-Dist") and (
        "cuda-runtime" in line or ("cuda-toolkit" in line and "cudart" in line)))


@pytest.mark.parametrize(("cuda", "triton", "runtime"), [
    ("11.8", "22.12", "nvidia-cuda-runtime-cu11 (==11.7."),  # PyPI's newest CUDA 11 torch
    ("12.4", "24.05", "nvidia-cuda-runtime-cu12 (==12.4."),
    ("12.6", "24.12", "nvidia-cuda-runtime-cu12==12.6."),
    ("13.0", "25.11", "cuda-toolkit[cublas,cudart,"),
])
def test_without_pytorchs_index_torch_is_chosen_by_its_wheels_cuda_runtime(cuda, triton,
                                                                           runtime):
    release, resolution, logged = _resolve(cuda, triton, pytorch_index=None)
    (choice,) = resolution.choices
    assert resolution.spec.requirements == (choice.requirement,)
    major, minor = (int(p) for p in choice.cuda.split("."))
    assert major == int(cuda.split(".")[0]) and minor <= int(cuda.split(".")[1])
    assert release.cuda_runtime_problem(choice.cuda) is None
    # the wheel's own metadata, read again here, requires that runtime
    version = Requirement(choice.requirement).specifier
    wheel = next(w for w in list_wheels(PYPI_SIMPLE, "torch") if w.filename == choice.wheel)
    assert wheel.version in version
    metadata, _ = read_metadata(wheel)
    assert runtime in _runtime_line(metadata)
    assert wheel_cuda(metadata, release.python_version).cuda == choice.cuda
    assert f"cp{release.python_version.replace('.', '')}" in choice.wheel
    assert len(logged) == 1 and choice.wheel in logged[0] and "PyTorch's index" in logged[0]


def test_by_default_pytorchs_per_cuda_index_is_tried_first_and_its_absence_reported():
    assert [pytorch_index_cuda(resolve(c)) for c in ("11.4", "11.8", "12.3", "12.5", "12.9",
                                                     "13.0")] == [
        "11.8", "11.8", "12.1", "12.4", "12.8", "13.0"]
    assert pytorch_index_cuda(resolve(None)) is None
    _, resolution, _ = _resolve("12.4", "24.05")
    (choice,) = resolution.choices
    assert choice.cuda == "12.4"
    if resolution.index.extra_index_urls:  # download.pytorch.org answered
        assert resolution.index.extra_index_urls == ("https://download.pytorch.org/whl/cu124",)
        assert "+cu124" in choice.requirement
    else:
        assert "download.pytorch.org/whl/cu124 could not be reached" in choice.reason


def test_the_cpu_base_gets_a_cpu_wheel_shown_by_its_metadata():
    """Here PyTorch's CPU index is unreachable: pip's configuration resolves the CPU wheel of
    /opt/wheels (``torch-2.13.0+cpu``), downloaded with ``--no-deps`` and read."""
    _, resolution, logged = _resolve(None, None)
    (choice,) = resolution.choices
    assert choice.cuda is None and choice.evidence.startswith("requires no CUDA runtime")
    assert choice.requirement.startswith("torch==2.13.0")
    assert "built for the CPU" in logged[0]


def test_a_pin_the_release_cannot_run_is_refused_saying_which():
    with pytest.raises(SpecError) as refused:
        _resolve("12.4", "24.05", source="envs/my-env.txt:3", pytorch_index=None)
    message = str(refused.value)
    assert "torch==2.13.0 (envs/my-env.txt:3)" in message
    assert "24.05 (CUDA 12.4, driver >= 550)" in message and "(read: 2.13.0: CUDA 13.0)" in message


def test_the_torch_of_python_format_operators_is_kept_and_its_refusal_says_what_to_do():
    """Their modules are pickled with the builder's torch: no other version is chosen for them,
    and the refusal names the ways out, not only the index."""
    with pytest.raises(SpecError) as refused:
        _resolve("11.8", "22.12", source=PYTHON_MODEL_SOURCE, pytorch_index=None)
    message = str(refused.value)
    assert "torch==2.13.0 (python-format model operators)" in message
    assert "pickled with the torch of the building machine (torch==2.13.0)" in message
    assert "built for CUDA 11.8 (22.12)" in message and "export to ONNX or TorchScript" in message


def test_companion_pins_are_loosened_and_foreign_cuda_packages_refused():
    release = resolve("12.4")
    spec = requirements_spec(["torchvision==0.28.0"], PICKLE_SOURCE)
    resolution = resolve_cuda_packages(spec, release, python_version="3.10",
                                       platforms=_platforms("2.35"), pytorch_index=None)
    assert resolution.spec.requirements == ("torchvision",)
    with pytest.raises(SpecError, match=r"nvidia-cudnn-cu13==9.*CUDA 13.*-cu12 package"):
        resolve_cuda_packages(requirements_spec(["nvidia-cudnn-cu13==9.20.0.48"], "envs/x.txt"),
                              release, python_version="3.10", platforms=_platforms("2.35"))


@pytest.fixture(scope="module")
def cuda_12_8_environment(tmp_path_factory):
    """A packed environment holding the real ``nvidia-cuda-runtime-cu12`` 12.8 wheel."""
    root = tmp_path_factory.mktemp("cuda-env")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--only-binary=:all:", "--platform", "manylinux2014_x86_64",
                    "--python-version", "3.10", "-d", str(root / "wheels"),
                    "nvidia-cuda-runtime-cu12==12.8.90"], check=True)
    (wheel,) = (root / "wheels").glob("*.whl")
    site = root / "env" / "lib" / "python3.10" / "site-packages"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    tarball = root / "environment.tar.gz"
    with tarfile.open(tarball, "w:gz") as archive:
        archive.add(root / "env", arcname=".")
    return tarball


def test_an_environment_whose_cuda_runtime_the_drivers_cannot_run_is_refused(
        cuda_12_8_environment, tmp_path):
    runtime = archive_cuda_runtime(cuda_12_8_environment)
    assert (runtime.cuda, runtime.distribution) == ("12.8", "nvidia_cuda_runtime_cu12-12.8.90")
    with pytest.raises(EnvironmentMismatchError) as refused:
        check_environment_cuda(cuda_12_8_environment, resolve("11.8", "22.12"))
    assert ("carries nvidia_cuda_runtime_cu12-12.8.90: CUDA runtime 12.8 needs driver >= 525, "
            "but 22.12 (CUDA 11.8) only needs driver >= 520") in str(refused.value)
    check_environment_cuda(cuda_12_8_environment, resolve("12.8"))
    check_environment_cuda(cuda_12_8_environment, resolve("12.4"))  # 550: minor version compat
    check_environment_cuda(cuda_12_8_environment, resolve(None))
    cpu_only = tmp_path / "cpu.tar.gz"
    with tarfile.open(cpu_only, "w:gz") as archive:
        archive.add(__file__, arcname="lib/python3.10/site-packages/x.py")
    assert archive_cuda_runtime(cpu_only) is None


def test_doctor_reads_the_environments_cuda_runtime(cuda_12_8_environment):
    from builder.doctor import run_checks

    checks = {c.name: c for c in run_checks("11.8", cuda_12_8_environment)}
    assert checks["environment cuda"].status == "fail"
    assert ("environment.tar.gz (nvidia_cuda_runtime_cu12-12.8.90): CUDA runtime 12.8 needs "
            "driver >= 525") in checks["environment cuda"].detail
    assert {c.name: c for c in run_checks("12.8", cuda_12_8_environment)}[
        "environment cuda"].status == "ok"


def test_two_torch_requirements_that_resolve_alike_become_one():
    from builder.environment.spec import merge_specs

    release = resolve("12.4")
    spec = merge_specs(requirements_spec(["torch==2.6.0"], PICKLE_SOURCE),
                       requirements_spec(["torch"], "dlpack"))
    resolution = resolve_cuda_packages(spec, release, python_version="3.10",
                                       platforms=_platforms("2.35"), pytorch_index=None)
    assert resolution.spec.requirements == ("torch===2.6.0",)
    assert len(resolution.spec.origins["torch===2.6.0"]) == 2


def test_a_torch_chosen_for_a_cuda_is_pinned_so_that_no_local_cpu_build_of_it_is_installed(
        tmp_path):
    """pip itself resolves the pin (``--dry-run --report``: metadata only) with this machine's
    find-links, whose wheelhouse holds ``torch-2.13.0+cpu``: ``torch==2.13.0`` took that CPU
    build into an environment chosen for CUDA 13.0; the pin the choice writes takes PyPI's."""
    local = [w for d in os.environ.get("PIP_FIND_LINKS", "").split()
             for w in Path(d).glob("torch-2.13.0+cpu-*.whl")]
    if not local:
        pytest.skip("no local torch-2.13.0+cpu wheel in PIP_FIND_LINKS to be taken instead")
    resolution = resolve_cuda_packages(
        requirements_spec(["torch==2.13.0"], PYTHON_MODEL_SOURCE), resolve("13.0", slim=True),
        python_version="3.11", platforms=_platforms("2.36"), pytorch_index=None)
    (choice,) = resolution.choices
    assert choice.requirement == "torch===2.13.0" and choice.cuda == "13.0"

    def installed(requirement: str) -> str:
        report = tmp_path / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps",
                        "--ignore-installed", "--only-binary=:all:", "--implementation", "cp",
                        "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11",
                        "--target", str(tmp_path / "t"), "--report", str(report), "-q",
                        requirement], check=True, capture_output=True)
        (item,) = json.loads(report.read_text())["install"]
        return item["download_info"]["url"].rsplit("/", 1)[-1]

    assert "%2Bcpu" in installed("torch==2.13.0")  # what the environment got before
    assert installed(choice.requirement).startswith("torch-2.13.0-cp311")
