"""``model_warmup``: each model operator's model is warmed by Triton on its own examples, at the
batch sizes its batcher forms, before the server says it is ready (issue 66)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from tritonclient.grpc import model_config_pb2 as mc

from builder import ModelOp, build_pipeline_model, pipe
from builder.base.releases import resolve
from builder.repository.config_rules import ConfigRuleError, check_config
from builder.repository.model_config import (
    ModelConfigSpec,
    TensorConfig,
    build_config,
    read_config,
    write_config,
)
from builder.repository.model_warmup import (
    WarmupInput,
    WarmupSample,
    batch_sizes,
    encode_row,
    operator_samples,
    write_samples,
)
from tests.support.tiny_models import Affine, affine_op


@pytest.mark.parametrize("max_batch_size, batching, sizes", [
    (64, {}, [1, 64]),                                  # Triton's batcher: up to the maximum
    (64, {"max_queue_delay_microseconds": 0}, [1, 64]),
    (16, {"preferred_batch_size": [4, 8]}, [1, 4, 8]),  # the batches it is told to form
    (8, {"preferred_batch_size": [1]}, [1]),
    (64, None, [1]),                                    # no batcher: requests as they come
    (0, {}, [1]),                                       # a model that takes one row
])
def test_a_model_is_warmed_at_the_batch_sizes_its_batcher_forms(max_batch_size, batching,
                                                                 sizes):
    assert batch_sizes(max_batch_size, batching) == sizes


def test_rows_are_encoded_as_triton_reads_a_warm_up_file():
    assert encode_row(np.array([1.5, -2.0], dtype=np.float64), "TYPE_FP32") == struct.pack(
        "<2f", 1.5, -2.0)
    assert encode_row(np.array([7, 8]), "TYPE_INT64") == struct.pack("<2q", 7, 8)
    assert encode_row(np.array(["hé", b"\x00b"], dtype=object), "TYPE_STRING") == (
        struct.pack("<I", 3) + "hé".encode() + struct.pack("<I", 2) + b"\x00b")


def test_an_operator_sample_is_its_first_example_row_with_every_size_given():
    tensors = [TensorConfig("x", "TYPE_FP32", (-1, 3)), TensorConfig("k", "TYPE_INT64", ())]
    examples = [np.arange(12, dtype=np.float32).reshape(2, 2, 3), np.array([5, 6])]
    samples = operator_samples("m", tensors, examples, 8, {"preferred_batch_size": [4]})
    assert [(s.name, s.batch_size) for s in samples] == [("batch_1", 1), ("batch_4", 4)]
    x, k = samples[1].inputs
    assert (x.name, x.dims, x.data) == ("x", (2, 3), examples[0][0].tobytes())
    assert (k.name, k.dims, k.data) == ("k", (1,), struct.pack("<q", 5)), \
        "a per-row scalar is served as dims [1]"
    assert [[i.file for i in s.inputs] for s in samples] == [["input0", "input1"]] * 2, \
        "every batch size reads the row's one file per input"


def _spec(**changes) -> ModelConfigSpec:
    sample = WarmupSample("batch_2", 2, (WarmupInput("x", "TYPE_FP32", (3,), "x.bin",
                                                     bytes(12)),))
    fields = dict(name="m", inputs=[TensorConfig("x", "TYPE_FP32", (-1,))],
                  outputs=[TensorConfig("y", "TYPE_FP32", (1,))], max_batch_size=4,
                  backend="onnxruntime", warmup=[sample])
    fields.update(changes)
    return ModelConfigSpec(**fields)


def test_a_warm_up_sample_reaches_the_config_and_its_file_the_warmup_directory(tmp_path):
    spec = _spec()
    config = build_config(spec)
    (warmup,) = config.model_warmup
    assert (warmup.name, warmup.batch_size, warmup.count) == ("batch_2", 2, 1)
    given = warmup.inputs["x"]
    assert (mc.DataType.Name(given.data_type), list(given.dims), given.input_data_file) == (
        "TYPE_FP32", [3], "x.bin")
    with pytest.raises(ConfigRuleError, match="x.bin, which does not exist"):
        write_config(config, tmp_path / "m")
    write_samples(tmp_path / "m", spec.warmup)
    write_config(config, tmp_path / "m")
    assert (tmp_path / "m" / "warmup" / "x.bin").read_bytes() == bytes(12)


@pytest.mark.parametrize("sample, rule", [
    (WarmupSample("s", 5, (WarmupInput("x", "TYPE_FP32", (3,), "f", b""),)), "batch size 5"),
    (WarmupSample("s", 1, (WarmupInput("x", "TYPE_FP32", (-1,), "f", b""),)),
     "every size given"),
    (WarmupSample("s", 1, (WarmupInput("x", "TYPE_FP32", (3, 1), "f", b""),)),
     "every size given"),
    (WarmupSample("s", 1, (WarmupInput("x", "TYPE_INT32", (3,), "f", b""),)), "is TYPE_INT32"),
    (WarmupSample("s", 1, (WarmupInput("z", "TYPE_FP32", (3,), "f", b""),)),
     r"gives inputs \['z'\]"),
    (WarmupSample("s", 1, ()), r"gives inputs \[\]"),
])
def test_triton_s_warm_up_rules_are_checked_before_the_config_is_written(sample, rule):
    with pytest.raises(ConfigRuleError, match=rule):
        check_config(build_config(_spec(warmup=[sample])))


def test_a_warm_up_file_shorter_than_its_row_is_refused(tmp_path):
    spec = _spec()
    write_samples(tmp_path / "m", [WarmupSample("batch_2", 2, (WarmupInput(
        "x", "TYPE_FP32", (3,), "x.bin", bytes(8)),))])
    with pytest.raises(ConfigRuleError, match="needs 12 bytes, and x.bin has 8"):
        write_config(build_config(spec), tmp_path / "m")


def _warmed(config: mc.ModelConfig, root, model: str) -> list[tuple]:
    return [(w.name, w.batch_size, {name: (list(i.dims), (root / model / "warmup" /
                                                       i.input_data_file).read_bytes())
                                    for name, i in w.inputs.items()})
            for w in config.model_warmup]


def test_every_model_operator_s_model_is_warmed_on_its_examples(tmp_path):
    op = affine_op(example_inputs=torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    pipeline = (pipe.input("v").map("v", "y", op).output("y")
                .with_example([1.0, 2.0, 3.0, 4.0]))
    root = tmp_path / "models"
    build_pipeline_model(pipeline, root)
    config = read_config(root / "affine")
    row = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32).tobytes()
    (input_name,) = [t.name for t in config.input]
    assert _warmed(config, root, "affine") == [
        ("batch_1", 1, {input_name: ([4], row)}), ("batch_64", 64, {input_name: ([4], row)})]
    pipeline_config = read_config(root / "pipeline")
    assert _warmed(pipeline_config, root, "pipeline") == [
        ("example_0", 1, {"v": ([4], np.array([1.0, 2.0, 3.0, 4.0]).tobytes())})], \
        "the pipeline model's samples are its examples, as a client sends them"


def test_string_examples_are_written_as_triton_reads_strings(tmp_path):
    pipeline = (pipe.input("text").map("text", "n", len).output("n")
                .with_example("héllo").with_example(""))
    build_pipeline_model(pipeline, tmp_path / "models")
    config = read_config(tmp_path / "models" / "pipeline")
    assert _warmed(config, tmp_path / "models", "pipeline") == [
        ("example_0", 1, {"text": ([1], struct.pack("<I", 6) + "héllo".encode())}),
        ("example_1", 1, {"text": ([1], struct.pack("<I", 0))})]


def test_a_streaming_pipeline_has_no_warm_up_samples(tmp_path):
    """Its samples would stream through the decoupled model's senders; it warms up in
    initialize only."""
    def count(text):
        yield from range(len(text))

    streamed = pipe.input("text").stream("text", "i", count).output("i").with_example("ab")
    assert streamed.streaming is not None
    build_pipeline_model(streamed, tmp_path / "models")
    assert not read_config(tmp_path / "models" / "pipeline").model_warmup


def test_a_gpu_release_s_model_configs_carry_model_warmup(tmp_path):
    """What a GPU image's model operators are configured with (served on a GPU in the gpu
    tier): the samples at Triton's batcher defaults there."""
    release = resolve("12.4", python_version="3.11")
    assert release.gpu
    op = ModelOp(Affine(), example_inputs=torch.ones(1, 4), name="affine",
                 pre=lambda v: np.asarray(v, dtype=np.float32)[None], post=lambda y: y[0],
                 op_config={"max_batch_size": 16})
    pipeline = pipe.input("v").map("v", "y", op).output("y").with_example([0.5] * 4)
    root = tmp_path / "models"
    build_pipeline_model(pipeline, root, target=release)
    config = read_config(root / "affine")
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    ones = np.ones(4, dtype=np.float32).tobytes()
    (input_name,) = [t.name for t in config.input]
    assert _warmed(config, root, "affine") == [
        ("batch_1", 1, {input_name: ([4], ones)}), ("batch_16", 16, {input_name: ([4], ones)})]
