"""The example pipelines: in process, and served by a real ``tritonserver`` over gRPC.

Acceptance: for each example the served result equals ``pipe(...)`` in process (exact for
strings and ints, within 1e-4 for floats) on at least 20 varied inputs, one call per request,
several calls per request, and as concurrent requests that Triton batches dynamically.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builder import build_pipeline_model
from builder.repository.export import onnx_io
from builder.tritonserver.host_process import TritonServer
from builder.verify.equality import check_same as assert_same
from pipelines import image_classification, text_embedding, text_recognizer
from tests.support.example_inputs import EXAMPLES, TEXTS, images, text_lines
from tests.support.model_statistics import settled_statistics
from tests.support.pipeline_client import infer, infer_concurrently

pytestmark = pytest.mark.alongside


# -- in process -------------------------------------------------------------------------------
def test_text_embedding_gives_unit_vectors_that_depend_on_the_text():
    vectors = [text_embedding.pipeline(text) for text in TEXTS[:5]]
    for vector in vectors:
        assert vector.shape == (32,) and vector.dtype == np.float32
        assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5
    assert len({v.tobytes() for v in vectors}) == len(vectors)
    # the tokenizer lower-cases: same words, same vector
    np.testing.assert_array_equal(text_embedding.pipeline("THE QUICK BROWN FOX"),
                                  text_embedding.pipeline("the quick brown fox"))


def test_image_classification_gives_ranked_top_k():
    results = [image_classification.pipeline(image) for image in images()]
    for labels, scores in results:
        assert len(labels) == 3 and set(labels) <= set(image_classification.LABELS)
        assert scores.dtype == np.float32 and list(scores) == sorted(scores, reverse=True)
    assert len({tuple(labels) for labels, _ in results}) > 5


def test_top_k_of_a_batch_is_each_rows_own_softmax_ranking():
    rng = np.random.default_rng(3)
    rows = [rng.normal(0, 4, 10).astype(np.float32) for _ in range(12)]
    rows.append(np.array([2, 5, 5, 1, 5, 0, 0, 0, 0, 0], np.float32))  # ties keep label order
    top_k = image_classification.TopK(image_classification.LABELS, k=3)
    for (labels, scores), logits in zip(top_k.call_batch([(r,) for r in rows]), rows,
                                        strict=True):
        exp = np.exp(logits.astype(np.float64) - logits.max())
        probabilities = exp / exp.sum()
        order = sorted(range(10), key=lambda i: (-probabilities[i], i))[:3]
        assert labels == [image_classification.LABELS[i] for i in order]
        np.testing.assert_allclose(scores, probabilities[order].astype(np.float32), rtol=1e-6)
        assert top_k(logits)[0] == labels
    assert top_k.call_batch([(rows[-1],)])[0][0] == ["automobile", "bird", "deer"]


def test_text_recognizer_decodes_until_the_end_token():
    texts = [text_recognizer.pipeline(line) for line in text_lines()]
    assert all(set(text) <= set(text_recognizer.ALPHABET) for text in texts)
    assert all(len(text) <= text_recognizer.MAX_STEPS for text in texts)
    assert len(set(texts)) > 10 and len({len(t) for t in texts}) > 3


def test_example_signatures():
    described = {name: pipeline.signature().describe() for name, (pipeline, _) in
                 EXAMPLES.items()}
    assert described["text_embedding"] == (
        "inputs:\n  text: str\noutputs:\n  vec: ndarray TYPE_FP32 [32]")
    assert described["image_classification"] == (
        "inputs:\n  image: bytes\noutputs:\n  labels: list[str] [3]\n"
        "  scores: ndarray TYPE_FP32 [3]")
    assert described["text_recognizer"] == (
        "inputs:\n  image: ndarray TYPE_UINT8 [32, 96]\noutputs:\n  text: str")


# -- served -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def repositories(tmp_path_factory) -> list[Path]:
    """Each example built into its own repository (its pipeline model named after it).

    Image classification reaches its model through BLS, as on GPU releases; the others run
    their ONNX models in the pipeline model, the default on CPU targets.
    """
    roots = []
    for name, (pipeline, _) in EXAMPLES.items():
        root = tmp_path_factory.mktemp(name) / "models"
        build_pipeline_model(pipeline, root, name=name,
                             dynamic_batching={"max_queue_delay_microseconds": 20000},
                             in_process=name != "image_classification")
        roots.append(root)
    return roots


def test_example_configs_round_trip_and_match_their_onnx_models(repositories):
    models = {}
    for root in repositories:
        for path in root.glob("*/config.pbtxt"):
            text = path.read_text()
            config = text_format.Parse(text, mc.ModelConfig())
            assert text_format.MessageToString(config) == text
            models[config.name] = config
            for model_file in path.parent.glob("1/model.onnx"):
                inputs, outputs = onnx_io(onnx.load(str(model_file)))
                for declared, tensors in ((inputs, config.input), (outputs, config.output)):
                    # as the graph declares them, or tighter where it leaves an axis open (-1)
                    assert [(t.name, t.dtype, len(t.dims)) for t in declared] == [
                        (t.name, mc.DataType.Name(t.data_type), len(t.dims)) for t in tensors]
                    for graph, configured in zip(declared, tensors):
                        assert all(g in (-1, c) for g, c in zip(graph.dims, configured.dims)), (
                            graph, configured)
    assert sorted(models) == ["image_classification", "image_classifier", "recognizer_decoder",
                              "recognizer_encoder", "text_embedding", "text_encoder",
                              "text_recognizer"]
    decoder = models["recognizer_decoder"]
    assert [(t.name, list(t.dims)) for t in decoder.input] == [("tokens", [-1]),
                                                               ("memory", [24, 32])]
    assert [(t.name, list(t.dims)) for t in models["text_recognizer"].input] == [
        ("image", [32, 96])]


@pytest.fixture(scope="module")
def server(repositories):
    """All three examples served by one host-process server."""
    roots = repositories
    extra = tuple(f"--model-repository={root}" for root in roots[1:])
    with TritonServer(roots[0], extra_args=extra) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as connected:
        yield connected


def _expected(name):
    pipeline, inputs = EXAMPLES[name]
    return pipeline, inputs, [pipeline(value) for value in inputs]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_served_equals_in_process_one_call_per_request(name, client):
    pipeline, inputs, expected = _expected(name)
    assert len(inputs) >= 20
    signature = pipeline.signature()
    for value, reference in zip(inputs, expected, strict=True):
        (served,) = infer(client, name, signature, [(value,)])
        assert_same(served, reference, where=f"{name}({value!r:.40})")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_served_equals_in_process_several_calls_per_request(name, client):
    pipeline, inputs, expected = _expected(name)
    signature = pipeline.signature()
    for start in range(0, len(inputs), 5):
        calls = [(value,) for value in inputs[start:start + 5]]
        served = infer(client, name, signature, calls)
        assert_same(served, expected[start:start + 5], where=name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_served_equals_in_process_for_concurrent_requests_batched_dynamically(name, client):
    pipeline, inputs, expected = _expected(name)
    models = [op.name for op in pipeline.model_ops()]
    before = {model: _statistics(client, model) for model in [name, *models]}
    served = infer_concurrently(client, name, pipeline.signature(), [(v,) for v in inputs])
    assert_same(served, expected, where=name)
    after = _statistics(client, name, at_least=before[name]["inference_count"] + len(inputs))
    requests = after["inference_count"] - before[name]["inference_count"]
    executions = after["execution_count"] - before[name]["execution_count"]
    assert requests == len(inputs)
    assert executions < requests, "Triton did not batch the concurrent requests"
    parameters = client.get_model_config(name).config.parameters
    in_process = (json.loads(parameters["in_process_models"].string_value)
                  if "in_process_models" in parameters else {})
    assert set(in_process) == (set() if name == "image_classification" else set(models))
    for model in models:
        stats = _statistics(client, model)
        rows = stats["inference_count"] - before[model]["inference_count"]
        calls = stats["execution_count"] - before[model]["execution_count"]
        if model in in_process:  # the pipeline model ran it itself: no BLS request
            assert rows == 0, model
        else:  # one BLS call carried the rows of several requests
            assert calls < rows, f"{model}: BLS calls were not batched across requests"


def _statistics(client, model, at_least: int = 0) -> dict[str, int]:
    stats = settled_statistics(client, model, at_least)
    return {"inference_count": stats.inference_count, "execution_count": stats.execution_count}


@pytest.mark.slow
def test_the_pipeline_model_answers_plain_kserve_v2_http_json(server):
    text = "hello over HTTP"
    body = {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [text]}]}
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/text_embedding/infer",
        data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.loads(response.read())
    (output,) = answer["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("vec", "FP32", [1, 32])
    np.testing.assert_allclose(np.array(output["data"], np.float32),
                               text_embedding.pipeline(text), atol=1e-4)


@pytest.mark.slow
def test_bytes_that_are_not_an_image_are_refused_and_the_server_keeps_serving(client):
    """``decode_image`` declares its ``ImageError`` as bad input (``@rejects``): the client's
    mistake, ``INVALID_ARGUMENT``."""
    signature = image_classification.pipeline.signature()
    with pytest.raises(grpcclient.InferenceServerException,
                       match=r"operator 'decode_image' \(map image -> rgb\) rejected its input "
                             r"'image': not a PNG or binary PPM/PGM image \(ImageError\)") as bad:
        infer(client, "image_classification", signature, [(b"not an image",)])
    assert bad.value.status() == "StatusCode.INVALID_ARGUMENT"
    image = image_classification.example_image(3)
    (served,) = infer(client, "image_classification", signature, [(image,)])
    assert_same(served, image_classification.pipeline(image))


@pytest.mark.slow
def test_the_served_pipeline_reports_each_operators_time_and_rows(repositories):
    """Triton's metrics endpoint: one rows and one duration counter per operator."""
    from prometheus_client.parser import text_string_to_metric_families

    from builder.runtime.operator_metrics import OperatorMetrics

    pipeline, inputs = EXAMPLES["text_embedding"]
    signature = pipeline.signature()
    with TritonServer(repositories[0]) as own, \
            grpcclient.InferenceServerClient(own.grpc_url) as client:
        infer_concurrently(client, "text_embedding", signature, [(v,) for v in inputs])
        infer(client, "text_embedding", signature, [(inputs[0],), (inputs[1],)])
        time.sleep(1.5)  # sent once a second by the pipeline model
        with urllib.request.urlopen(f"http://127.0.0.1:{own.metrics_port}/metrics") as page:
            text = page.read().decode()
    counters: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")  # the parser's name for a counter
            if name in (OperatorMetrics.ROWS, OperatorMetrics.DURATION):
                assert (sample.labels["model"], sample.labels["version"]) == ("text_embedding",
                                                                              "1")
                counters[name, sample.labels["operator"]] = sample.value
    labels = [node.label for node in pipeline.plan.nodes]
    assert {label for _, label in counters} == set(labels)
    for label in labels:
        assert counters[OperatorMetrics.ROWS, label] == len(inputs) + 2, label
        assert counters[OperatorMetrics.DURATION, label] > 0, label
