"""Model configurations as protobuf: what each ``ModelConfigSpec`` field becomes."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builder.errors import BuildError
from builder.repository.config_rules import ConfigRuleError
from builder.repository.model_config import (
    ModelConfigSpec,
    TensorConfig,
    build_config,
    read_config,
    tensors,
    write_config,
)

SPEC = ModelConfigSpec(
    name="encoder",
    inputs=[TensorConfig("ids", "TYPE_INT64", (16,)), TensorConfig("text", "TYPE_STRING", (1,))],
    outputs=[TensorConfig("hidden", "TYPE_FP32", (16, 32))],
    max_batch_size=8,
    platform="onnxruntime_onnx",
)


def test_a_spec_becomes_the_expected_config_text():
    assert text_format.MessageToString(build_config(SPEC)) == (
        'name: "encoder"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input {\n  name: "ids"\n  data_type: TYPE_INT64\n  dims: 16\n}\n'
        'input {\n  name: "text"\n  data_type: TYPE_STRING\n  dims: 1\n}\n'
        'output {\n  name: "hidden"\n  data_type: TYPE_FP32\n  dims: 16\n  dims: 32\n}\n'
        'instance_group {\n  count: 1\n  kind: KIND_CPU\n}\ndynamic_batching {\n}\n'
    )


def test_gpus_batching_and_parameters():
    spec = ModelConfigSpec(**{**SPEC.__dict__, "device_ids": [1, 3], "instance_count": 2,
                              "dynamic_batching": {"preferred_batch_size": [2, 4],
                                                   "max_queue_delay_microseconds": 100},
                              "parameters": {"EXECUTION_ENV_PATH": "$$TRITON_MODEL_DIRECTORY/e"}})
    config = build_config(spec)
    (group,) = config.instance_group
    assert (group.kind, group.count, list(group.gpus)) == (mc.ModelInstanceGroup.KIND_GPU, 2,
                                                           [1, 3])
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 4]
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert config.parameters["EXECUTION_ENV_PATH"].string_value == "$$TRITON_MODEL_DIRECTORY/e"


def test_dynamic_batching_off():
    config = build_config(ModelConfigSpec(**{**SPEC.__dict__, "dynamic_batching": None}))
    assert not config.HasField("dynamic_batching")


def test_written_configs_read_back_equal(tmp_path):
    config = build_config(SPEC)
    (tmp_path / "encoder").mkdir()
    write_config(config, tmp_path / "encoder")
    assert read_config(tmp_path / "encoder") == config
    assert tensors(config, "input") == list(SPEC.inputs)


def test_a_tensor_with_only_the_batch_axis_is_served_reshaped():
    """Triton refuses empty dims; a per-row scalar travels as [batch, 1], the model sees
    [batch]."""
    spec = ModelConfigSpec(**{**SPEC.__dict__, "inputs": [TensorConfig("x", "TYPE_FP32", ())],
                              "outputs": [TensorConfig("y", "TYPE_FP32", ())]})
    config = build_config(spec)
    assert text_format.MessageToString(config.input[0]) == (
        'name: "x"\ndata_type: TYPE_FP32\ndims: 1\nreshape {\n}\n')
    assert tensors(config, "input") == list(spec.inputs)
    assert tensors(config, "output") == list(spec.outputs)


def test_a_config_triton_would_refuse_is_not_written(tmp_path):
    config = build_config(SPEC)
    del config.input[0].dims[:]
    with pytest.raises(ConfigRuleError, match="model 'encoder': model input 'ids' must specify "
                                              "'dims'"):
        write_config(config, tmp_path / "encoder")
    with pytest.raises(ConfigRuleError, match="is written to directory 'other'"):
        write_config(build_config(SPEC), tmp_path / "other")
    assert not list(tmp_path.rglob("config.pbtxt"))


def test_backend_or_platform_not_both():
    with pytest.raises(ValueError, match="exactly one of backend and platform"):
        build_config(ModelConfigSpec(**{**SPEC.__dict__, "backend": "python"}))


def test_a_queue_policy_needs_dynamic_batching():
    from builder.repository.queue_policy import QueuePolicy

    spec = ModelConfigSpec(name="m", inputs=[TensorConfig("x", "TYPE_FP32", (4,))],
                           outputs=[TensorConfig("y", "TYPE_FP32", (4,))], max_batch_size=8,
                           backend="python", dynamic_batching=None,
                           queue_policy=QueuePolicy(timeout_us=1000))
    with pytest.raises(BuildError, match="'m': a latency budget or queue bound needs dynamic"):
        build_config(spec)
