"""onnxruntime-gpu for the slim GPU route's CUDA, chosen by what its wheels declare.

These tests use the network, as the torch ones beside them do: PyPI's simple index and range
reads of onnxruntime-gpu wheels for their ``METADATA`` (no PEP 658 file there); no wheel is
downloaded.
"""

from __future__ import annotations

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from builder.base.releases import resolve
from builder.environment.errors import SpecError
from builder.environment.spec import merge_specs, requirements_spec
from builder.environment.target import platform_tags
from builder.environment.torch_for_cuda.choice import (
    PYPI_SIMPLE,
    PYTHON_MODEL_SOURCE,
    resolve_cuda_packages,
)
from builder.environment.torch_for_cuda.onnxruntime_gpu import (
    ONNX_OPERATOR_SOURCE,
    declared_cuda,
    serves_cuda,
)
from builder.environment.torch_for_cuda.wheel_metadata import list_wheels, read_metadata

PLATFORMS = platform_tags("2.36", "x86_64")


def _resolve(cuda: str, *lines: tuple[str, str], **options):
    logged: list[str] = []
    spec = merge_specs(*(requirements_spec([line], source) for line, source in lines))
    resolution = resolve_cuda_packages(spec, resolve(cuda, slim=True), python_version="3.11",
                                       platforms=PLATFORMS, on_log=logged.append, **options)
    return resolution, logged


def _metadata(version: str) -> str:
    wheel = next(w for w in list_wheels(PYPI_SIMPLE, "onnxruntime-gpu")
                 if str(w.version) == version and "cp311" in w.filename)
    return read_metadata(wheel)[0]


@pytest.mark.parametrize(("cuda", "major"), [("12.6", 12), ("12.0", 12), ("13.0", 13)])
def test_the_newest_onnxruntime_gpu_whose_cuda_runtime_admits_the_cuda_is_chosen(cuda, major):
    resolution, logged = _resolve(cuda, ("onnxruntime-gpu", ONNX_OPERATOR_SOURCE),
                                  ("numpy==1.26.4", "pipe.pickle"))
    (choice,) = resolution.choices
    requirement = Requirement(choice.requirement)
    assert requirement.name == "onnxruntime-gpu" and requirement.extras == {"cuda", "cudnn"}
    (version,) = [s.version for s in requirement.specifier]
    declared, evidence = declared_cuda(_metadata(version), "3.11")  # read again here
    assert serves_cuda(declared, cuda) and int(declared.split(".")[0]) == major
    assert f"cu{major}~={major}.0" in evidence or f"runtime~={major}.0" in evidence
    newer = sorted({w.version for w in list_wheels(PYPI_SIMPLE, "onnxruntime-gpu")
                    if w.version > Version(version) and not w.version.is_prerelease
                    and "cp311" in w.filename})
    for later in newer[:2]:  # the next newer versions serve another CUDA major
        assert not serves_cuda(declared_cuda(_metadata(str(later)), "3.11")[0], cuda)
    assert f"cuda-toolkit[cublas,cudart,cufft,curand,nvjitlink,nvrtc]=={cuda}.*" in (
        resolution.spec.requirements)
    assert "numpy==1.26.4" in resolution.spec.requirements
    assert any(choice.wheel in line for line in logged)
    (cudnn,) = [line for line in resolution.spec.requirements if line.startswith("nvidia-cudnn")]
    torch_wheel = next(line for line in logged if line.startswith(cudnn)).split("(")[1]
    torch_metadata = read_metadata(next(  # the torch build it names pins that very cuDNN
        w for w in list_wheels(PYPI_SIMPLE, "torch") if w.filename == torch_wheel.split(")")[0]))
    assert f"Requires-Dist: {cudnn}" in torch_metadata[0].replace("; platform", "")


def test_a_cpu_onnxruntime_gives_way_to_the_gpu_build_that_installs_the_same_package():
    resolution, logged = _resolve("12.6", ("onnxruntime-gpu", ONNX_OPERATOR_SOURCE),
                                  ("onnxruntime==1.31.1", "the CPU base's onnxruntime backend"))
    assert not any(Requirement(line).name == "onnxruntime"
                   for line in resolution.spec.requirements)
    assert any("onnxruntime==1.31.1 dropped" in line for line in logged)


def test_with_torch_its_own_cuda_pins_decide_the_libraries():
    """torch 2.13 (PyPI: CUDA 13.0) pins its CUDA through cuda-toolkit itself; no second pin."""
    resolution, _ = _resolve("13.0", ("onnxruntime-gpu", ONNX_OPERATOR_SOURCE),
                             ("torch==2.13.0", PYTHON_MODEL_SOURCE), pytorch_index=None)
    assert {choice.package for choice in resolution.choices} == {"torch", "onnxruntime-gpu"}
    assert not any(line.startswith("cuda-toolkit") for line in resolution.spec.requirements)


def test_an_onnxruntime_gpu_pin_no_build_of_which_serves_the_cuda_is_refused_naming_the_way_out():
    with pytest.raises(SpecError) as refused:
        _resolve("12.6", ("onnxruntime-gpu==1.31.1", "envs/my-env.txt"))
    message = str(refused.value)
    assert "no onnxruntime-gpu on https://pypi.org/simple for Python 3.11 is built for CUDA " \
           "12.6" in message and "1.31.1: CUDA 13.0" in message
    assert "cuda='12.6' without slim" in message


def test_a_python_format_operators_torch_without_a_build_for_the_cuda_is_refused():
    """torch 2.13.0 on PyPI is a CUDA 13 build; PyTorch's index is unreachable from CI."""
    with pytest.raises(SpecError) as refused:
        _resolve("12.6", ("torch==2.13.0", PYTHON_MODEL_SOURCE), pytorch_index=None)
    message = str(refused.value)
    assert "2.13.0: CUDA 13.0" in message and "CUDA 12.6 (slim)" in message
    assert "make the operators export to ONNX or TorchScript" in message


@pytest.mark.parametrize(("line", "expected"), [
    ('Requires-Dist: nvidia-cuda-runtime-cu12~=12.0; extra == "cuda"', "12.0"),
    ('Requires-Dist: nvidia-cuda-runtime~=13.0; extra == "cuda"', "13.0"),
    ("Requires-Dist: nvidia-cuda-runtime-cu12==12.4.127; platform_system == 'Linux'", "12.4"),
    ("Requires-Dist: numpy>=1.21.6", None),
])
def test_the_declared_cuda_runtime_is_read_with_the_cuda_extra(line, expected):
    assert declared_cuda(f"Name: x\nVersion: 1\n{line}\n", "3.11")[0] == expected
