"""``model_warmup``: the samples Triton runs through a model before it says the model is ready.

Why: a model's first requests are slow (ONNX Runtime plans and allocates on a session's first
run, libtorch compiles its graph, a GPU loads its kernels), and behind a load balancer the first
users of every new replica pay it. Triton runs each configured sample through the model's
instances while it loads the model and marks it ready only after they have answered
(``TritonModelInstance::WarmUp``, ``src/backend_model_instance.cc`` of core r24.10).

The samples are the operator's own examples (``example_inputs`` as the module takes them), one
row of them, at the batch sizes the dynamic batcher forms (:func:`batch_sizes`): Triton sends a
sample of batch size *n* as *n* requests of that row in one execution, as a batch of *n* rows
reaches the model. Their data travels in files under ``<model>/warmup/``, in Triton's layout:
the elements in row-major order, a ``TYPE_STRING`` element as its 4-byte little-endian length
and then its bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from builder.errors import BuildError
from builder.pipeline.signature import numpy_dtype
from builder.repository.config_rules import WARMUP_DIRECTORY


@dataclass(frozen=True)
class WarmupInput:
    """One input of a sample: its Triton type, the dims of one row (every size given), and the
    row's bytes as Triton reads them from ``file``."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    file: str
    data: bytes


@dataclass(frozen=True)
class WarmupSample:
    """One ``model_warmup`` entry: the same row, ``batch_size`` times, in one execution."""

    name: str
    batch_size: int
    inputs: tuple[WarmupInput, ...]


def batch_sizes(max_batch_size: int, dynamic_batching: Mapping[str, Any] | None) -> list[int]:
    """The batch sizes a model is warmed at: 1 (a request alone), and the batches the dynamic
    batcher forms under load: its preferred sizes, else ``max_batch_size``. Without a batcher
    (or ``max_batch_size`` 0) requests reach the model as they come: one, of one row."""
    if max_batch_size <= 0 or dynamic_batching is None:
        return [1]
    preferred = [int(size) for size in dynamic_batching.get("preferred_batch_size", ())
                 if 0 < int(size) <= max_batch_size]
    return sorted({1, *(preferred or [max_batch_size])})


def operator_samples(model: str, tensors: Sequence[Any], examples: Sequence[Any],
                     max_batch_size: int,
                     dynamic_batching: Mapping[str, Any] | None) -> list[WarmupSample]:
    """The samples of a model operator's model from its module examples (one array per input,
    in ``tensors`` order, with the batch axis where the model batches): the first row, at each
    of :func:`batch_sizes`, every sample reading the row's one file per input. ``tensors`` are
    the config's inputs (:class:`TensorConfig`)."""
    if len(examples) != len(tensors):
        raise BuildError(f"model {model!r}: {len(examples)} example inputs for "
                         f"{len(tensors)} model inputs")
    inputs = []
    for index, (tensor, example) in enumerate(zip(tensors, examples, strict=True)):
        array = np.asarray(example)
        row = array[0] if max_batch_size > 0 else array
        if not tensor.dims:  # a per-row scalar: served as dims [1], reshaped to []
            row = np.reshape(row, (1,))
        inputs.append(WarmupInput(tensor.name, tensor.dtype, tuple(int(d) for d in row.shape),
                                  f"input{index}", encode_row(row, tensor.dtype)))
    return [WarmupSample(f"batch_{size}", size, tuple(inputs))
            for size in batch_sizes(max_batch_size, dynamic_batching)]


def pipeline_samples(signature: Any, examples: Sequence[tuple]) -> list[WarmupSample]:
    """The pipeline model's samples: each example a request of one call, encoded as a client
    encodes it (its inputs' ``encode_call``), so that Triton runs it through the model's
    ``execute`` as it will run requests: the stub's first request, its decoding and encoding
    (measured: the first request after ready 20 ms, the next ones 1.2 ms, without them)."""
    samples = []
    for index, example in enumerate(examples):
        inputs = []
        for position, (name, spec) in enumerate(signature.inputs.items()):
            row = spec.encode_call(example[position])
            inputs.append(WarmupInput(name, spec.dtype, tuple(int(d) for d in row.shape),
                                      f"example_{index}_input{position}",
                                      encode_row(row, spec.dtype)))
        samples.append(WarmupSample(f"example_{index}", 1, tuple(inputs)))
    return samples


def encode_row(row: np.ndarray, dtype: str) -> bytes:
    """One row's elements as Triton reads a warm-up file: row-major, ``TYPE_STRING`` elements
    each as a 4-byte little-endian length and its bytes."""
    if dtype == "TYPE_STRING":
        parts = []
        for element in np.asarray(row, dtype=object).reshape(-1):
            value = element.encode() if isinstance(element, str) else bytes(element)
            parts.append(struct.pack("<I", len(value)) + value)
        return b"".join(parts)
    wanted = numpy_dtype(dtype).newbyteorder("<")
    return np.ascontiguousarray(row, dtype=wanted).tobytes()


def add_samples(config: mc.ModelConfig, samples: Sequence[WarmupSample]) -> None:
    """The samples as ``config``'s ``model_warmup`` entries (each run once: ``count`` 1)."""
    for sample in samples:
        entry = config.model_warmup.add(name=sample.name, batch_size=sample.batch_size, count=1)
        for warmup_input in sample.inputs:
            entry.inputs[warmup_input.name].CopyFrom(mc.ModelWarmup.Input(
                data_type=mc.DataType.Value(warmup_input.dtype), dims=list(warmup_input.dims),
                input_data_file=warmup_input.file))


def write_samples(model_directory: Path, samples: Sequence[WarmupSample]) -> None:
    """Each sample's input files under ``<model_directory>/warmup/``, each file once (samples
    of one row at several batch sizes share theirs)."""
    files = {i.file: i.data for sample in samples for i in sample.inputs}
    if not files:
        return
    directory = Path(model_directory) / WARMUP_DIRECTORY
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
