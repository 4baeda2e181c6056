"""The GPU tier's checks with the model operator on the CPU: everything but the GPU itself.

The same repository, server and checks as ``tests/gpu/test_gpu_serving.py`` (shared in
:mod:`tests.support.gpu_serving`), with ``op_config={"device": "cpu"}``: the python-format torch
operator, the pipeline model's BLS calls and placement verification against a real server's
metrics run on every machine, CI's included; only the GPU is left to the ``gpu`` tier. Here the
placement check must refuse: the operator answered, but nothing shows it ran on a GPU.
"""

from __future__ import annotations

import pytest

from builder.verify.placement import GpuPlacementError, check_ran_on_gpus, gpu_models
from tests.support.example_inputs import TEXTS
from tests.support.gpu_serving import (
    OPERATOR,
    Served,
    operator_answers,
    pipeline_answers,
    served_text_embedding,
    warmed_before_ready,
)

pytestmark = [pytest.mark.slow, pytest.mark.tritonserver, pytest.mark.alongside]


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Served:
    with served_text_embedding(tmp_path_factory.mktemp("cpu") / "models", "cpu") as running:
        yield running


def test_the_torch_operator_on_kind_cpu_answers_as_in_process(served):
    operator_answers(served, TEXTS[:16])


def test_the_pipeline_gets_the_operators_outputs_over_bls_and_answers_as_in_process(served):
    pipeline_answers(served)


def test_placement_verification_refuses_an_operator_that_ran_on_the_cpu(served):
    """Told the operator is a GPU model, the check reads the server's real statistics, metrics
    (no ``gpu_uuid``) and loaded config (``KIND_CPU``), and refuses."""
    operator_answers(served, TEXTS[:4])
    assert gpu_models(served.repository) == []
    with pytest.raises(GpuPlacementError, match=f"{OPERATOR} ran .* none on a GPU"):
        check_ran_on_gpus(served.endpoint, [OPERATOR])


def test_the_operator_is_warmed_on_its_cpu_instance_before_ready(tmp_path):
    """Issue 66 with the operator on the CPU: Triton ran its ``model_warmup`` through its
    ``KIND_CPU`` instance before ready, and its first request after ready is answered as in
    process; the first's latency against the median of the next 20 is printed (a
    figure, not a bound)."""
    with served_text_embedding(tmp_path / "models", "cpu", log_verbose=1) as served:
        warmed_before_ready(served)
