"""Triton model configurations, built as protobuf and written as ``config.pbtxt``.

Why protobuf: a ``config.pbtxt`` produced with ``tritonclient.grpc.model_config_pb2`` and
``google.protobuf.text_format`` is valid by construction (no typos in field names, enum values
checked) and parses back into an equal message. :class:`ModelConfigSpec` is plain data: the
repository builder fills it from operators and options, and later features add fields or
``parameters`` (an execution environment, ...) without touching the proto code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builder.errors import BuildError
from builder.repository.config_rules import check_config, check_warmup_files
from builder.repository.model_warmup import WarmupSample, add_samples
from builder.repository.queue_policy import QueuePolicy

CONFIG_FILE = "config.pbtxt"


@dataclass(frozen=True)
class TensorConfig:
    """A model input or output: name, Triton dtype (``TYPE_FP32``) and dims without batch.

    ``dims`` are the model's own: ``()`` for a tensor with only the batch axis (one scalar per
    row), which Triton cannot declare; :func:`build_config` serves it as ``dims [1]`` reshaped
    to ``[]``, so clients send ``[batch, 1]`` and the model gets ``[batch]``.
    """

    name: str
    dtype: str
    dims: tuple[int, ...]


@dataclass
class ModelConfigSpec:
    """Everything we put in a model's configuration, as data.

    ``dynamic_batching`` is ``None`` (off) or a mapping with ``preferred_batch_size`` and
    ``max_queue_delay_microseconds`` (an empty mapping turns it on with Triton's defaults).
    ``device_ids`` non-empty makes the instances ``KIND_GPU`` on those GPUs (``instance_count``
    instances on each); ``gpu`` without ``device_ids`` makes one ``KIND_GPU`` group that names no
    GPU, which Triton places on every GPU it sees (``instance_count`` on each); otherwise they
    are ``KIND_CPU``.
    """

    name: str
    inputs: Sequence[TensorConfig]
    outputs: Sequence[TensorConfig]
    max_batch_size: int
    backend: str | None = None
    platform: str | None = None
    instance_count: int = 1
    device_ids: Sequence[int] = ()
    gpu: bool = False
    dynamic_batching: Mapping[str, Any] | None = field(default_factory=dict)
    queue_policy: QueuePolicy | None = None
    """Rejects what waits too long or finds the queue full (needs dynamic batching)."""
    parameters: Mapping[str, str] = field(default_factory=dict)
    decoupled: bool = False
    """Several responses per request (a streaming pipeline): ``model_transaction_policy``."""
    warmup: Sequence[WarmupSample] = ()
    """``model_warmup``: run before the model is ready (:mod:`builder.repository.model_warmup`;
    their files are written beside the config)."""


def build_config(spec: ModelConfigSpec) -> mc.ModelConfig:
    """The ``ModelConfig`` message for ``spec``."""
    if (spec.backend is None) == (spec.platform is None):
        raise BuildError(f"model {spec.name!r}: give exactly one of backend and platform")
    config = mc.ModelConfig(name=spec.name, max_batch_size=spec.max_batch_size)
    if spec.backend:
        config.backend = spec.backend
    else:
        config.platform = spec.platform
    for tensors, target in ((spec.inputs, config.input), (spec.outputs, config.output)):
        for tensor in tensors:
            added = target.add(name=tensor.name, data_type=mc.DataType.Value(tensor.dtype),
                               dims=list(tensor.dims) or [1])
            if not tensor.dims:
                added.reshape.SetInParent()
    group = config.instance_group.add(count=spec.instance_count)
    if spec.device_ids or spec.gpu:
        group.kind = mc.ModelInstanceGroup.KIND_GPU
        group.gpus.extend(spec.device_ids)
    else:
        group.kind = mc.ModelInstanceGroup.KIND_CPU
    if spec.dynamic_batching is not None and spec.max_batch_size > 0:
        batching = config.dynamic_batching
        batching.SetInParent()
        batching.preferred_batch_size.extend(
            spec.dynamic_batching.get("preferred_batch_size", ())
        )
        delay = spec.dynamic_batching.get("max_queue_delay_microseconds")
        if delay is not None:
            batching.max_queue_delay_microseconds = int(delay)
    if spec.queue_policy is not None:
        if spec.dynamic_batching is None or spec.max_batch_size <= 0:
            raise BuildError(f"model {spec.name!r}: a latency budget or queue bound needs "
                             f"dynamic batching, which this model has off")
        policy = config.dynamic_batching.default_queue_policy
        policy.timeout_action = mc.ModelQueuePolicy.REJECT
        policy.allow_timeout_override = False
        if spec.queue_policy.timeout_us is not None:
            policy.default_timeout_microseconds = spec.queue_policy.timeout_us
        if spec.queue_policy.max_queue_size is not None:
            policy.max_queue_size = spec.queue_policy.max_queue_size
    for key, value in spec.parameters.items():
        config.parameters[key].string_value = str(value)
    if spec.decoupled:
        config.model_transaction_policy.decoupled = True
    add_samples(config, spec.warmup)
    return config


def dumps_config(config: mc.ModelConfig, directory_name: str | None = None) -> str:
    """``config`` as ``config.pbtxt`` text, once it passes Triton's rules
    (:mod:`builder.repository.config_rules`; ``directory_name``: where it goes)."""
    check_config(config, directory_name)
    return text_format.MessageToString(config)


def loads_config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def write_config(config: mc.ModelConfig, model_directory: Path) -> Path:
    """Write ``<model_directory>/config.pbtxt``; refused where Triton would refuse it (its
    warm-up files, written before it, included)."""
    path = Path(model_directory) / CONFIG_FILE
    text = dumps_config(config, Path(model_directory).name)
    check_warmup_files(config, Path(model_directory))
    path.write_text(text)
    return path


def read_config(model_directory: Path) -> mc.ModelConfig:
    """Parse ``<model_directory>/config.pbtxt``."""
    return loads_config((Path(model_directory) / CONFIG_FILE).read_text())


def tensors(config: mc.ModelConfig, which: str) -> list[TensorConfig]:
    """The inputs (``which="input"``) or outputs of a config, as :class:`TensorConfig`: the
    model's own dims (``reshape`` where given)."""
    return [
        TensorConfig(t.name, mc.DataType.Name(t.data_type),
                     tuple(t.reshape.shape if t.HasField("reshape") else t.dims))
        for t in getattr(config, which)
    ]
