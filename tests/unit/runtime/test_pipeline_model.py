"""The served pipeline model's runtime, run without Triton against a stand-in ``pb_utils``.

The repository is really built, and BLS requests really run its exported ONNX models (through
onnxruntime); only Triton's plumbing is the stand-in of :mod:`tests.support.pb_utils_standin`, which
plays the python backend API of r22.12, r23.05 and r24.10 in turn (``generation``).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time

import numpy as np
import onnxruntime as ort
import pytest
import torch
from google.protobuf import json_format

from builder import InputError, build_pipeline_model, pipe, rejects
from builder.repository.model_config import read_config
from builder.runtime import (
    model_batching,
    model_calls,
    pipeline_model,
    request_size,
    torch_model,
    warm_up,
)
from builder.runtime.operator_metrics import OperatorMetrics
from builder.runtime.pipeline_model import PipelineLoadError
from tests.support import pb_utils_standin as pb
from tests.support.tiny_models import affine_op


def _refuse_13(v):
    if v[0] == 13:
        raise ValueError("13 is unlucky")
    return v


def _label(y):
    return "pos" if float(y.sum()) > 0 else "neg"


def _make_pipeline(op_config=None):
    op = affine_op(op_config=op_config or {})
    return (pipe.input("v")
            .map("v", "checked", _refuse_13)
            .map("checked", "y", op)
            .map("y", "label", _label)
            .flat_map("v", "part", lambda v: [float(x) for x in v if x > 0])
            .output("y", "label", "part")
            .with_example([1.0, 2.0, 3.0, 4.0]))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A repository whose pipeline model reaches its model operator through BLS."""
    root = tmp_path_factory.mktemp("runtime") / "models"
    pipeline = _make_pipeline({"max_batch_size": 3})
    build_pipeline_model(pipeline, root, in_process=False)
    return pipeline, root


GENERATIONS = list(pb.GENERATIONS)
WITH_METRICS = ["r23.05", "r24.10"]  # MetricFamily and PreferredMemory: r23.05 on


@pytest.fixture(params=GENERATIONS)
def generation(request):
    """The ``triton_python_backend_utils`` of one python backend release (a stand-in)."""
    return pb.generation(request.param)


@pytest.fixture
def initialized(monkeypatch, generation):
    """Initialises pipeline models as Triton would, on ``generation``'s API; finalises them
    after the test, which stops their metrics threads."""
    monkeypatch.setattr(pipeline_model, "pb_utils", generation)
    made = []

    def initialize(model_dir, warm_up=True):
        model = pipeline_model.TritonPythonModel()
        model.initialize(_args(model_dir))
        made.append(model)
        if warm_up:  # as Triton does before the model is ready
            pb.run_warm_up(model, model_dir, read_config(model_dir))
        return model

    yield initialize
    for model in made:
        model.finalize()


@pytest.fixture
def served(built, initialized):
    """The pipeline model initialised as Triton would, BLS wired to the exported ONNX model."""
    pipeline, root = built
    _wire_bls(root)
    return pipeline, initialized(root / "pipeline")


def _wire_bls(root) -> None:
    """BLS requests to ``affine`` reach its exported ONNX model, run by onnxruntime."""
    pb.Models.reset()
    session = ort.InferenceSession(str(root / "affine" / "1" / "model.onnx"))
    pb.Models.registry["affine"] = lambda inputs: dict(
        zip(["output_0"], session.run(["output_0"], inputs), strict=True))


def _args(model_dir) -> dict:
    """What Triton passes ``initialize``: paths, the config as JSON, the instance kind."""
    config = read_config(model_dir)
    return {
        "model_name": model_dir.name, "model_repository": str(model_dir), "model_version": "1",
        "model_config": json.dumps(json_format.MessageToDict(  # field names as Triton's
            config, preserving_proto_field_name=True)),
        "model_instance_kind": "CPU", "model_instance_device_id": "0",
    }


def _request(*vectors) -> pb.Request:
    return pb.Request({"v": np.array(vectors, dtype=np.float64)})


def _outputs(response) -> dict[str, np.ndarray]:
    assert not response.has_error(), response.error().message()
    return {t.name(): t.as_numpy() for t in response.output_tensors}


def _assert_matches(pipeline, vectors, outputs):
    for i, vector in enumerate(vectors):
        y, label, part = pipeline(vector)
        np.testing.assert_allclose(outputs["y"][i], y, atol=1e-5)
        assert outputs["label"][i, 0] == label.encode()
        assert outputs["part"][i].tolist() == part


def test_requests_of_a_dynamic_batch_share_one_bls_call_per_model(served):
    pipeline, model = served
    requests = [_request([1, 2, 3, 4]), _request([-1, 2, -3, 4], [0.5, -1, -1, 1]),
                _request([4, 3, 2, 1])]
    responses = model.execute(requests)
    _assert_matches(pipeline, [[1, 2, 3, 4]], _outputs(responses[0]))
    _assert_matches(pipeline, [[-1, 2, -3, 4], [0.5, -1, -1, 1]], _outputs(responses[1]))
    _assert_matches(pipeline, [[4, 3, 2, 1]], _outputs(responses[2]))
    # 4 rows, the model's max_batch_size is 3: two BLS calls instead of four
    assert [(c.model_name, c.batch_size) for c in pb.Models.calls] == [("affine", 3),
                                                                       ("affine", 1)]


def test_a_failing_call_fails_only_its_own_request(served):
    pipeline, model = served
    responses = model.execute([_request([1, 2, 3, 4]), _request([13, 0, 0, 0]),
                               _request([2, 2, 2, 2])])
    assert not responses[0].has_error() and not responses[2].has_error()
    message = responses[1].error().message()
    assert message == ("operator '_refuse_13' (map v -> checked) failed: ValueError: "
                       "13 is unlucky")
    _assert_matches(pipeline, [[2, 2, 2, 2]], _outputs(responses[2]))


def test_a_failing_call_in_a_request_batch_is_located(served):
    _, model = served
    (response,) = model.execute([_request([1, 2, 3, 4], [13, 1, 1, 1])])
    assert response.error().message().endswith("(call 1 of the request's batch)")


def test_a_bad_request_gets_an_error_response(served, generation):
    """Before r23.09 ``TritonError`` has no codes: the bad request still gets its own error
    response (a server error, saying "bad request"), and the rest of its batch its results."""
    pipeline, model = served
    not_numbers = pb.Request({"v": np.array([[b"\xff"]], dtype=object)})
    responses = model.execute([pb.Request({}), _request([1, 2, 3, 4]), not_numbers,
                               _request([2, 2, 2, 2])])
    assert responses[0].error().message() == "bad request: input 'v' is missing"
    assert responses[2].error().message().startswith("bad request: input 'v'")
    if hasattr(generation.TritonError, "INVALID_ARG"):
        assert responses[0].error().code() == generation.TritonError.INVALID_ARG
    else:
        assert not hasattr(responses[0].error(), "code")
    _assert_matches(pipeline, [[1, 2, 3, 4]], _outputs(responses[1]))
    _assert_matches(pipeline, [[2, 2, 2, 2]], _outputs(responses[3]))


def test_a_failing_operator_is_a_server_error_not_a_bad_request(served, generation):
    _, model = served
    (response,) = model.execute([_request([13, 0, 0, 0])])
    assert response.error().message().startswith("operator '_refuse_13'")
    if hasattr(generation.TritonError, "INTERNAL"):
        assert response.error().code() == generation.TritonError.INTERNAL


@pytest.mark.parametrize("release, missing", [
    ("r22.12", ["preferred_memory", "custom_metrics", "error_codes", "cancellation"]),
    ("r23.05", ["error_codes", "cancellation"]), ("r24.10", [])])
def test_the_python_backend_api_of_each_release_is_found_by_its_names(release, missing):
    api = pipeline_model.PythonBackendApi.of(pb.generation(release))
    assert api.missing() == missing and api.logger
    assert pipeline_model.PythonBackendApi.of(pb) == pipeline_model.PythonBackendApi.of(
        pb.generation("r24.10"))


def test_ragged_outputs_of_different_lengths_need_separate_requests(served):
    _, model = served
    (response,) = model.execute([_request([1, 2, 3, 4], [1, -2, 3, 4])])
    assert "send them in separate requests" in response.error().message()


def test_bls_errors_become_error_responses(served):
    _, model = served

    def broken(inputs):
        raise RuntimeError("model crashed")

    pb.Models.registry["affine"] = broken
    responses = model.execute([_request([1, 2, 3, 4]), _request([2, 2, 2, 2])])
    for response in responses:
        assert "model 'affine': model crashed" in response.error().message()


def test_a_model_that_cannot_take_a_request_now_makes_the_pipeline_answer_unavailable(
        served, generation):
    """A model operator's queue policy refuses a BLS request (UNAVAILABLE: its latency budget
    spent): the pipeline's answer says UNAVAILABLE too, where the release has error codes, so
    that the client sends it again instead of giving up on a server error."""
    _, model = served

    def refused(inputs):
        raise pb.Unavailable("Request timeout expired")

    pb.Models.registry["affine"] = refused
    (response,) = model.execute([_request([1, 2, 3, 4])])
    assert "model 'affine': Request timeout expired" in response.error().message()
    if hasattr(generation.TritonError, "UNAVAILABLE"):
        assert response.error().code() == generation.TritonError.UNAVAILABLE


def test_a_closing_replica_answers_new_requests_unavailable_and_counts_those_it_serves(
        built, initialized, monkeypatch, tmp_path, generation):
    """Under the supervisor (builder.runtime.drain): every request is counted while it is
    executed; once the replica closes, new ones are refused with UNAVAILABLE, not run."""
    from builder.runtime import drain

    monkeypatch.setenv(drain.STATE_DIR_VARIABLE, str(tmp_path))
    monkeypatch.setattr(drain, "STATE_DIR", tmp_path)
    pipeline, root = built
    _wire_bls(root)
    model = initialized(root / "pipeline")
    seen = []
    session = pb.Models.registry["affine"]
    pb.Models.registry["affine"] = lambda inputs: (seen.append(drain.in_flight(tmp_path)),
                                                   session(inputs))[1]
    responses = model.execute([_request([1, 2, 3, 4]), _request([2, 2, 2, 2])])
    _assert_matches(pipeline, [[1, 2, 3, 4]], _outputs(responses[0]))
    assert seen == [2] and drain.in_flight(tmp_path) == 0
    drain.announce(drain.CLOSING, tmp_path)
    responses = model.execute([_request([1, 2, 3, 4])])
    assert responses[0].error().message() == pipeline_model.STOPPING
    if hasattr(generation.TritonError, "UNAVAILABLE"):
        assert responses[0].error().code() == generation.TritonError.UNAVAILABLE
    assert seen == [2], "a closing replica ran a new request"
    assert drain.in_flight(tmp_path) == 0


def test_bls_outputs_in_gpu_memory_are_read_through_dlpack(served):
    """No GPU here: the stand-in marks BLS outputs as device memory that only dlpack may read."""
    pipeline, model = served
    pb.Models.outputs_on_gpu = True
    (response,) = model.execute([_request([1, 2, 3, 4])])
    _assert_matches(pipeline, [[1, 2, 3, 4]], _outputs(response))


def test_a_row_larger_than_the_models_max_batch_size_is_refused_alone_or_among_others(
        served):
    _, model = served
    (op,) = model.pipeline.model_ops()  # served: max_batch_size 3
    calls = []
    runner = model_batching.BatchingRunner(lambda target, inputs: calls.append(inputs))
    big, small = np.zeros((4, 4), np.float32), np.zeros((1, 4), np.float32)
    for rows in ([(big,)], [(small,), (big,)]):
        with pytest.raises(model_batching.BatchError, match=r"batch size 4, more than the "
                                                           r"model's max_batch_size 3"):
            runner.infer(op, rows)
    assert calls == []


def _sent(pipeline) -> dict[tuple[str, str], float]:
    """What reached the stand-in's metrics, summed by (metric, operator); checks the labels."""
    sent: dict[tuple[str, str], float] = {}
    for name, labels, value in pb.MetricFamily.increments:
        assert (labels["model"], labels["version"]) == ("pipeline", "1")
        assert labels["operator"] in {node.label for node in pipeline.plan.nodes}
        sent[name, labels["operator"]] = sent.get((name, labels["operator"]), 0) + value
    return sent


def _metrics_every(model, pipeline, interval: float) -> list[str]:
    """Give ``model`` metrics sent every ``interval`` seconds, none sent yet; their operators."""
    labels = [node.label for node in pipeline.plan.nodes]
    model.metrics.close()
    pb.MetricFamily.increments.clear()
    pb.MetricFamily.observations.clear()
    model.metrics = OperatorMetrics(model.api, {"model": "pipeline", "version": "1"}, labels,
                                    interval=interval)
    return labels


def _rows_sent(pipeline, labels) -> dict[str, float]:
    sent = _sent(pipeline)
    return {label: sent[OperatorMetrics.ROWS, label] for label in labels}


@pytest.mark.parametrize("generation", WITH_METRICS, indirect=True)
def test_each_operators_time_and_rows_go_to_the_servers_metrics(served):
    pipeline, model = served
    labels = _metrics_every(model, pipeline, 3600)  # sent by hand below
    vectors = [[1.0, -2.0, 3.0, 4.0], [2.0, 2.0, -1.0, 0.5], [0.5, 0.5, 0.5, 0.5]]
    model.execute([_request(vectors[0]), _request(*vectors[1:])])
    model.execute([_request(vectors[0])])
    assert pb.MetricFamily.increments == []  # accumulated: an increment is a message to Triton
    model.metrics.send()
    # four calls through every node, flat_map included
    assert _rows_sent(pipeline, labels) == dict.fromkeys(labels, 4)
    assert all(_sent(pipeline)[OperatorMetrics.DURATION, label] > 0 for label in labels)
    pb.MetricFamily.increments.clear()
    model.metrics.send()
    assert pb.MetricFamily.increments == []  # nothing new, nothing sent
    model.execute([_request(vectors[1])])
    model.finalize()  # what is left is sent when the model unloads
    assert _rows_sent(pipeline, labels) == dict.fromkeys(labels, 1)


@pytest.mark.parametrize("generation", WITH_METRICS, indirect=True)
def test_each_call_of_an_operator_is_observed_in_its_latency_histogram(served, generation):
    """r24.10: one observation per call of each operator (a batch of requests is one call),
    its seconds, the buckets 0.1 ms to 10 s; r23.05 has no histograms: counters only."""
    pipeline, model = served
    labels = _metrics_every(model, pipeline, 3600)
    vectors = [[1.0, -2.0, 3.0, 4.0], [2.0, 2.0, -1.0, 0.5]]
    model.execute([_request(vectors[0]), _request(vectors[1])])  # one call of each operator
    model.execute([_request(vectors[1])])
    model.metrics.send()
    observed: dict[str, list[float]] = {}
    for name, labelled, seconds in pb.MetricFamily.observations:
        assert name == OperatorMetrics.LATENCY and labelled["model"] == "pipeline"
        observed.setdefault(labelled["operator"], []).append(seconds)
    if not hasattr(generation.MetricFamily, "HISTOGRAM"):
        assert observed == {} and not model.metrics.histograms
        assert _rows_sent(pipeline, labels) == dict.fromkeys(labels, 3)
        return
    assert model.metrics.histograms
    assert sorted(observed) == sorted(labels)
    sent = _sent(pipeline)
    for label in labels:
        assert len(observed[label]) == 2 and all(0 < s < 10 for s in observed[label])
        assert sum(observed[label]) * 1e6 == pytest.approx(sent[OperatorMetrics.DURATION, label])
    pb.MetricFamily.observations.clear()
    model.metrics.send()
    assert pb.MetricFamily.observations == []  # each call observed once


@pytest.mark.parametrize("generation", ["r24.10"], indirect=True)
def test_histograms_are_off_where_the_container_says_so(served):
    from builder.runtime.operator_metrics import HISTOGRAMS_VARIABLE, histograms_wanted

    assert histograms_wanted({}) and histograms_wanted({HISTOGRAMS_VARIABLE: "on"})
    assert not any(histograms_wanted({HISTOGRAMS_VARIABLE: value})
                   for value in ("off", "0", "False", "no"))
    pipeline, model = served
    labels = [node.label for node in pipeline.plan.nodes]
    model.metrics.close()
    pb.MetricFamily.increments.clear()
    pb.MetricFamily.observations.clear()
    model.metrics = OperatorMetrics(model.api, {"model": "pipeline", "version": "1"}, labels,
                                    interval=3600, histograms=False)
    model.execute([_request([1.0, 2.0, 3.0, 4.0])])
    model.metrics.send()
    assert not model.metrics.histograms and pb.MetricFamily.observations == []
    assert _rows_sent(pipeline, labels) == dict.fromkeys(labels, 1)


@pytest.mark.parametrize("generation", WITH_METRICS, indirect=True)
def test_operator_metrics_are_sent_without_requests_to_carry_them(served):
    """A thread sends them: the last requests before a quiet spell are not held back."""
    pipeline, model = served
    labels = _metrics_every(model, pipeline, 0.05)
    model.execute([_request([1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 2.0, 2.0])])
    deadline = time.monotonic() + 10
    while len(pb.MetricFamily.increments) < 2 * len(labels) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _rows_sent(pipeline, labels) == dict.fromkeys(labels, 2)


@pytest.mark.parametrize("generation", ["r22.12"], indirect=True)
def test_without_custom_metrics_the_pipeline_model_serves_untimed(built, initialized):
    """Releases before 23.05 have no ``MetricFamily``."""
    pipeline, root = built
    _wire_bls(root)
    model = initialized(root / "pipeline")
    assert model.metrics is None
    _assert_matches(pipeline, [[1.0, 2.0, 3.0, 4.0]],
                    _outputs(model.execute([_request([1.0, 2.0, 3.0, 4.0])])[0]))


def test_the_runtime_refuses_a_pickle_from_another_python(built, monkeypatch, tmp_path):
    _, root = built
    copy = tmp_path / "pipeline"
    (copy / "1").mkdir(parents=True)
    for item in (root / "pipeline").rglob("*"):
        if item.is_file():
            target = copy / item.relative_to(root / "pipeline")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(item.read_bytes())
    versions = copy / "1" / "pipe.versions.json"
    record = json.loads(versions.read_text())
    versions.write_text(json.dumps({**record, "python": "3.7.9"}))
    monkeypatch.setattr(pipeline_model, "pb_utils", pb)
    with pytest.raises(PipelineLoadError, match=r"written by Python 3\.7\.9"):
        pipeline_model.TritonPythonModel().initialize(_args(copy))


def test_the_python_format_runtime_batches_and_isolates_bad_requests(tmp_path, monkeypatch):
    pipeline = _make_pipeline({"format_priority": ["python"]})
    build_pipeline_model(pipeline, tmp_path / "models")
    monkeypatch.setattr(torch_model, "pb_utils", pb)
    model = torch_model.TritonPythonModel()
    model.initialize(_args(tmp_path / "models" / "affine"))
    good = np.arange(8, dtype=np.float32).reshape(2, 4)
    responses = model.execute([pb.Request({"x": good}), pb.Request({"x": good[:1, :3]}),
                               pb.Request({"x": good[1:]})])
    op = pipeline.model_ops()[0]
    with torch.no_grad():
        expected = op.module(torch.from_numpy(good)).numpy()
    np.testing.assert_allclose(_outputs(responses[0])["output_0"], expected, atol=1e-6)
    np.testing.assert_allclose(_outputs(responses[2])["output_0"], expected[1:], atol=1e-6)
    assert responses[1].has_error()


@pytest.mark.parametrize("generation", ["r22.12"], indirect=True)
def test_before_23_04_bls_asks_for_no_memory_and_reads_gpu_outputs_through_dlpack(served):
    """Releases before 23.04 have no ``pb_utils.PreferredMemory`` (and ``InferenceRequest`` no
    ``preferred_memory``): a GPU model's outputs reach the pipeline model in GPU memory. No GPU
    here: the stand-in marks them as device memory that only dlpack may read (``as_numpy``
    raises, as Triton's does)."""
    pipeline, model = served
    pb.Models.outputs_on_gpu = True
    (response,) = model.execute([_request([1, 2, 3, 4])])
    _assert_matches(pipeline, [[1, 2, 3, 4]], _outputs(response))
    assert pb.Models.preferred_memory == [None]


@pytest.mark.parametrize("generation", WITH_METRICS, indirect=True)
def test_from_23_04_bls_asks_for_host_memory(served):
    _, model = served
    model.execute([_request([1, 2, 3, 4])])
    (asked,) = pb.Models.preferred_memory
    assert (asked.kind, asked.device) == (pb.TRITONSERVER_MEMORY_CPU, 0)


def test_gpu_outputs_without_torch_in_the_environment_are_a_clear_error(monkeypatch):
    import sys

    api = pipeline_model.TritonApi(pb)
    monkeypatch.setitem(sys.modules, "torch.utils.dlpack", None)
    with pytest.raises(model_calls.BlsError, match="GPU memory and torch.*not installed"):
        api.to_numpy(pb.Tensor("y", np.ones(2), on_gpu=True))


class DeviceChecked(torch.nn.Module):
    """Fails unless its inputs are on the device it was moved to; leaves results there."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        where = getattr(self, "standin_device", None)
        if getattr(x, "standin_device", None) != where:
            raise RuntimeError(f"input on {getattr(x, 'standin_device', 'cpu')}, module on "
                               f"{where or 'cpu'}")
        y = self.linear(x)
        if where:
            y.standin_device = where
        return y


def _python_format_gpu_model(tmp_path, monkeypatch, device_id: str):
    from builder import ModelOp
    from builder.base.releases import resolve

    torch.manual_seed(0)
    op = ModelOp(DeviceChecked(), torch.zeros(4), name="checked",
                 op_config={"format_priority": ["python"]})
    pipeline = pipe.input("v").map("v", "y", op).output("y").with_example(
        np.ones(4, np.float32))
    build_pipeline_model(pipeline, tmp_path / "models", target=resolve("12.4"))
    (group,) = read_config(tmp_path / "models" / "checked").instance_group
    assert group.kind == group.KIND_GPU
    monkeypatch.setattr(torch_model, "pb_utils", pb)
    args = {**_args(tmp_path / "models" / "checked"), "model_instance_kind": "GPU",
            "model_instance_device_id": device_id}
    return op, args


def test_a_python_format_model_on_a_gpu_instance_runs_there_and_answers_in_host_memory(
        tmp_path, monkeypatch):
    """No GPU here: :class:`tests.support.pb_utils_standin.GpuStandIn` stands in for two GPUs."""
    op, args = _python_format_gpu_model(tmp_path, monkeypatch, device_id="1")
    gpu = pb.GpuStandIn(devices=2).install(monkeypatch)
    model = torch_model.TritonPythonModel()
    model.initialize(args)
    assert gpu.moves == [("module", "cuda:1")]
    host, device = np.arange(8, dtype=np.float32).reshape(2, 4), np.ones((1, 4), np.float32)
    responses = model.execute([pb.Request({"x": host}),
                               pb.Request({"x": device}, on_gpu=True)])  # read via dlpack
    with torch.no_grad():
        expected = op.module.linear(torch.from_numpy(np.concatenate([host, device]))).numpy()
    np.testing.assert_allclose(_outputs(responses[0])["output_0"], expected[:2], atol=1e-6)
    np.testing.assert_allclose(_outputs(responses[1])["output_0"], expected[2:], atol=1e-6)
    # one batch: its input moved to the instance's GPU once, its result back to the host once
    assert gpu.moves[1:] == [("tensor", "cuda:1"), ("tensor", "cpu")]


def test_a_gpu_instance_whose_torch_has_no_cuda_fails_to_load(tmp_path, monkeypatch):
    """torch here is a CPU build: exactly what a CPU wheel in a GPU image would be."""
    _, args = _python_format_gpu_model(tmp_path, monkeypatch, device_id="0")
    with pytest.raises(RuntimeError, match=r"KIND_GPU on cuda:0.*sees no CUDA device"):
        torch_model.TritonPythonModel().initialize(args)


class CountingSession:
    """A real ONNX Runtime session that records the batch size of each run (a spy)."""

    def __init__(self, session) -> None:
        self.session = session
        self.runs: list[int] = []

    def run(self, names, feeds):
        self.runs.append(len(next(iter(feeds.values()))))
        return self.session.run(names, feeds)


@pytest.fixture(scope="module")
def built_in_process(tmp_path_factory):
    """The default build for a CPU target: the pipeline model runs the ONNX model itself."""
    root = tmp_path_factory.mktemp("in-process") / "models"
    pipeline = _make_pipeline({"max_batch_size": 3})
    result = build_pipeline_model(pipeline, root)
    assert [(m.name, m.in_process) for m in result.models] == [("affine", True)]
    return pipeline, root


def test_on_cpu_targets_the_pipeline_model_runs_its_onnx_models_without_bls(
        built_in_process, initialized):
    pipeline, root = built_in_process
    pb.Models.reset()
    model = initialized(root / "pipeline")
    spy = model.sessions["affine"] = CountingSession(model.sessions["affine"])
    vectors = [[1, 2, 3, 4], [-1, 2, -3, 4], [0.5, -1, -1, 1], [4, 3, 2, 1]]
    responses = model.execute([_request(vectors[0]), _request(*vectors[1:3]),
                               _request(vectors[3])])
    _assert_matches(pipeline, vectors[:1], _outputs(responses[0]))
    _assert_matches(pipeline, vectors[1:3], _outputs(responses[1]))
    _assert_matches(pipeline, vectors[3:], _outputs(responses[2]))
    assert pb.Models.calls == []  # no BLS request at all
    assert spy.runs == [3, 1]  # max_batch_size 3 still bounds one run
    # the model operator keeps its Triton model: clients can call it directly
    assert read_config(root / "affine").platform == "onnxruntime_onnx"


def _counted_sessions(monkeypatch) -> list:
    """Every ONNX Runtime session opened from now on, as a spy recording its runs."""
    opened = []
    real = ort.InferenceSession

    def spied(*args, **kwargs):
        opened.append(CountingSession(real(*args, **kwargs)))
        opened[-1].threads = kwargs["sess_options"].intra_op_num_threads
        return opened[-1]

    monkeypatch.setattr(ort, "InferenceSession", spied)
    return opened


def test_each_in_process_session_runs_once_on_the_example_before_the_first_request(
        built_in_process, initialized, monkeypatch):
    """The first request after ready paid for ONNX Runtime's first run."""
    _, root = built_in_process
    monkeypatch.setattr(model_calls.os, "cpu_count", lambda: 2)
    opened = _counted_sessions(monkeypatch)
    initialized(root / "pipeline")
    # the example: one row, alone, then in the pipeline's warm-up, then as Triton's sample
    assert [(s.runs, s.threads) for s in opened] == [([1, 1, 1], 1)]


def test_a_heavy_model_gets_every_core_of_its_instance(built_in_process, initialized,
                                                       monkeypatch):
    _, root = built_in_process
    monkeypatch.setattr(model_calls.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(model_calls, "HEAVY_RUN_S", 0.0)  # as if its example took long
    opened = _counted_sessions(monkeypatch)
    model = initialized(root / "pipeline")
    assert [(s.runs, s.threads) for s in opened] == [([1], 1), ([1, 1, 1], 2)]
    assert model.sessions["affine"] is opened[1]


def test_without_onnxruntime_in_its_environment_the_pipeline_model_falls_back_to_bls(
        built_in_process, initialized, monkeypatch):
    pipeline, root = built_in_process
    _wire_bls(root)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as when not installed
    monkeypatch.setattr(pipeline_model, "check_versions", lambda record: [])
    warnings = []
    monkeypatch.setattr(pipeline_model.TritonApi, "log_warning",
                        lambda self, message: warnings.append(message))
    model = initialized(root / "pipeline")
    (response,) = model.execute([_request([1, 2, 3, 4])])
    _assert_matches(pipeline, [[1, 2, 3, 4]], _outputs(response))
    assert [c.model_name for c in pb.Models.calls] == ["affine"]
    assert "go through BLS" in warnings[0]


def test_in_process_sessions_do_not_spin(monkeypatch):
    monkeypatch.setattr(model_calls.os, "cpu_count", lambda: 16)
    options = model_calls.cpu_session_options(ort, instances=2)
    assert options.intra_op_num_threads == 4 and options.inter_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


# -- bad input: refused by an operator, or over the size limit ---------------------------------
@rejects(UnicodeDecodeError)
def _decode(data):
    return data.decode("utf-8")


def _length(text):
    if not text:
        raise InputError("the text is empty")
    if text == "boom":
        raise RuntimeError("a bug")
    return len(text)


LIMIT = 64


@pytest.fixture(scope="module")
def checked_repository(tmp_path_factory):
    """A pipeline whose operators refuse some inputs, served with a 64-byte request limit."""
    root = tmp_path_factory.mktemp("checked") / "models"
    pipeline = (pipe.input("data").map("data", "text", _decode).map("text", "n", _length)
                .output("n").with_example(b"hello"))
    result = build_pipeline_model(pipeline, root, max_request_bytes=LIMIT)
    assert result.max_request_bytes == LIMIT
    return pipeline, root


@pytest.fixture
def checked(checked_repository, initialized, monkeypatch):
    monkeypatch.delenv(request_size.MAX_REQUEST_ENV, raising=False)
    pipeline, root = checked_repository
    return pipeline, initialized(root / "pipeline")


def _data(*values: bytes) -> pb.Request:
    return pb.Request({"data": np.array([[v] for v in values], dtype=object)})


def _code(response, generation):
    """The response's error code by name; ``None`` before releases had codes."""
    if not hasattr(generation.TritonError, "INVALID_ARG"):
        return None
    codes = {getattr(generation.TritonError, n): n for n in ("INVALID_ARG", "INTERNAL")}
    return codes[response.error().code()]


def test_an_input_an_operator_rejects_is_the_clients_mistake(checked, generation):
    """A declared exception (``@rejects``) and ``InputError`` answer INVALID_ARGUMENT with the
    operator and its column named; any other exception stays a server fault; the rest of the
    batch is served."""
    _, model = checked
    responses = model.execute([_data(b"caf\xe9"), _data(b""), _data(b"boom"), _data(b"fine")])
    assert responses[0].error().message().startswith(
        "operator '_decode' (map data -> text) rejected its input 'data': 'utf-8' codec "
        "can't decode byte 0xe9")
    assert responses[0].error().message().endswith("(UnicodeDecodeError)")
    assert responses[1].error().message() == (
        "operator '_length' (map text -> n) rejected its input 'text': the text is empty")
    assert responses[2].error().message() == (
        "operator '_length' (map text -> n) failed: RuntimeError: a bug")
    assert [_code(r, generation) for r in responses[:3]] == (
        ["INVALID_ARG", "INVALID_ARG", "INTERNAL"] if _code(responses[0], generation) else
        [None] * 3)
    assert _outputs(responses[3])["n"].tolist() == [[4]]


@pytest.mark.parametrize("generation", WITH_METRICS, indirect=True)
def test_rejected_inputs_are_counted_apart_from_failures(checked):
    pipeline, model = checked
    labels = _metrics_every(model, pipeline, 3600)
    model.execute([_data(b"caf\xe9"), _data(b""), _data(b""), _data(b"boom"), _data(b"ok")])
    model.metrics.send()
    sent = _sent(pipeline)
    decode, length = labels
    assert sent[OperatorMetrics.REJECTED, decode] == 1
    assert sent[OperatorMetrics.REJECTED, length] == 2
    assert sent[OperatorMetrics.FAILURES, length] == 1
    assert (OperatorMetrics.FAILURES, decode) not in sent  # nothing failed there: not sent
    assert sent[OperatorMetrics.ROWS, decode] == 5 and sent[OperatorMetrics.ROWS, length] == 4


def test_a_request_over_the_limit_is_refused_before_it_is_decoded(checked, generation):
    """64 bytes: the element's 4-byte length prefix counts, as on the wire. A request at the
    limit is served; one byte more is refused naming the limit, the rest of the batch served."""
    _, model = checked
    at_limit, over = b"a" * (LIMIT - 4), b"a" * (LIMIT - 3)
    responses = model.execute([_data(at_limit), _data(over), _data(b"\xff" * 100)])
    assert _outputs(responses[0])["n"].tolist() == [[LIMIT - 4]]
    for response in responses[1:]:  # too large is said before "not UTF-8"
        message = response.error().message()
        assert "over this pipeline's limit of 64 bytes" in message, message
        assert "TRITON_BUILDER_MAX_REQUEST_BYTES" in message
        assert _code(response, generation) in ("INVALID_ARG", None)
    assert "inputs are 65 bytes" in responses[1].error().message()
    two, three = model.execute([_data(b"a" * 20, b"b" * 20), _data(*[b"c" * 20] * 3)])
    assert _outputs(two)["n"].tolist() == [[20], [20]]
    assert "inputs are 72 bytes" in three.error().message()  # a request's whole batch counts


def test_the_limit_is_set_at_run_by_the_environment(checked_repository, initialized,
                                                     monkeypatch):
    _, root = checked_repository
    monkeypatch.setenv(request_size.MAX_REQUEST_ENV, "1000")
    model = initialized(root / "pipeline")
    assert _outputs(model.execute([_data(b"a" * 500)])[0])["n"].tolist() == [[500]]
    monkeypatch.setenv(request_size.MAX_REQUEST_ENV, "lots")  # ignored, said in the log
    model = initialized(root / "pipeline")
    assert model.limit == LIMIT


def test_tensor_bytes_count_as_the_wire_does():
    assert request_size.tensor_bytes(np.zeros((2, 3), np.float32)) == 24
    assert request_size.tensor_bytes(np.array([[b"abc"], ["é"]], dtype=object)) == 3 + 2 + 8


# -- the warm-up in initialize (issue 66) ------------------------------------------------------
def _noted(tag):
    """A Python operator that notes each row it sees in the file ``$WARM_UP_NOTES`` (the
    pipeline travels by value: a list here would not be the served one's)."""
    def note(v):
        with open(os.environ["WARM_UP_NOTES"], "a") as notes:
            notes.write(f"{tag} {len(v)}\n")
        if os.environ.get("WARM_UP_FAILS") == tag:
            raise RuntimeError(f"{tag} cannot run here")
        return v
    return note


def _noting_pipeline(**build):
    def build_into(root):
        pipeline = (pipe.input("v")
                    .map("v", "before", _noted("before"))
                    .map("before", "y", affine_op(op_config={"max_batch_size": 3}))
                    .map("y", "after", _noted("after"))
                    .output("after")
                    .with_example([1.0, 2.0, 3.0, 4.0])
                    .with_example([4.0, 3.0, 2.0, 1.0]))
        build_pipeline_model(pipeline, root, **build)
        os.truncate(os.environ["WARM_UP_NOTES"], 0)  # what the build ran is not the warm-up
        return root
    return build_into


@pytest.fixture
def notes(tmp_path, monkeypatch):
    path = tmp_path / "notes"
    path.write_text("")
    monkeypatch.setenv("WARM_UP_NOTES", str(path))
    return path


def test_the_pipeline_runs_its_examples_through_every_operator_before_it_is_ready(
        tmp_path, notes, initialized, monkeypatch):
    """In process (a CPU target): in initialize each example alone, then both as one batch,
    through every operator and the model's session; then Triton's samples, the examples as
    requests, through execute. Nothing of it is counted as served."""
    root = _noting_pipeline()(tmp_path / "models")
    opened = _counted_sessions(monkeypatch)
    pb.Logger.infos.clear()
    model = initialized(root / "pipeline", warm_up=False)
    in_initialize = ["before 4", "after 3", "before 4", "after 3", "before 4", "before 4",
                     "after 3", "after 3"]
    assert notes.read_text().split("\n")[:-1] == in_initialize
    samples = pb.warm_up_requests(root / "pipeline", read_config(root / "pipeline"))
    assert [len(sample) for sample in samples] == [1, 1]
    for sample in samples:
        (response,) = model.execute(sample)  # answered as a request is
        assert _outputs(response)["after"].shape == (1, 3)
    assert notes.read_text().split("\n")[:-1] == in_initialize + ["before 4", "after 3"] * 2
    assert [s.runs for s in opened] == [[1, 1, 1, 2, 1, 1]]  # its own example, then the rest
    (info,) = [m for m in pb.Logger.infos if "warmed up" in m]
    assert "on 2 example(s)" in info and "as 2 request(s)" in info and "cold" not in info
    if model.metrics is not None:
        assert not any(model.metrics.times), model.metrics.times


def test_a_bls_model_is_not_called_before_ready_and_what_follows_it_is_said_to_be_cold(
        tmp_path, notes, initialized):
    """Triton serves no BLS request before every model has loaded: the calls stop at the model
    (it warms itself with its model_warmup), Triton's samples are answered empty (not as
    errors, which would fail the load), and the log says which operators start cold. Once
    ready, requests reach the model."""
    root = _noting_pipeline(in_process=False)(tmp_path / "models")
    _wire_bls(root)
    pb.Logger.infos.clear()
    model = initialized(root / "pipeline", warm_up=False)
    for sample in pb.warm_up_requests(root / "pipeline", read_config(root / "pipeline")):
        (response,) = model.execute(sample)
        assert not response.has_error() and response.output_tensors == []
    assert pb.Models.calls == []
    assert notes.read_text().split("\n")[:-1] == ["before 4"] * 6
    (info,) = [m for m in pb.Logger.infos if "warmed up" in m]
    assert "['affine'] are left cold" in info
    assert read_config(root / "affine").model_warmup, "the model warms itself"
    (response,) = model.execute([_request([1.0, 2.0, 3.0, 4.0])])
    assert "after" in _outputs(response) and [c.model_name for c in pb.Models.calls] == ["affine"]


def test_a_replica_started_with_the_warm_up_off_runs_no_example(tmp_path, notes, initialized,
                                                                monkeypatch):
    root = _noting_pipeline()(tmp_path / "models")
    monkeypatch.setenv(warm_up.SWITCH, "0")
    pb.Logger.infos.clear()
    initialized(root / "pipeline")
    assert notes.read_text() == ""
    assert not [m for m in pb.Logger.infos if "warmed up" in m]


def test_a_warm_up_that_fails_fails_the_load_naming_the_operator(tmp_path, notes, initialized,
                                                                  monkeypatch):
    root = _noting_pipeline()(tmp_path / "models")
    monkeypatch.setenv("WARM_UP_FAILS", "after")
    with pytest.raises(warm_up.WarmUpError, match=(
            r"warm-up on example 0 failed: operator .*after.* failed: RuntimeError: after "
            r"cannot run here")):
        initialized(root / "pipeline")


def test_the_served_pipeline_keeps_the_first_examples_for_its_warm_up(tmp_path):
    many = pipe.input("v").map("v", "w", lambda v: v).output("w")
    for index in range(warm_up.MAX_EXAMPLES + 3):
        many = many.with_example(float(index))
    build_pipeline_model(many, tmp_path / "models")
    with open(tmp_path / "models" / "pipeline" / "1" / "pipe.pickle", "rb") as file:
        served = pickle.load(file)
    assert served.examples == tuple((float(i),) for i in range(warm_up.MAX_EXAMPLES))
