"""End to end on the real parts: the CPU base image, an image FROM it, and a host-process server.

The same sample repository (a python model and an ONNX model exported from torch) is served by a
container built through the Docker SDK and by a host-process tritonserver; both must answer the
same, and correctly.
"""

from __future__ import annotations

import concurrent.futures
import os
import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from builder.base.cpu import build_cpu_base
from builder.engine.image_build import build_image
from builder.verify.container import ServingContainer
from tests.support.model_statistics import settled_statistics
from tests.support.sample_repository import (
    FEATURES,
    expected_linear,
    expected_scale,
    write_sample_repository,
)

pytestmark = [pytest.mark.slow, pytest.mark.alongside]

INPUTS = [np.random.default_rng(seed).standard_normal((1 + seed % 3, FEATURES)).astype(np.float32)
          for seed in range(6)]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return write_sample_repository(tmp_path_factory.mktemp("sample") / "models")


def _infer(url: str, model: str, input_name: str, output_name: str, x: np.ndarray) -> np.ndarray:
    with grpcclient.InferenceServerClient(url) as client:
        tensor = grpcclient.InferInput(input_name, list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer(model, [tensor]).as_numpy(output_name)


def _answers(url: str) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(_infer(url, "scale", "X", "Y", x), _infer(url, "linear", "INPUT", "OUTPUT", x))
            for x in INPUTS]


def _check(answers) -> None:
    for x, (scaled, linear) in zip(INPUTS, answers):
        np.testing.assert_array_equal(scaled, expected_scale(x))
        np.testing.assert_allclose(linear, expected_linear(x), atol=1e-5)


def test_host_process_server_answers(repository, triton_server):
    server = triton_server(repository)
    _check(_answers(server.grpc_url))


def test_host_process_server_needs_no_activated_environment(repository, triton_server,
                                                            monkeypatch):
    """Run from ``.venv/bin/python`` with the environment not on ``PATH``: the stub still finds
    this interpreter's packages (onnxruntime for the ONNX model)."""
    here = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", os.pathsep.join(
        d for d in os.environ.get("PATH", "").split(os.pathsep) if d and d != here))
    server = triton_server(repository)
    _check(_answers(server.grpc_url))


def test_onnx_requests_are_batched_by_triton(repository, triton_server):
    """Concurrent requests reach the onnxruntime backend as one execute (Triton's statistics)."""
    server = triton_server(repository)
    count = 16
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        results = list(pool.map(
            lambda x: _infer(server.grpc_url, "linear", "INPUT", "OUTPUT", x),
            [INPUTS[0]] * count))
    for result in results:
        np.testing.assert_allclose(result, expected_linear(INPUTS[0]), atol=1e-5)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        stats = settled_statistics(client, "linear", at_least=count * len(INPUTS[0]))
    assert stats.inference_count == count * len(INPUTS[0])
    assert stats.execution_count < count, "no two requests were batched into one execute"


def test_cpu_base_image_is_cached_by_content(docker_client, cpu_base_image, os_image):
    again = build_cpu_base(docker_client, os_image=os_image)
    assert not again.built
    assert again.tags[0] == cpu_base_image


def test_image_from_cpu_base_serves_the_same_answers(docker_client, cpu_base_image, repository,
                                                     triton_server, tmp_path):
    context = tmp_path / "context"
    context.mkdir()
    import shutil

    shutil.copytree(repository, context / "models")
    (context / "Dockerfile").write_text(
        f"FROM {cpu_base_image}\nCOPY models/ /models/\n"
        'CMD ["tritonserver", "--model-repository=/models"]\n'
    )
    image = build_image(docker_client, context, ["triton-builder-test/sample:latest"])
    try:
        with ServingContainer(docker_client, image.id) as endpoint:
            served = _answers(endpoint.grpc_url)
    finally:
        docker_client.images.remove(image.id, force=True)
    _check(served)
    host = _answers(triton_server(repository).grpc_url)
    for (a_scaled, a_linear), (b_scaled, b_linear) in zip(served, host):
        np.testing.assert_array_equal(a_scaled, b_scaled)
        np.testing.assert_array_equal(a_linear, b_linear)
