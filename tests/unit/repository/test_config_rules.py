"""Triton's own rules for a configuration, each checked on a config that breaks it.

Every rule is one Triton 2.51's core applies when it loads a model (``model_config_utils.cc``
of core r24.10); ``tests/e2e/test_generated_pipelines.py`` has the real server load what
passes them.
"""

from __future__ import annotations

import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builder.repository.config_rules import ConfigRuleError, check_config, check_onnx_model

VALID = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [4] }
input { name: "s" data_type: TYPE_FP32 dims: [1] reshape { shape: [] } }
output { name: "y" data_type: TYPE_FP32 dims: [2, -1] reshape { shape: [2, -1] } }
instance_group { count: 1 kind: KIND_CPU }
dynamic_batching { preferred_batch_size: [4, 8] }
"""


def _config(text: str = VALID) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def _broken(change) -> mc.ModelConfig:
    config = _config()
    change(config)
    return config


def test_a_valid_config_passes():
    check_config(_config(), "m")


BROKEN = {
    "no name": (lambda c: c.ClearField("name"), "must specify 'name'"),
    "directory": (None, "is written to directory 'n'"),
    "no platform or backend": (lambda c: c.ClearField("platform"),
                               "must specify 'platform' or 'backend'"),
    "unknown platform": (lambda c: setattr(c, "platform", "onnx"),
                         "unexpected platform type 'onnx'"),
    "platform and backend disagree": (lambda c: setattr(c, "backend", "python"),
                                      "unexpected 'platform' and 'backend' pair"),
    "negative max_batch_size": (lambda c: setattr(c, "max_batch_size", -1),
                                "'max_batch_size' is -1"),
    "preferred size over max": (lambda c: c.dynamic_batching.preferred_batch_size.append(9),
                                "preferred size 9 must be positive and <= max_batch_size 8"),
    "CPU group with GPUs": (lambda c: c.instance_group[0].gpus.append(0),
                            "has kind KIND_CPU but specifies GPUs [0]"),
    "no dims": (lambda c: c.input[0].ClearField("dims"), "model input 'x' must specify 'dims'"),
    "no data type": (lambda c: setattr(c.output[0], "data_type", mc.TYPE_INVALID),
                     "model output 'y' must specify 'data_type'"),
    "zero dim": (lambda c: c.input[0].dims.append(0), "each dimension must be an integer >= 1"),
    "empty reshape without batching": (lambda c: (setattr(c, "max_batch_size", 0),
                                                  c.ClearField("dynamic_batching")),
                                       "cannot have empty reshape for non-batching model"),
    "reshape size": (lambda c: c.input[0].reshape.shape.extend([3]),
                     "different size for dims [4] and reshape [3]"),
    "zero in reshape": (lambda c: c.input[0].reshape.shape.extend([0]),
                        "reshape dimensions must be integers >= 1"),
    "variable-size trunks": (lambda c: c.output[0].reshape.shape.__setitem__(0, 1),
                             "differ in their variable-size dimensions"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_rule_refuses_a_config_that_breaks_it(case):
    change, message = BROKEN[case]
    config = _config() if change is None else _broken(change)
    with pytest.raises(ConfigRuleError, match="Triton would refuse to load it") as error:
        check_config(config, "n" if change is None else config.name)
    assert message in str(error.value)


def test_an_onnx_model_must_match_its_config_as_the_onnxruntime_backend_checks(tmp_path):
    class Scale(torch.nn.Module):
        def forward(self, x):
            return x * 2

    path = tmp_path / "model.onnx"
    torch.onnx.export(Scale(), (torch.zeros(1),), str(path), input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "b"}, "y": {0: "b"}},
                      dynamo=False)
    scalar = _config("""name: "m" platform: "onnxruntime_onnx" max_batch_size: 4
        input { name: "x" data_type: TYPE_FP32 dims: [1] reshape { shape: [] } }
        output { name: "y" data_type: TYPE_FP32 dims: [1] reshape { shape: [] } }
        instance_group { kind: KIND_CPU }""")
    check_onnx_model(scalar, path)
    unreshaped = _config(text_format.MessageToString(scalar))
    unreshaped.input[0].ClearField("reshape")
    with pytest.raises(ConfigRuleError, match=r"model input 'x' is \[-1\] in the ONNX graph; "
                                              r"the configuration says \[-1, 1\]"):
        check_onnx_model(unreshaped, path)
    retyped = _config(text_format.MessageToString(scalar))
    retyped.output[0].data_type = mc.TYPE_INT64
    with pytest.raises(ConfigRuleError, match="model output 'y' is float32 in the ONNX graph"):
        check_onnx_model(retyped, path)
