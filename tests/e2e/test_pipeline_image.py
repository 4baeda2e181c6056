"""``build_docker_image`` end to end on the real engine, registry and Triton.

For every example pipeline: build on the CPU base (verification inside compares the running
image with the in-process pipeline) → the container answers over gRPC and HTTP like ``pipe(...)``
→ push to the local registry → remove the local image → pull by digest → still answers. Then the
failure paths and a pipeline whose operator needs a package only the packed environment has.
"""

from __future__ import annotations

import sys
import textwrap

import docker.errors
import pytest
import tritonclient.grpc as grpcclient

from builder import build_docker_image
from builder.client.pipeline import Client
from builder.pipeline.dsl import pipe
from builder.runtime.warm_up import MAX_EXAMPLES
from builder.verify.container import ServingContainer
from builder.verify.equality import check_same
from builder.verify.verification import NothingToVerifyError, VerificationError
from tests.support.example_inputs import EXAMPLES
from tests.support.model_statistics import warm_up_rows

pytestmark = [pytest.mark.slow, pytest.mark.alongside]
CALLS = 4


@pytest.fixture(scope="module")
def client(docker_client, cpu_base_image):
    return docker_client


def _served_equals_in_process(endpoint, pipeline, calls) -> None:
    for scheme, address in (("grpc", endpoint.grpc_url), ("http", endpoint.http_url)):
        with Client(f"{scheme}://{address}/pipeline") as served:
            for call in calls:
                check_same(served(call), pipeline(call), where=f"{scheme} {call!r:.40}")


def _model_operators_ran_in_the_pipeline_model(endpoint, pipeline) -> None:
    """On the CPU base the pipeline model runs its ONNX models itself (onnxruntime from its
    environment): their Triton models, still loaded for clients (and warmed on their own
    examples: what their statistics count), got no BLS request."""
    with grpcclient.InferenceServerClient(endpoint.grpc_url) as triton:
        for op in pipeline.model_ops():
            (stats,) = triton.get_inference_statistics(op.name).model_stats
            warm_up = warm_up_rows(triton, op.name)
            assert warm_up > 0, f"{op.name} has no model_warmup"
            assert stats.inference_count == warm_up, f"{op.name} was reached through BLS"
            assert triton.is_model_ready(op.name)


def _warmed_up_before_ready(logs: str, pipeline) -> None:
    """Ready means warm (issue 66): by the time ``/v2/health/ready`` answered, the pipeline
    model had run its examples through every operator and model (in process on the CPU base:
    nothing left cold), and Triton had run each model operator's ``model_warmup``."""
    count = min(len(pipeline.examples), MAX_EXAMPLES)
    assert f"warmed up on {count} example(s)" in logs, logs[-3000:]
    assert "left cold" not in logs
    assert "failed to run warmup sample" not in logs


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_image_serves_pushes_and_pulls_by_digest(name, client, registry):
    pipeline, inputs = EXAMPLES[name]
    calls = inputs[:: max(1, len(inputs) // CALLS)][:CALLS]
    reference = f"{registry.host}/examples/{name.replace('_', '-')}:1"
    built = build_docker_image(pipeline, reference, verify_calls=[(c,) for c in calls[:2]],
                               push=True, client=client)
    assert built.verification is not None and "pipeline" in built.verification.models
    assert "--gpus" not in built.run_command, "a CPU image is run without GPUs"
    serving = ServingContainer(client, reference)
    with serving as endpoint:
        _warmed_up_before_ready(serving.logs(), pipeline)
        _served_equals_in_process(endpoint, pipeline, calls)
        _model_operators_ran_in_the_pipeline_model(endpoint, pipeline)

    digest = built.pushed[reference].digest
    client.images.remove(reference, force=True)
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(reference)
    pinned = f"{reference.rsplit(':', 1)[0]}@{digest}"
    client.images.pull(pinned)
    try:
        with ServingContainer(client, pinned) as endpoint:
            _served_equals_in_process(endpoint, pipeline, calls[:2])
    finally:
        client.images.remove(pinned, force=True)


def test_unchanged_pipeline_is_not_rebuilt(client):
    pipeline, inputs = EXAMPLES["text_embedding"]
    first = build_docker_image(pipeline, "triton-builder-test/unchanged:1", client=client)
    again = build_docker_image(pipeline, "triton-builder-test/unchanged:1", client=client)
    assert again.id == first.id and not again.built
    client.images.remove("triton-builder-test/unchanged:1", force=True)


def _shift_by_image(x: float) -> float:
    """Adds one inside the image only: served answers differ from in-process ones."""
    import os

    return x + (1.0 if os.path.exists("/opt/tritonserver") else 0.0)


def test_failing_verification_raises_with_the_difference_and_leaves_no_tag(client):
    pipeline = pipe.input("x").map("x", "y", _shift_by_image).output("y").with_example(2.0)
    with pytest.raises(VerificationError, match=r"served float 3\.0, in process float 2\.0"):
        build_docker_image(pipeline, "triton-builder-test/wrong:1", client=client)
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get("triton-builder-test/wrong:1")


def test_verification_needs_a_call():
    pipeline = (pipe.input("x", schema={"x": float}).map("x", "y", abs)
                .output("y", schema={"y": float}))
    with pytest.raises(NothingToVerifyError, match="verification needs at least one call"):
        build_docker_image(pipeline, "triton-builder-test/no-calls:1")


def test_operator_importing_a_package_only_the_packed_environment_has(client, tmp_path,
                                                                      monkeypatch):
    """tabulate is in no base image: the model loads only with the packed environment."""
    with pytest.raises(docker.errors.ContainerError):
        client.containers.run("triton-builder/tritonserver-cpu:2.51.0-py3.11",
                              ["python3", "-c", "import tabulate"], remove=True)
    source = tmp_path / "user_ops"
    source.mkdir()
    (source / "table_ops.py").write_text(textwrap.dedent('''
        import tabulate

        from builder import requires


        @requires("tabulate==0.9.0")
        def as_table(a: int, b: int) -> str:
            return tabulate.tabulate([[a, b], [b, a]], tablefmt="plain")
    '''))
    monkeypatch.syspath_prepend(str(source))
    import table_ops

    pipeline = (pipe.input("a", "b").map(("a", "b"), "table", table_ops.as_table)
                .output("table").with_example(1, 2))
    built = build_docker_image(pipeline, "triton-builder-test/tabulate:1", client=client)
    monkeypatch.delitem(sys.modules, "table_ops")
    with ServingContainer(client, built.tags[0]) as endpoint:
        with Client(f"grpc://{endpoint.grpc_url}/pipeline") as served:
            assert served(3, 40) == " 3  40\n40   3" == table_ops.as_table(3, 40)
    client.images.remove(built.tags[0], force=True)
