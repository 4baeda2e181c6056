"""A small model repository for the test bed: one python model and one ONNX model from torch.

Configs are built with Triton's own protobuf classes, like the builder's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tests.support.paths import MODELS

FEATURES, CLASSES = 4, 3


def linear_module() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, CLASSES).eval()


def expected_scale(x: np.ndarray) -> np.ndarray:
    return (2 * x + 1).astype(np.float32)


def expected_linear(x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return linear_module()(torch.from_numpy(x)).numpy()


def write_sample_repository(root: Path) -> Path:
    """Write ``scale`` (python) and ``linear`` (ONNX, dynamically batched) under ``root``."""
    scale = root / "scale"
    (scale / "1").mkdir(parents=True)
    shutil.copy(MODELS / "scale.py", scale / "1" / "model.py")
    _write_config(scale, mc.ModelConfig(
        name="scale", backend="python", max_batch_size=8,
        input=[_tensor("X", mc.TYPE_FP32, [FEATURES])],
        output=[_tensor("Y", mc.TYPE_FP32, [FEATURES])],
    ))

    linear = root / "linear"
    (linear / "1").mkdir(parents=True)
    torch.onnx.export(
        linear_module(), (torch.zeros(1, FEATURES),), str(linear / "1" / "model.onnx"),
        input_names=["INPUT"], output_names=["OUTPUT"],
        dynamic_axes={"INPUT": {0: "batch"}, "OUTPUT": {0: "batch"}}, dynamo=False,
    )
    _write_config(linear, mc.ModelConfig(
        name="linear", platform="onnxruntime_onnx", max_batch_size=64,
        input=[_tensor("INPUT", mc.TYPE_FP32, [FEATURES])],
        output=[_tensor("OUTPUT", mc.TYPE_FP32, [CLASSES])],
        dynamic_batching=mc.ModelDynamicBatching(max_queue_delay_microseconds=200_000),
        instance_group=[mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)],
    ))
    return root


def _tensor(name: str, dtype: int, dims: list[int]):
    cls = mc.ModelInput if name in ("X", "INPUT") else mc.ModelOutput
    return cls(name=name, data_type=dtype, dims=dims)


def _write_config(model_dir: Path, config: mc.ModelConfig) -> None:
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
