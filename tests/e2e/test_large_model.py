"""A model operator past protobuf's 2 GiB, end to end (issue 65, item 1): the issue's 2.46 GB
``big_encoder`` (an embedding table of 600,000 x 1,024 float32, mean-pooled, then a projection;
generated weights) exported to ONNX with its weights in ``model.onnx.data``, built into an image
on the CPU base (verification inside compares it with the pipeline under concurrent distinct
requests), served, and 96 distinct requests sent at once, each answer equal to ``pipe(...)``.

Alone (unmarked, in ``tests/e2e``): the build holds the module and its ONNX Runtime check
(7.7 GB of peak RSS measured), the served image the model twice (the pipeline model's own
session and the model operator's).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from builder import ModelOp, build_docker_image, pipe
from builder.verify.concurrent import concurrent_check
from builder.verify.container import ServingContainer
from builder.verify.equality import TOLERANCE
from tests.support.large_models import ROWS, WIDTH, EmbeddingEncoder

pytestmark = [pytest.mark.slow]
IMAGE = "triton-builder-test/large-model:1"
REQUESTS = 96
TOKENS = 8


def _ids(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, ROWS, TOKENS, dtype=np.int64)


@pytest.fixture(scope="module")
def large_pipeline():
    torch.manual_seed(0)
    with torch.no_grad():
        encoder = ModelOp(EmbeddingEncoder().eval(), torch.from_numpy(_ids(0)),
                          name="big_encoder", input_names=["ids"])
    return (pipe.input("ids").map("ids", "embedding", encoder).output("embedding")
            .with_example(_ids(1)))


def test_an_image_with_a_model_past_two_gib_serves_96_distinct_requests_as_in_process(
        large_pipeline, docker_client, cpu_base_image):
    try:
        built = build_docker_image(large_pipeline, IMAGE,
                                   verify_calls=[(_ids(2),), (_ids(3),)], client=docker_client)
        print(f"the build's peak RSS: {built.peak_memory_bytes / 1e9:.2f} GB")
        assert built.peak_memory_bytes >= ROWS * WIDTH * 4, "the report holds the weights' peak"
        assert built.verification is not None
        listing = docker_client.containers.run(
            IMAGE, ["ls", "-l", "/models/big_encoder/1"], entrypoint=[], remove=True).decode()
        assert "model.onnx.data" in listing, listing
        calls = [_ids(100 + k) for k in range(REQUESTS)]
        expected = [large_pipeline(call) for call in calls]
        with ServingContainer(docker_client, IMAGE) as endpoint:
            concurrent_check("pipeline", [((c,), e) for c, e in zip(calls, expected, strict=True)],
                             TOLERANCE, timeout=120)(endpoint)
        assert len({row.tobytes() for row in (np.asarray(e) for e in expected)}) == REQUESTS
    finally:
        try:
            docker_client.images.remove(IMAGE, force=True)
        except Exception:  # noqa: BLE001 - the build may have failed before tagging
            pass
