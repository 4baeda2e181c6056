"""Bad input answered as the client's mistake, by a built image, over gRPC and HTTP.

One image serves a pipeline that decodes images with Pillow (``@rejects`` its
``UnidentifiedImageError``) beside a text column, with a 256 KiB request limit. Each bad request
gets its answer — ``INVALID_ARGUMENT`` / 400 for bytes that are not an image and for a request
over the limit, the limit at run from the environment — and a good request after each is served
as in process. Two answers are Triton's own and documented as such (README, "Errors"): a request
larger than the container's ``/dev/shm`` fails inside the python backend before the pipeline
sees it, and a body that is not JSON is answered 500 by Triton's HTTP frontend.
"""

from __future__ import annotations

import io
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from builder import InputError, build_docker_image, pipe, rejects, requires
from builder.client.errors import RemoteInputError
from builder.client.pipeline import Client
from builder.runtime.request_size import MAX_REQUEST_ENV
from builder.verify.container import ServingContainer
from builder.verify.equality import check_same
from pipelines.image_classification import example_image
from tests.support.engine_images import remove_images_made

PIL = pytest.importorskip("PIL")
from PIL import Image, UnidentifiedImageError  # noqa: E402 - after the skip

pytestmark = [pytest.mark.slow, pytest.mark.alongside]

REFERENCE = "triton-builder-test/bad-input:1"
LIMIT = 256 * 1024
BAD = {"grpc": "StatusCode.INVALID_ARGUMENT", "http": "400"}
FAULT = {"grpc": "StatusCode.INTERNAL", "http": "500"}


@requires(f"pillow=={PIL.__version__}")
@rejects(UnidentifiedImageError)
def decode(image: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(image)) as opened:
        return np.asarray(opened.convert("RGB"))


def mean_colour(rgb: np.ndarray) -> np.ndarray:
    return rgb.reshape(-1, 3).mean(axis=0).astype(np.float32)


def note_length(note: str) -> int:
    return len(note)


PIPELINE = (pipe.input("image", "note")
            .map("image", "rgb", decode)
            .map("rgb", "colour", mean_colour)
            .map("note", "length", note_length)
            .output("colour", "length")
            .with_example(example_image(0), "hello"))


@pytest.fixture(scope="module")
def image(docker_client, cpu_base_image):
    before = {each["Id"] for each in docker_client.api.images(all=True)}
    build_docker_image(PIPELINE, REFERENCE, max_request_bytes=LIMIT, client=docker_client)
    yield REFERENCE
    remove_images_made(docker_client, before, [REFERENCE])


def _request(module, image_bytes: bytes, note: bytes) -> list:
    tensors = []
    for name, value in (("image", image_bytes), ("note", note)):
        tensor = module.InferInput(name, [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[value]], dtype=object))
        tensors.append(tensor)
    return tensors


def _refused(client, module, image_bytes: bytes, note: bytes):
    with pytest.raises(Exception) as refused:
        client.infer("pipeline", _request(module, image_bytes, note))
    return refused.value


def _serves(url: str, seed: int) -> None:
    """A good request after a bad one: answered, and as in process."""
    call = (example_image(seed), f"note {seed}")
    with Client(url) as client:
        check_same(client(*call), PIPELINE(*call), where=f"good request {seed}")


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_bad_input_is_answered_as_the_clients_mistake(image, docker_client, scheme):
    module = grpcclient if scheme == "grpc" else httpclient
    good = example_image(1)
    with ServingContainer(docker_client, image) as endpoint:
        address = endpoint.grpc_url if scheme == "grpc" else endpoint.http_url
        url = f"{scheme}://{address}/pipeline"
        with module.InferenceServerClient(address) as client:
            not_an_image = _refused(client, module, b"GIF89a" + bytes(100), b"x")
            assert not_an_image.status() == BAD[scheme], not_an_image
            message = not_an_image.message()
            assert ("operator 'decode' (map image -> rgb) rejected its input 'image': cannot "
                    "identify image file <_io.BytesIO> (UnidentifiedImageError)") in message
            assert "0x" not in message
            _serves(url, 2)

            at_limit = b"n" * (LIMIT - len(good) - 8)  # each element has a 4-byte length
            answer = client.infer("pipeline", _request(module, good, at_limit))
            assert answer.as_numpy("length").reshape(-1).tolist() == [len(at_limit)]
            over = _refused(client, module, good, at_limit + b"n")
            assert over.status() == BAD[scheme], over
            assert (f"the request's inputs are {LIMIT + 1} bytes, over this pipeline's limit "
                    f"of {LIMIT} bytes") in over.message()
            _serves(url, 3)

        with Client(url) as ours, pytest.raises(RemoteInputError) as raised:
            ours(b"not an image", "x")
        assert isinstance(raised.value, InputError)  # one except for bad input anywhere

        counted = _metric(endpoint.metrics_url, "triton_builder_operator_rejected",
                          "'decode' (map image -> rgb)", at_least=2)
        assert counted >= 2
        assert _metric(endpoint.metrics_url, "triton_builder_operator_failures",
                       "'decode' (map image -> rgb)") == 0


def _metric(address: str, name: str, operator: str, at_least: float = 0) -> float:
    """The value of ``name`` for ``operator`` on the metrics endpoint (sent once a second)."""
    deadline = time.monotonic() + 10
    value = 0.0
    while True:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
            text = response.read().decode()
        value = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line.startswith(name + "{") and f'operator="{operator}"' in line)
        if value >= at_least or time.monotonic() > deadline:
            return value
        time.sleep(0.3)


def test_the_limit_is_set_at_run_and_a_large_request_within_dev_shm_is_refused(
        image, docker_client):
    """``docker run -e TRITON_BUILDER_MAX_REQUEST_BYTES=…`` moves the limit both ways; a 100 MB
    request is refused naming it where ``/dev/shm`` can hold the request."""
    good = example_image(1)
    with ServingContainer(docker_client, image, shm_size="512m",
                          environment={MAX_REQUEST_ENV: str(2 * LIMIT)}) as endpoint, \
            grpcclient.InferenceServerClient(endpoint.grpc_url) as client:
        roomy = b"n" * (LIMIT + 1000)  # over the build's limit, within the run's
        answer = client.infer("pipeline", _request(grpcclient, good, roomy))
        assert answer.as_numpy("length").reshape(-1).tolist() == [len(roomy)]
        huge = _refused(client, grpcclient, good, b"n" * (100 * 1024 * 1024))
        assert huge.status() == BAD["grpc"], huge
        assert f"over this pipeline's limit of {2 * LIMIT} bytes" in huge.message()
        _serves(f"grpc://{endpoint.grpc_url}/pipeline", 4)


def test_triton_answers_of_its_own_are_documented_and_the_server_serves_on(image,
                                                                             docker_client):
    """Two answers the pipeline never sees, both Triton 2.51's (README, "Errors"): a request
    larger than the container's ``/dev/shm`` (64 MiB by default) fails inside the python
    backend, and a body that is not JSON gets HTTP 500 from its frontend
    (triton-inference-server/server#8762). If a release changes either, this test says so."""
    good = example_image(1)
    with ServingContainer(docker_client, image) as endpoint:
        with grpcclient.InferenceServerClient(endpoint.grpc_url) as client:
            huge = _refused(client, grpcclient, good, b"n" * (100 * 1024 * 1024))
        assert huge.status() == FAULT["grpc"], huge
        assert "Failed to increase the shared memory pool size" in huge.message()
        _serves(f"grpc://{endpoint.grpc_url}/pipeline", 5)

        request = urllib.request.Request(
            f"http://{endpoint.http_url}/v2/models/pipeline/infer", data=b"{not json",
            headers={"Content-Type": "application/json"}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as answered:
            urllib.request.urlopen(request, timeout=30)
        assert answered.value.code == 500
        assert "failed to parse the request JSON buffer" in answered.value.read().decode()
        _serves(f"http://{endpoint.http_url}/pipeline", 6)
