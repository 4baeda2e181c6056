"""Traces of the served pipeline model (issue 67, item 1), run without Triton.

The repository is really built and its model operator really runs (onnxruntime behind the
stand-in BLS of :mod:`tests.support.pb_utils_standin`); the spans go through the real
OpenTelemetry SDK and its OTLP/HTTP exporter to a real receiver
(:mod:`tests.support.otlp_receiver`), which decodes them with the OpenTelemetry protobufs.
"""

from __future__ import annotations

import json
import os
import secrets
import sys

import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import json_format

from builder import build_pipeline_model, pipe
from builder.repository.model_config import read_config
from builder.runtime import pipeline_model, tracing
from tests.support import pb_utils_standin as pb
from tests.support.otlp_receiver import OtlpGrpcReceiver, OtlpReceiver, trees
from tests.support.tiny_models import affine_op


def _refuse_13(v):
    if v[0] == 13:
        raise ValueError("13 is unlucky")
    return v


PIPELINE = (pipe.input("v").map("v", "checked", _refuse_13)
            .map("checked", "y", affine_op(op_config={"max_batch_size": 8}))
            .map("y", "total", lambda y: float(np.sum(y)))
            .output("y", "total").with_example([1.0, 2.0, 3.0, 4.0]))
LABELS = [node.label for node in PIPELINE.plan.nodes]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("tracing") / "models"
    build_pipeline_model(PIPELINE, root, in_process=False)
    return root


@pytest.fixture
def receiver():
    with OtlpReceiver(host="127.0.0.1") as receiver:
        yield receiver


@pytest.fixture
def model(root, receiver, monkeypatch):
    """The pipeline model initialised as Triton would, exporting to ``receiver``."""
    monkeypatch.setattr(pipeline_model, "pb_utils", pb.generation("r24.10"))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    pb.Models.reset()
    session = ort.InferenceSession(str(root / "affine" / "1" / "model.onnx"))
    pb.Models.registry["affine"] = lambda inputs: dict(
        zip(["output_0"], session.run(["output_0"], inputs), strict=True))
    made = []

    def initialize():
        model = pipeline_model.TritonPythonModel()
        config = read_config(root / "pipeline")
        model.initialize({
            "model_name": "pipeline", "model_repository": str(root / "pipeline"),
            "model_version": "1", "model_instance_kind": "CPU", "model_instance_device_id": "0",
            "model_config": json.dumps(json_format.MessageToDict(
                config, preserving_proto_field_name=True))})
        pb.run_warm_up(model, root / "pipeline", config)
        made.append(model)
        return model

    yield initialize
    for each in made:
        each.finalize()


def _parent() -> tuple[str, str]:
    return secrets.token_hex(16), secrets.token_hex(8)


def _request(vectors, trace=None, flags="01") -> pb.Request:
    parameters = {} if trace is None else {"traceparent": f"00-{trace[0]}-{trace[1]}-{flags}"}
    return pb.Request({"v": np.array(vectors, dtype=np.float64)},
                      request_parameters=parameters)


def test_each_request_of_a_batch_is_one_tree_under_its_clients_span(model, receiver):
    served = model()
    parents = [_parent() for _ in range(3)]
    requests = [_request([[1, 2, 3, 4], [5, 6, 7, 8]], parents[0]),  # two calls
                _request([[2, 2, 2, 2]], parents[1]),
                _request([[13, 0, 0, 0]], parents[2])]  # fails in the first operator
    responses = served.execute(requests)
    assert [r.has_error() for r in responses] == [False, False, True]
    served.finalize()
    found = trees(receiver.wait_for(3 + 3 + 3 + 1 + 1 + 1))  # pipelines, operators, models

    assert set(found) == {trace for trace, _ in parents}, "one trace per client, no other"
    for (trace, client_span), calls in zip(parents[:2], (2, 1)):
        tree = found[trace]
        (root,) = tree[client_span]
        assert root.name == "pipeline pipeline" and root.service == "triton-builder/pipeline"
        assert root.attributes["triton_builder.calls"] == calls
        assert root.attributes["triton_builder.batch_requests"] == 3
        operators = tree[root.span_id]
        assert [span.name for span in operators] == [f"operator {label}" for label in LABELS]
        for span in operators:
            assert span.attributes["triton_builder.rows"] == calls
            assert span.attributes["triton_builder.outcome"] == "ok"
            assert root.start_ns <= span.start_ns <= span.end_ns <= root.end_ns
        assert operators[0].attributes["triton_builder.batch_size"] == 4  # every request's
        assert operators[1].attributes["triton_builder.batch_size"] == 3  # 13 dropped before
        (model_call,) = tree[operators[1].span_id]
        assert model_call.name == "model affine"
        assert model_call.attributes == {
            "triton_builder.model": "affine", "triton_builder.route": "bls",
            "triton_builder.rows": calls, "triton_builder.batch_size": 3}
        assert operators[1].start_ns <= model_call.start_ns <= model_call.end_ns \
            <= operators[1].end_ns
        assert not any(span.parent_id == model_call.span_id for span in found[trace].get(
            model_call.span_id, []))
    failed = found[parents[2][0]]
    (root,) = failed[parents[2][1]]
    assert root.status_code == 2 and "13 is unlucky" in root.status_message  # ERROR
    (operator,) = failed[root.span_id]  # the later operators never ran its rows
    assert operator.attributes["triton_builder.outcome"] == "failed"
    assert "13 is unlucky" in operator.status_message


def test_a_request_without_traceparent_starts_its_own_trace(model, receiver):
    served = model()
    (response,) = served.execute([_request([[1, 1, 1, 1]])])
    assert not response.has_error()
    served.finalize()
    spans = receiver.wait_for(5)
    (root,) = [span for span in spans if span.name == "pipeline pipeline"]
    assert root.parent_id == ""
    assert {span.trace_id for span in spans} == {root.trace_id}


def test_a_client_span_that_is_not_sampled_sends_nothing(model, receiver):
    served = model()
    unsampled = _parent()
    assert served.tracing.begin([{"traceparent": f"00-{unsampled[0]}-{unsampled[1]}-00"}]) \
        is None, "a batch none of whose requests is sampled is not recorded at all"
    served.execute([_request([[1, 1, 1, 1]], unsampled, flags="00")])  # parent-based default
    served.execute([_request([[1, 1, 1, 1]], sampled := _parent())])
    served.finalize()
    spans = receiver.wait_for(5)
    assert {span.trace_id for span in spans} == {sampled[0]}


def test_tracing_is_off_without_an_endpoint_and_says_why_without_the_sdk(monkeypatch):
    assert tracing.PipelineTracing.create(pb.Logger, "pipeline", {}) is None
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert tracing.PipelineTracing.create(pb.Logger, "pipeline", {
        **environ, "OTEL_SDK_DISABLED": "true"}) is None
    assert tracing.PipelineTracing.create(pb.Logger, "pipeline", {
        **environ, "OTEL_TRACES_EXPORTER": "none"}) is None
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # not installed
    api = pipeline_model.TritonApi(pb.generation("r24.10"))
    pb.Logger.messages.clear()
    assert tracing.PipelineTracing.create(api, "pipeline", environ) is None
    (warning,) = pb.Logger.messages
    assert "--tracing" in warning and "OTEL_EXPORTER_OTLP_ENDPOINT" in warning


def test_the_protocol_comes_from_the_sdks_variables():
    assert tracing.protocol({}) == "http/protobuf"
    assert tracing.protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == "grpc"
    assert tracing.protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                             "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}) \
        == "http/protobuf"
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL='http/json'"):
        tracing.protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    grpc = tracing.span_exporter({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert type(grpc).__module__.startswith("opentelemetry.exporter.otlp.proto.grpc")
    grpc.shutdown()


def test_spans_go_over_otlp_grpc_where_the_protocol_says(model, monkeypatch):
    """``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``: the SDK's gRPC exporter, to a gRPC collector."""
    with OtlpGrpcReceiver(host="127.0.0.1") as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.port}")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        served = model()
        trace = _parent()
        (response,) = served.execute([_request([[1, 1, 1, 1]], trace)])
        assert not response.has_error()
        served.finalize()
        spans = collector.wait_for(5)
    assert {span.trace_id for span in spans} == {trace[0]}
    (root,) = [span for span in spans if span.parent_id == trace[1]]
    assert root.name == "pipeline pipeline"


def test_a_model_call_of_a_failed_batch_run_again_row_by_row_is_each_rows_own(
        model, receiver):
    """Where a batched model call fails, the executor runs its rows again one by one; each
    of those calls is the one request's."""
    served = model()
    real = pb.Models.registry["affine"]
    pb.Models.registry["affine"] = lambda inputs: (
        (_ for _ in ()).throw(RuntimeError("batch")) if len(next(iter(inputs.values()))) > 1
        else real(inputs))
    parents = [_parent(), _parent()]
    responses = served.execute([_request([[1, 1, 1, 1]], parents[0]),
                                _request([[2, 2, 2, 2]], parents[1])])
    assert not any(r.has_error() for r in responses)
    served.finalize()
    found = trees(receiver.wait_for(2 * (1 + 3 + 2)))
    for trace, client_span in parents:
        (root,) = found[trace][client_span]
        model_op = found[trace][root.span_id][1]
        calls = found[trace][model_op.span_id]
        assert [c.attributes["triton_builder.batch_size"] for c in calls] == [2, 1], calls
        assert [c.status_code for c in calls] == [2, 0] and "batch" in calls[0].status_message


@pytest.mark.skipif(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") is not None,
                    reason="the test run itself exports traces")
def test_without_tracing_the_runner_observes_nothing(model, monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    served = model()
    assert served.tracing is None and served.runner.observe is None
