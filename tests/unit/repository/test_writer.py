"""``build_pipeline_model``: layout, configs, validation before writing, atomic replacement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builder import (
    BuildError,
    ExportError,
    ModelOp,
    OperatorError,
    PipelineError,
    RepositoryOptions,
    SerializationError,
    build_pipeline_model,
    pipe,
)
from builder.repository.export import onnx_io
from builder.repository.model_config import read_config
from tests.support.paths import REPO_ROOT
from tests.support.tiny_models import Doubler, Noisy, affine_op


def _pipeline(op=None):
    op = op or affine_op()
    return (pipe.input("v", "name")
            .map("v", "y", op)
            .map(("y", "name"), "label", lambda y, n: f"{n}:{int(y.argmax())}")
            .output("y", "label")
            .with_example([1.0, 2.0, 3.0, 4.0], "a"))


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo") / "models"
    result = build_pipeline_model(_pipeline(), root, parallelism=2)
    return root, result


def test_the_repository_has_a_pipeline_model_and_one_model_per_model_operator(repository):
    root, result = repository
    assert sorted(_tree(root)) == [
        "affine", "affine/1", "affine/1/model.onnx", "affine/config.pbtxt", "affine/warmup",
        "affine/warmup/input0",
        "pipeline", "pipeline/1", "pipeline/1/model.py", "pipeline/1/pipe.pickle",
        "pipeline/1/pipe.versions.json", "pipeline/1/triton_builder_drain.py",
        "pipeline/1/triton_builder_model_batching.py", "pipeline/1/triton_builder_model_calls.py",
        "pipeline/1/triton_builder_operator_metrics.py",
        "pipeline/1/triton_builder_request_size.py",
        "pipeline/1/triton_builder_stream_outbox.py", "pipeline/1/triton_builder_stream_serving.py",
        "pipeline/1/triton_builder_tracing.py", "pipeline/1/triton_builder_warm_up.py",
        "pipeline/config.pbtxt", "pipeline/warmup",
        "pipeline/warmup/example_0_input0", "pipeline/warmup/example_0_input1",
    ]
    runtime = REPO_ROOT / "builder" / "runtime"
    assert (root / "pipeline" / "1" / "model.py").read_bytes() == (
        runtime / "pipeline_model.py").read_bytes()
    for companion in ("drain", "model_calls", "operator_metrics", "request_size", "warm_up"):
        assert (root / "pipeline" / "1" / f"triton_builder_{companion}.py").read_bytes() == (
            runtime / f"{companion}.py").read_bytes()
    assert result.pipeline_model == "pipeline"
    assert [(m.name, m.format) for m in result.models] == [("affine", "onnx")]


def test_the_pipeline_model_has_typed_named_tensors_and_dynamic_batching(repository):
    root, _ = repository
    config = read_config(root / "pipeline")
    assert config.backend == "python" and config.max_batch_size == 64
    assert [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in config.input] == [
        ("v", "TYPE_FP64", [4]), ("name", "TYPE_STRING", [1])]
    assert [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in config.output] == [
        ("y", "TYPE_FP32", [3]), ("label", "TYPE_STRING", [1])]
    assert config.HasField("dynamic_batching")
    (group,) = config.instance_group
    assert (group.count, group.kind) == (2, mc.ModelInstanceGroup.KIND_CPU)


def test_configs_round_trip_through_text_format(repository):
    root, _ = repository
    for path in root.glob("*/config.pbtxt"):
        text = path.read_text()
        parsed = text_format.Parse(text, mc.ModelConfig())
        assert text_format.MessageToString(parsed) == text
        assert text_format.Parse(text_format.MessageToString(parsed), mc.ModelConfig()) == parsed


def test_onnx_models_match_their_configs(repository):
    root, _ = repository
    for model_file in root.glob("*/1/model.onnx"):
        config = read_config(model_file.parents[1])
        assert config.platform == "onnxruntime_onnx"
        inputs, outputs = onnx_io(onnx.load(str(model_file)))
        for declared, tensors in ((inputs, config.input), (outputs, config.output)):
            assert [(t.name, t.dtype, t.dims) for t in declared] == [
                (t.name, mc.DataType.Name(t.data_type), tuple(t.dims)) for t in tensors]


def test_op_config_and_defaults_shape_the_model_configs(tmp_path):
    op = affine_op(op_config={
        "instance_count": 3, "device_ids": [0, 1], "max_batch_size": 16,
        "dynamic_batching": {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 500},
    })
    other = ModelOp(Doubler(), torch.zeros(1, 3), name="doubler", pre=lambda v: v[None],
                    post=lambda y: y[0])
    p = (pipe.input("v").map("v", "y", op).map("y", "z", other).output("z")
         .with_example(np.ones(4, np.float32)))
    result = build_pipeline_model(
        p, tmp_path / "models", format_priority=["onnx", "python"],
        op_defaults={"instance_count": 2, "max_batch_size": 8},
        max_batch_size=32, dynamic_batching={"max_queue_delay_microseconds": 100})
    affine = read_config(tmp_path / "models" / "affine")
    (group,) = affine.instance_group
    assert (group.kind, group.count, list(group.gpus)) == (
        mc.ModelInstanceGroup.KIND_GPU, 3, [0, 1])
    assert affine.max_batch_size == 16
    assert list(affine.dynamic_batching.preferred_batch_size) == [4, 8]
    assert affine.dynamic_batching.max_queue_delay_microseconds == 500
    doubler = read_config(tmp_path / "models" / "doubler")
    assert doubler.backend == "python" and doubler.max_batch_size == 8
    assert doubler.instance_group[0].count == 2
    pipeline = read_config(tmp_path / "models" / "pipeline")
    assert pipeline.max_batch_size == 32
    assert pipeline.dynamic_batching.max_queue_delay_microseconds == 100
    doubler_result = next(m for m in result.models if m.name == "doubler")
    assert [(a.format, a.ok) for a in doubler_result.attempts] == [("onnx", False),
                                                                   ("python", True)]
    assert "onnx failed: TorchScript-based exporter: UnsupportedOperatorError" in result.report()
    assert "torch.export-based exporter: " in result.report()


def test_a_latency_budget_becomes_queue_policies_that_reject(tmp_path):
    """50 ms: the pipeline model's queue holds a request 25 ms at most, each model operator's
    12.5 ms, one operator's own ``latency_budget_ms`` and ``max_queue_size`` replace its share;
    what waits longer (or finds the queue full) is rejected, not queued."""
    op = affine_op()
    other = ModelOp(Doubler(), torch.zeros(1, 3), name="doubler", pre=lambda v: v[None],
                    post=lambda y: y[0], op_config={"latency_budget_ms": 4, "max_queue_size": 64})
    p = (pipe.input("v").map("v", "y", op).map("y", "z", other).output("z")
         .with_example(np.ones(4, np.float32)))
    build_pipeline_model(p, tmp_path / "models", format_priority=["onnx", "python"],
                         latency_budget_ms=50, max_queue_size=256)
    policies = {name: read_config(tmp_path / "models" / name).dynamic_batching
                .default_queue_policy for name in ("pipeline", "affine", "doubler")}
    assert {name: (policy.timeout_action, policy.default_timeout_microseconds,
                   policy.max_queue_size, policy.allow_timeout_override)
            for name, policy in policies.items()} == {
        "pipeline": (mc.ModelQueuePolicy.REJECT, 25_000, 256, False),
        "affine": (mc.ModelQueuePolicy.REJECT, 12_500, 0, False),
        "doubler": (mc.ModelQueuePolicy.REJECT, 4_000, 64, False)}
    assert [read_config(tmp_path / "models" / name).instance_group[0].count
            for name in ("pipeline", "affine", "doubler")] == [2, 2, 2], \
        "one instance under a queue policy stalls requests (builder.repository.queue_policy)"
    unbounded = build_pipeline_model(_pipeline(), tmp_path / "plain")
    assert not read_config(unbounded.model_root / "pipeline").dynamic_batching.HasField(
        "default_queue_policy"), "no budget, no policy: Triton's own unbounded queue"
    with pytest.raises(PipelineError, match="latency_budget_ms'] must be a positive number"):
        build_pipeline_model(_pipeline(), tmp_path / "bad", latency_budget_ms=0)


def test_an_operator_may_choose_its_own_formats(tmp_path):
    op = affine_op(op_config={"format_priority": ["torchscript"]})
    build_pipeline_model(_pipeline(op), tmp_path / "models")
    config = read_config(tmp_path / "models" / "affine")
    assert config.platform == "pytorch_libtorch"
    assert [t.name for t in config.input] == ["x__0"]


# -- bad pipelines: one clear error, nothing written ----------------------------------------
def _unserializable():
    lock = threading.Lock()
    return (pipe.input("x").map("x", "y", lambda x: lock and x, name="locked").output("y")
            .with_example(1))


BAD_PIPELINES = {
    "unknown column": (
        lambda: pipe.input("text").map("txt", "vec", str.upper, name="embed").output("vec"),
        PipelineError, "operator 'embed' (map txt -> vec) reads column 'txt', which is neither"),
    "unproduced column": (
        lambda: pipe.input("text").map("text", "t", str.upper).output("vec"),
        PipelineError, "pipeline output 'vec' is neither a pipeline input nor produced"),
    "duplicate output": (
        lambda: (pipe.input("t").map("t", "v", str.upper, name="a")
                 .map("t", "v", str.lower, name="b").output("v")),
        PipelineError, "duplicate output: column 'v' is produced by operator 'a' (map t -> v) "
                       "and by operator 'b' (map t -> v)"),
    "cycle": (
        lambda: (pipe.input("x").map(("x", "c"), "b", max, name="f").map("b", "c", abs, name="g")
                 .output("c")),
        PipelineError, "cycle: operator 'f' (map x, c -> b) needs column 'c' from operator 'g'"),
    "unserializable operator": (
        _unserializable,
        SerializationError, "operator 'locked' (map x -> y) cannot be serialized into "
                            "pipe.pickle: TypeError: cannot pickle '_thread.lock' object"),
    "operator failing on the example": (
        lambda: (pipe.input("x").map("x", "y", lambda x: 1 / x, name="invert").output("y")
                 .with_example(0)),
        OperatorError, "operator 'invert' (map x -> y) failed: ZeroDivisionError: division by "
                       "zero (on example 1: (0,))"),
    "a column with an empty axis (Triton's dims are at least 1)": (
        lambda: (pipe.input("x").map("x", "y", lambda x: np.zeros(0, np.float32), name="none")
                 .output("y").with_example(1)),
        BuildError, "model 'pipeline': model output 'y' has dims [0]: each dimension must be"),
    "a model operator's example with a batch axis, without pre=": (
        lambda: (pipe.input("x").map("x", "y", ModelOp(Noisy(), torch.zeros(1, 3), name="noisy"))
                 .output("y").with_example(np.zeros(3, np.float32))),
        OperatorError, "model operator 'noisy': input 'x' is [3] in this row, but example_inputs "
                       "give one row as [1, 3]: example_inputs seem to hold a batch axis"),
    "unexportable model without fallback": (
        lambda: (pipe.input("x")
                 .map("x", "y", ModelOp(Noisy(), torch.zeros(1, 3), name="noisy",
                                        pre=lambda x: x[None], post=lambda y: y[0]))
                 .output("y").with_example(np.zeros(3, np.float32))),
        ExportError, "model operator 'noisy' could not be exported in any of ['onnx'] (onnx: "
                     "output 'output_0' differs from torch by up to"),
}


@pytest.mark.parametrize("case", sorted(BAD_PIPELINES))
def test_bad_pipelines_fail_with_one_clear_error_and_write_nothing(case, tmp_path):
    make, error_type, message = BAD_PIPELINES[case]
    before = _tree(tmp_path)
    with pytest.raises(error_type) as error:
        build_pipeline_model(make(), tmp_path / "out" / "models")
    assert message in str(error.value)
    assert _tree(tmp_path) == before


def test_a_failed_build_leaves_the_previous_repository_untouched(repository, tmp_path):
    root = tmp_path / "models"
    build_pipeline_model(_pipeline(), root)
    before = _tree(root)
    noisy = ModelOp(Noisy(), torch.zeros(1, 4), name="affine", pre=lambda v: np.float32(v)[None],
                    post=lambda y: y[0])
    with pytest.raises(ExportError):
        build_pipeline_model(_pipeline(noisy), root)
    assert _tree(root) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]  # no staging left behind


def test_a_successful_build_replaces_the_previous_repository(tmp_path):
    root = tmp_path / "models"
    build_pipeline_model(_pipeline(), root)
    (root / "stale").mkdir()
    build_pipeline_model(_pipeline(), root, name="renamed")
    assert sorted(p.name for p in root.iterdir()) == ["affine", "renamed"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"parallelism": 0}, "parallelism must be a positive int"),
        ({"format_priority": ["onnx", "tflite"]}, r"unknown formats \['tflite'\]"),
        ({"op_defaults": {"gpus": [0]}}, r"operator 'op_defaults': unknown op_config keys"),
        ({"name": "affine"}, "same name as the pipeline model"),
        ({"name": "a/b"}, "not a valid Triton model name"),
    ],
)
def test_bad_options_are_refused_before_writing(options, message, tmp_path):
    with pytest.raises(PipelineError, match=message):
        build_pipeline_model(_pipeline(), tmp_path / "models", **options)
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_keyword_is_refused_naming_it_before_writing(tmp_path):
    with pytest.raises(BuildError, match="unknown keyword 'tolerance'; did you mean "
                                         "export_tolerance") as refused:
        build_pipeline_model(_pipeline(), tmp_path / "models", tolerance=1e-3)
    assert "format_priority, parallelism, name" in str(refused.value)  # the known ones
    with pytest.raises(BuildError, match="options must be a RepositoryOptions, got tuple"):
        build_pipeline_model(_pipeline(), tmp_path / "models", ("onnx",))
    assert list(tmp_path.iterdir()) == []


def test_options_and_keywords_combine(tmp_path):
    """Keywords are set on ``options``: each keyword's field, the object's for the rest."""
    options = RepositoryOptions(name="combined", parallelism=2, max_batch_size=8)
    result = build_pipeline_model(_pipeline(), tmp_path / "models", options, parallelism=3,
                                  max_request_bytes=1 << 20)
    config = read_config(tmp_path / "models" / "combined")
    (group,) = config.instance_group
    assert result.pipeline_model == "combined" and config.max_batch_size == 8
    assert group.count == 3 and result.max_request_bytes == 1 << 20


def test_an_unfinished_pipeline_is_refused(tmp_path):
    with pytest.raises(BuildError, match=r"unfinished: end it with \.output"):
        build_pipeline_model(pipe.input("x").map("x", "y", abs), tmp_path / "models")


def test_the_pipeline_config_carries_its_signature_for_clients(repository):
    root, result = repository
    config = read_config(root / "pipeline")
    document = json.loads(config.parameters["pipeline_signature"].string_value)
    assert document["inputs"]["name"] == {"dtype": "TYPE_STRING", "dims": [], "kind": "scalar",
                                          "pytype": "str", "ragged": False}
    assert list(document["outputs"]) == list(result.signature.outputs)


_BUILD_IN_A_NEW_PROCESS = """
import hashlib, json, sys
from pathlib import Path
from builder import build_pipeline_model
from tests.support.example_inputs import EXAMPLES
root = Path(sys.argv[1])
for name, (pipeline, _) in sorted(EXAMPLES.items()):
    build_pipeline_model(pipeline, root / name)
print(json.dumps({str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                  for p in sorted(root.rglob("*")) if p.is_file()}))
"""


@pytest.mark.slow
def test_unchanged_pipelines_write_the_same_bytes_in_every_process(tmp_path):
    """Two runs of the builder (string hashes salted differently, as in two CLI calls) write
    byte-identical repositories, so the second image build finds the first image by content.

    cloudpickle's random class tracker IDs and sets of strings in by-value modules once made
    ``pipe.pickle`` differ on every run."""
    files = []
    for seed in ("1", "2"):
        result = subprocess.run(
            [sys.executable, "-c", _BUILD_IN_A_NEW_PROCESS, str(tmp_path / seed)],
            capture_output=True, text=True, cwd=REPO_ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed}, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        files.append(json.loads(result.stdout.splitlines()[-1]))
    assert any(name.endswith("pipe.pickle") for name in files[0])
    assert files[0] == files[1], {k: v for k, v in files[1].items() if files[0].get(k) != v}


def test_cpu_targets_run_onnx_model_operators_in_the_pipeline_model(tmp_path):
    from builder.base import resolve

    cases = {"host": {}, "cpu": {"target": resolve(None)}, "gpu": {"target": resolve("12.4")},
             "off": {"in_process": False}}
    found = {}
    for case, options in cases.items():
        build_pipeline_model(_pipeline(), tmp_path / case, **options)
        parameters = read_config(tmp_path / case / "pipeline").parameters
        found[case] = (json.loads(parameters["in_process_models"].string_value)
                       if "in_process_models" in parameters else None)
        assert (tmp_path / case / "affine" / "1" / "model.onnx").is_file()
    assert found == {"host": {"affine": "affine/1/model.onnx"},
                     "cpu": {"affine": "affine/1/model.onnx"}, "gpu": None, "off": None}


class _Widen(torch.nn.Module):
    """A row of 64 KiB in, 1 MiB out (a ViT-base's hidden states are 0.6 MB a row)."""

    def forward(self, x):
        return x.repeat(1, 16)


def _wide_pipeline(**op_config):
    op = ModelOp(_Widen(), example_inputs=torch.zeros(16384), name="widen", op_config=op_config)
    return (pipe.input("x").map("x", "y", op).output("y")
            .with_example(np.zeros(16384, np.float32)))


def test_a_model_with_large_rows_gets_a_batch_that_fits_a_plain_docker_runs_shared_memory(
        tmp_path):
    """64 rows of 1.06 MiB (in and out) is 68 MiB: more than all of Docker's 64 MiB /dev/shm,
    where the model's warm-up at its max_batch_size failed the start."""
    build_pipeline_model(_wide_pipeline(), tmp_path / "models")
    config = read_config(tmp_path / "models" / "widen")
    assert config.max_batch_size == 8  # 16 MiB / 1.06 MiB a row, halved from 64
    assert max(sample.batch_size for sample in config.model_warmup) == 8
    pipeline = json.loads(read_config(tmp_path / "models" / "pipeline")
                          .parameters["in_process_models"].string_value)
    assert "widen" in pipeline  # the in-process session is planned with the same batch


def test_a_max_batch_size_that_was_asked_for_is_kept_whatever_the_rows(tmp_path):
    build_pipeline_model(_wide_pipeline(max_batch_size=32), tmp_path / "asked")
    assert read_config(tmp_path / "asked" / "widen").max_batch_size == 32
    build_pipeline_model(_wide_pipeline(dynamic_batching={"preferred_batch_size": [16]}),
                         tmp_path / "preferred")
    assert read_config(tmp_path / "preferred" / "widen").max_batch_size == 64
