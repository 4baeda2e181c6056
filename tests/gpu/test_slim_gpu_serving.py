"""The GPU tier for the slim GPU route: what its images ship, served on a GPU, no Docker.

The slim image's server is the nvidia-pytriton wheel's Triton 2.51 (a host process here, as in
``test_gpu_serving.py``) and its environment is made the way a slim build makes it — onnxruntime-gpu
chosen for the CUDA, NVIDIA's CUDA wheels pinned to it — for this host's Python, unpacked and
attached to the ONNX operator and the pipeline model. The CUDA is the one this machine's torch is
built for (the GPU tier's torch, which the driver runs). Checked: the ONNX operator, ``KIND_GPU``,
loads — the backend refuses one whose session did not get ONNX Runtime's CUDA execution provider
— and its stub holds a CUDA context (``nvidia-smi``); its answers and the pipeline's over BLS equal
the in-process pipeline's; placement read as a build's verification reads it. The python-format
torch operator on the GPU is ``test_gpu_serving.py``'s.

Needs the package index (or ``PIP_FIND_LINKS`` holding onnxruntime-gpu and the CUDA wheels) to
make the environment; skipped, saying why, where neither answers.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from builder.verify.placement import (
    INSTANCE_EVIDENCE,
    METRICS_EVIDENCE,
    check_ran_on_gpus,
    gpu_models,
)
from tests.support.example_inputs import TEXTS
from tests.support.gpu_serving import OPERATOR, Served, pipeline_answers


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import torch

    from builder.base.releases import resolve, slim_cuda_versions
    from builder.environment.attach import attach_environment
    from builder.environment.errors import SpecError
    from builder.environment.prepare import EnvironmentOptions, environment_backends
    from builder.environment.prepare import environment_spec as spec_of
    from builder.environment.tarball import pack_environment
    from builder.environment.target import host_target
    from builder.environment.torch_for_cuda import resolve_cuda_packages
    from builder.repository.writer import build_pipeline_model
    from builder.tritonserver.host_process import TritonServer
    from pipelines.text_embedding import pipeline

    cuda = ".".join((torch.version.cuda or "").split(".")[:2])
    if cuda not in slim_cuda_versions():
        pytest.skip(f"this machine's torch is built for CUDA {cuda or 'none'}, which the slim "
                    f"route does not serve ({', '.join(slim_cuda_versions())})")
    release = resolve(cuda, slim=True)
    root = tmp_path_factory.mktemp("slim-gpu") / "models"
    built = build_pipeline_model(pipeline, root, format_priority=("onnx",), target=release)
    target = host_target()
    try:
        resolution = resolve_cuda_packages(
            spec_of(built, release, target.python_version, [n.op for n in pipeline.nodes],
                    EnvironmentOptions()),
            release, python_version=target.python_version, platforms=target.platform_tags())
    except SpecError as error:
        pytest.skip(f"onnxruntime-gpu for CUDA {cuda} cannot be chosen here: {error}")
    tarball = pack_environment(resolution.spec, target, index=resolution.index,
                               compress=False, cache=tmp_path_factory.mktemp("environments"))
    attach_environment(root, tarball, backends=environment_backends(release), unpacked=True)
    with TritonServer(root) as server:
        yield Served(server, root, "gpu")


def test_the_onnx_operator_loads_on_the_gpu_with_the_cuda_provider_and_answers_as_in_process(
        served):
    """It loaded: the backend refuses a KIND_GPU session without the CUDA provider."""
    assert gpu_models(served.repository) == [OPERATOR]
    pipeline_answers(served)


def test_placement_verification_finds_the_onnx_operator_on_a_gpu(served):
    pipeline_answers(served, concurrency=2)
    verdict = check_ran_on_gpus(served.endpoint, [OPERATOR])
    assert verdict.evidence[OPERATOR] in (METRICS_EVIDENCE, INSTANCE_EVIDENCE), verdict


def test_the_onnx_operators_stub_holds_a_cuda_context(served):
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not on PATH: the driver cannot be asked")
    pipeline_answers(served, concurrency=1)
    listed = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                            capture_output=True, text=True, check=True).stdout.split()
    commands = {pid: _command(pid) for pid in listed}
    assert any(f"/{OPERATOR}/" in command for command in commands.values()), (
        commands, TEXTS[:1])


def _command(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "(not in this pid namespace)"
