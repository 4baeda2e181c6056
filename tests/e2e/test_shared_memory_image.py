"""A multi-model image started as plain ``docker run IMAGE``: Docker's default 64 MB ``/dev/shm``.

Every python model instance is a stub process with its own shared-memory region in
``/dev/shm``. python_backend r22.12 reserves 64 MB per stub by default, all of Docker's default,
so without the image's own ``--backend-config=python,shm-default-byte-size=…`` a second python
model or instance fails to load on 22.12. The image command sets it
(:data:`builder.image.serving_dockerfile.PYTHON_BACKEND_SHM`).

This runs on the CPU base (Triton 2.51, python_backend r24.10, whose own default is 1 MB, so the
image would load here without the setting as well; no 22.12 server exists on this machine): it
shows that a real Triton accepts the options, that every stub's region is the size the command
asks for (4 MiB, the smallest r22.12 accepts), and that six stubs (the pipeline model with
parallelism 2, two model operators with two instances each) load and answer within Docker's
default ``/dev/shm``. The build options leave the environment that of the example's own image
test (shared through the environment cache). With the real r22.12 backend (built from
../shared/triton-sources, loaded into this Triton in a container with Docker's default
/dev/shm), two python models of two instances each failed to load without the setting ("Unable
to initialize shared memory key ... (67108864 bytes) ... No space left on device") and loaded
with it (four 4 MiB regions); that run is not part of this test (it needs the r22.12 backend
build).
"""

from __future__ import annotations

import re

import docker.errors
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import triton_to_np_dtype

from builder import build_docker_image
from builder.client.pipeline import Client
from builder.image.serving_dockerfile import PYTHON_BACKEND_SHM
from builder.runtime.supervisor import ADMIN_KEY_VARIABLE, GATE_MODEL, GRPC_ADMIN_KEY_HEADER
from builder.verify.container import ServingContainer
from builder.verify.equality import check_same
from tests.support.example_inputs import EXAMPLES
from tests.support.model_statistics import settled_statistics

pytestmark = [pytest.mark.slow, pytest.mark.alongside]

REGION = re.compile(r"triton_\w+_backend_shm_region_[0-9a-f-]+")
"""python_backend's default ``shm-region-prefix-name`` (``triton_python_backend_shm_region_``,
src/python_be.cc r22.12–r25.11), with the backend's name for a Python-based backend (the CPU
base's onnxruntime: ``triton_onnxruntime_backend_shm_region_``, seen here), then a UUID."""


def _shm_files(container) -> dict[str, int]:
    result = container.exec_run(["sh", "-c", "stat -c '%s %n' /dev/shm/*; df -k /dev/shm"])
    assert result.exit_code == 0, result.output.decode()
    lines = result.output.decode().splitlines()
    files = {}
    for line in lines:
        size, _, path = line.partition(" ")
        if size.isdigit() and path.startswith("/dev/shm/"):
            files[path.removeprefix("/dev/shm/")] = int(size)
    total_kb = int(lines[-1].split()[1])
    assert total_kb == 64 * 1024, f"not Docker's default /dev/shm: {lines[-1]}"
    return files


def _call_with_zeros(triton: grpcclient.InferenceServerClient, model: str) -> None:
    """One request of one row of zeros to ``model`` (its variable dimensions as 1)."""
    metadata = triton.get_model_metadata(model, as_json=True)
    inputs = []
    for tensor in metadata["inputs"]:
        shape = [max(int(dim), 1) for dim in tensor["shape"]]
        array = np.zeros(shape, dtype=triton_to_np_dtype(tensor["datatype"]))
        inputs.append(grpcclient.InferInput(tensor["name"], shape, tensor["datatype"]))
        inputs[-1].set_data_from_numpy(array)
    result = triton.infer(model, inputs)
    for tensor in metadata["outputs"]:
        assert result.as_numpy(tensor["name"]) is not None, (model, tensor["name"])


def test_a_multi_model_image_loads_and_answers_without_shm_size(docker_client, cpu_base_image):
    pipeline, inputs = EXAMPLES["text_recognizer"]
    calls = inputs[:3]
    reference = "triton-builder-test/gpu-rows-shm:1"
    built = build_docker_image(pipeline, reference, client=docker_client, parallelism=2,
                               op_defaults={"instance_count": 2},
                               verify_calls=[(c,) for c in calls[:1]])
    key = "shared-memory-test-" + "k" * 16  # the repository index is the operator's
    container = ServingContainer(docker_client, reference, gpus=False, shm_size=None,
                                 environment={ADMIN_KEY_VARIABLE: key})
    try:
        with container as endpoint:
            with grpcclient.InferenceServerClient(endpoint.grpc_url) as triton:
                index = [model for model in triton.get_model_repository_index(
                    as_json=True, headers={GRPC_ADMIN_KEY_HEADER: key})["models"]
                         if model["name"] != GATE_MODEL]  # the ready gate, unloaded
                names = sorted(model["name"] for model in index)
                assert len(names) == 3 and all(model.get("state") == "READY" for model in index)
                with Client(f"grpc://{endpoint.grpc_url}/pipeline") as served:
                    for call in calls:
                        check_same(served(call), pipeline(call), where=f"{call!r:.40}")
                for name in names:  # every model answers (the operators: called directly)
                    if name != "pipeline":
                        _call_with_zeros(triton, name)
                    stats = settled_statistics(triton, name, at_least=1)
                    assert stats.inference_count > 0, f"{name} served nothing"
            regions = {name: size for name, size in _shm_files(container.container).items()
                       if REGION.fullmatch(name)}
        assert len(regions) >= 6, regions  # one per stub: 2 pipeline + 2 x 2 operator instances
        default = PYTHON_BACKEND_SHM["shm-default-byte-size"]
        growth = PYTHON_BACKEND_SHM["shm-growth-byte-size"]
        for name, size in regions.items():
            assert size >= default and (size - default) % growth == 0, (name, size)
        assert min(regions.values()) == default
        assert sum(regions.values()) < 64 * 1024 * 1024
    finally:
        for tag in built.tags:
            try:
                docker_client.images.remove(tag, force=True)
            except docker.errors.ImageNotFound:
                pass
