"""The GPU tier: what only a GPU shows, on a GPU machine without Docker or network.

Run with ``nox -s gpu`` (or ``pytest tests/gpu``) on a machine with an NVIDIA GPU and a CUDA
build of torch; everywhere else each test is skipped, saying why (``tests/conftest.py`` marks
every test here ``gpu``). The server is Triton 2.51 from the nvidia-pytriton wheel, a host
process; the repository is the one the builder writes for the text-embedding example with its
model operator in the ``python`` format on a ``KIND_GPU`` instance (see
:mod:`tests.support.gpu_serving`). The same checks run on the CPU in
``tests/e2e/test_gpu_tier_on_cpu.py``, so a failure here is the GPU's part.
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
from tests.support.gpu_serving import (
    OPERATOR,
    Served,
    operator_answers,
    pipeline_answers,
    served_text_embedding,
    warmed_before_ready,
)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Served:
    with served_text_embedding(tmp_path_factory.mktemp("gpu") / "models", "gpu") as running:
        yield running


def test_the_torch_operator_on_kind_gpu_answers_as_in_process(served):
    operator_answers(served, TEXTS[:16])


def test_the_pipeline_gets_the_gpu_models_outputs_over_bls_and_answers_as_in_process(served):
    pipeline_answers(served)


def test_placement_verification_finds_the_operator_on_a_gpu_in_the_servers_own_metrics(served):
    """Read as a build's verification reads it: model statistics, ``nv_inference_count`` (with
    ``gpu_uuid`` where Triton's GPU metrics started), the loaded config's instance groups."""
    operator_answers(served, TEXTS[:4])  # placement is read after answers, as in verification
    assert gpu_models(served.repository) == [OPERATOR]
    verdict = check_ran_on_gpus(served.endpoint, [OPERATOR])
    assert verdict.evidence[OPERATOR] in (METRICS_EVIDENCE, INSTANCE_EVIDENCE), verdict
    print(f"placement: {verdict.detail} (evidence: {verdict.evidence[OPERATOR]})")


def test_the_operators_stub_holds_a_cuda_context(served):
    """The driver's own account: the stub serving the operator is a compute process on a GPU
    (``nvidia-smi`` lists it), so the module and its batches really moved to the device."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not on PATH: the driver cannot be asked")
    operator_answers(served, TEXTS[:4])
    listed = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                            capture_output=True, text=True, check=True).stdout.split()
    commands = {pid: _command(pid) for pid in listed}
    assert any(f"/{OPERATOR}/" in command for command in commands.values()), commands


def _command(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "(not in this pid namespace)"


def test_the_operator_is_warmed_on_its_gpu_before_ready(tmp_path):
    """Issue 66 on a GPU: Triton ran the operator's ``model_warmup`` through its ``KIND_GPU``
    instance before ready, and its first request after ready is answered as in process; the
    first's latency against the median of the next 20 is printed (a figure, not a bound)."""
    with served_text_embedding(tmp_path / "models", "gpu", log_verbose=1) as served:
        warmed_before_ready(served)
