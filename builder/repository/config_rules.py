"""Triton's own rules for a model configuration, checked before a ``config.pbtxt`` is written.

Why: Triton reads a configuration only when it loads the model, which for an image build is the
last step, after every layer is built (issue 33: a model operator's inputs had no ``dims``, and
``image`` failed at verification). Each rule here is one that Triton's core applies when it
loads a model, read from ``src/model_config_utils.cc`` of core r24.10 (Triton 2.51, the CPU
base's server): ``ValidateModelConfig``, ``ValidateInstanceGroup`` and ``ValidateIOShape``, and
from ``model_repository_manager.cc`` that a model's directory is named after it, and from
``backend_model_instance.cc`` what a ``model_warmup`` sample must give. Rules that
depend on the machine (which GPUs exist) are left to the server. :func:`check_onnx_model` adds
the onnxruntime backend's: the graph's tensors take ``[-1] + dims`` (``reshape`` where given),
of the configured type.

A failure names the model, the tensor and the rule, as Triton would, then what it means.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

from tritonclient.grpc import model_config_pb2 as mc

from builder.errors import BuildError
from builder.pipeline.signature import numpy_dtype, triton_dtype

WILDCARD_DIM = -1
WARMUP_DIRECTORY = "warmup"
"""Where Triton reads a warm-up sample's ``input_data_file`` (core's ``kWarmupDataFolder``)."""
PLATFORM_BACKENDS = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
}
"""The platforms whose backend Triton fills in itself (``AutoCompleteBackendFields``)."""
ENSEMBLE_PLATFORM = "ensemble"
"""The platform Triton's core serves itself, without a backend (``ensemble_scheduling``)."""


class ConfigRuleError(BuildError):
    """A model configuration breaks a rule Triton checks when it loads the model."""


def check_config(config: mc.ModelConfig, directory_name: str | None = None) -> None:
    """Raise :class:`ConfigRuleError` where Triton would refuse ``config`` at load time.

    ``directory_name`` is the model directory the configuration is written to.
    """
    name = config.name
    if not name:
        _refuse("?", "model configuration must specify 'name'")
    if directory_name is not None and directory_name != name:
        _refuse(name, f"is written to directory {directory_name!r}; Triton needs the "
                      "directory name to equal the model name")
    _check_platform(config)
    if config.max_batch_size < 0:
        _refuse(name, f"'max_batch_size' is {config.max_batch_size}; it must be non-negative")
    if config.HasField("dynamic_batching"):
        for size in config.dynamic_batching.preferred_batch_size:
            if size <= 0 or size > config.max_batch_size:
                _refuse(name, f"dynamic batching preferred size {size} must be positive and "
                              f"<= max_batch_size {config.max_batch_size}")
    _check_instance_groups(config)
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            _check_tensor(name, kind, tensor, config.max_batch_size)
    for sample in config.model_warmup:
        _check_warmup(config, sample)


def check_warmup_files(config: mc.ModelConfig, model_directory: Path) -> None:
    """Each warm-up input's file is under ``<model_directory>/warmup/`` and holds the row
    Triton reads (``GenerateWarmupData``: at least the row's bytes; a string's are its own)."""
    for sample in config.model_warmup:
        for input_name, given in sample.inputs.items():
            if not given.input_data_file:
                continue
            path = Path(model_directory) / WARMUP_DIRECTORY / given.input_data_file
            if not path.is_file():
                _refuse(config.name, f"warm-up sample {sample.name!r} input {input_name!r} "
                                     f"reads {path}, which does not exist")
            if given.data_type == mc.TYPE_STRING:
                continue
            wanted = _element_count(given.dims) * numpy_dtype(
                mc.DataType.Name(given.data_type)).itemsize
            if path.stat().st_size < wanted:
                _refuse(config.name, f"warm-up sample {sample.name!r} input {input_name!r} "
                                     f"needs {wanted} bytes, and {path.name} has "
                                     f"{path.stat().st_size}")


def _check_warmup(config: mc.ModelConfig, sample: Any) -> None:
    """A sample names every input of the model, each with its type and every size given (no
    ``-1``: Triton cannot make a request of a varying shape), where the input's fixed sizes are;
    its batch size fits the model's."""
    where = f"warm-up sample {sample.name!r}"
    if sample.batch_size < 1 or sample.batch_size > max(1, config.max_batch_size):
        _refuse(config.name, f"{where} has batch size {sample.batch_size}; it must be >= 1 and "
                             f"<= max_batch_size {config.max_batch_size} (1 for a model that "
                             "does not batch)")
    inputs = {tensor.name: tensor for tensor in config.input}
    if set(sample.inputs) != set(inputs):
        _refuse(config.name, f"{where} gives inputs {sorted(sample.inputs)}; the model takes "
                             f"{sorted(inputs)}")
    for input_name, given in sample.inputs.items():
        tensor = inputs[input_name]
        if given.WhichOneof("input_data_type") is None:
            _refuse(config.name, f"{where} input {input_name!r} must set zero_data, "
                                 "random_data or input_data_file")
        if given.data_type != tensor.data_type:
            _refuse(config.name, f"{where} input {input_name!r} is "
                                 f"{mc.DataType.Name(given.data_type)}; the model takes "
                                 f"{mc.DataType.Name(tensor.data_type)}")
        dims = list(given.dims)
        declared = list(tensor.dims)
        if any(d < 1 for d in dims) or len(dims) != len(declared) or any(
                d != WILDCARD_DIM and d != g for d, g in zip(declared, dims)):
            _refuse(config.name, f"{where} input {input_name!r} has dims {dims}; the model "
                                 f"takes {declared}, every size given")


def check_onnx_model(config: mc.ModelConfig, path: Path) -> None:
    """The onnxruntime backend's rule: each configured tensor is a graph tensor of that type
    whose shape is ``[-1] + dims`` (``reshape`` in place of ``dims`` where given) for a
    batching model, ``dims`` for one that does not batch."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    graph = {value.name: value for value in (*model.graph.input, *model.graph.output)
             if value.name not in initializers}
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            value = graph.get(tensor.name)
            where = f"model {kind} {tensor.name!r}"
            if value is None:
                _refuse(config.name, f"{where} is not in the ONNX graph "
                                     f"(it has {sorted(graph)})")
            kind_type = value.type.tensor_type
            shape = [d.dim_value if d.HasField("dim_value") else WILDCARD_DIM
                     for d in kind_type.shape.dim]
            dims = list(tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims)
            wanted = [WILDCARD_DIM, *dims] if config.max_batch_size > 0 else dims
            if len(shape) != len(wanted) or any(
                w != WILDCARD_DIM and s != WILDCARD_DIM and s != w
                for s, w in zip(shape, wanted)
            ) or (config.max_batch_size > 0 and shape[0] != WILDCARD_DIM):
                _refuse(config.name, f"{where} is {shape} in the ONNX graph; the configuration "
                                     f"says {wanted} (-1: the batch axis and varying axes)")
            dtype = onnx.helper.tensor_dtype_to_np_dtype(kind_type.elem_type)
            if triton_dtype(dtype) != mc.DataType.Name(tensor.data_type):
                _refuse(config.name, f"{where} is {dtype} in the ONNX graph; the configuration "
                                     f"says {mc.DataType.Name(tensor.data_type)}")


def _check_platform(config: mc.ModelConfig) -> None:
    if not config.platform and not config.backend:
        _refuse(config.name, "must specify 'platform' or 'backend'")
    if not config.backend and config.platform not in (*PLATFORM_BACKENDS, ENSEMBLE_PLATFORM):
        _refuse(config.name, f"unexpected platform type {config.platform!r} without a "
                             f"backend; known: {sorted(PLATFORM_BACKENDS)}")
    filled = PLATFORM_BACKENDS.get(config.platform)
    if config.backend and config.platform and filled not in (None, config.backend):
        _refuse(config.name, f"unexpected 'platform' and 'backend' pair, got: "
                             f"{config.platform}, {config.backend}")


def _check_instance_groups(config: mc.ModelConfig) -> None:
    """Groups as Triton checks them after filling in its own default group where none is
    given."""
    for group in config.instance_group:
        kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
        if group.kind in (mc.ModelInstanceGroup.KIND_CPU, mc.ModelInstanceGroup.KIND_MODEL) \
                and group.gpus:
            _refuse(config.name, f"instance group {group.name!r} has kind {kind} but "
                                 f"specifies GPUs {list(group.gpus)}")
        if group.count < 0:
            _refuse(config.name, f"instance group {group.name!r} has count {group.count}")


def _check_tensor(model: str, kind: str, tensor: Any, max_batch_size: int) -> None:
    """``ValidateIOShape``, rule by rule."""
    if not tensor.name:
        _refuse(model, f"model {kind} must specify 'name'")
    where = f"model {kind} {tensor.name!r}"
    if tensor.data_type == mc.TYPE_INVALID:
        _refuse(model, f"{where} must specify 'data_type'")
    if not tensor.dims:
        _refuse(model, f"{where} must specify 'dims' (a tensor with only the batch axis is "
                       "served as dims [1] with reshape [])")
    if tensor.HasField("reshape") and not tensor.reshape.shape and max_batch_size == 0:
        _refuse(model, f"{where} cannot have empty reshape for non-batching model as scalar "
                       "tensors are not supported")
    if not _valid_dims(tensor.dims):
        _refuse(model, f"{where} has dims {list(tensor.dims)}: each dimension must be an "
                       f"integer >= 1, or {WILDCARD_DIM} for a variable-size dimension")
    if not tensor.HasField("reshape"):
        return
    reshape = list(tensor.reshape.shape)
    if not _valid_dims(reshape):
        _refuse(model, f"{where} has reshape {reshape}: reshape dimensions must be integers "
                       f">= 1, or {WILDCARD_DIM} for a variable-size dimension")
    dims_size, reshape_size = _element_count(tensor.dims), _element_count(reshape)
    if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
        _refuse(model, f"{where} has different size for dims {list(tensor.dims)} and "
                       f"reshape {reshape}")
    if dims_size == WILDCARD_DIM and _trunks(tensor.dims) != _trunks(reshape):
        _refuse(model, f"{where}: dims {list(tensor.dims)} and reshape {reshape} differ in "
                       "their variable-size dimensions or the sizes between them")


def _valid_dims(dims: Iterable[int]) -> bool:
    return all(d >= 1 or d == WILDCARD_DIM for d in dims)


def _element_count(dims: Iterable[int]) -> int:
    """Triton's ``GetElementCount``: -1 if any dimension varies, 0 for no dimensions."""
    dims = list(dims)
    if not dims:
        return 0
    count = 1
    for dim in dims:
        if dim == WILDCARD_DIM:
            return WILDCARD_DIM
        count *= dim
    return count


def _trunks(dims: Iterable[int]) -> list[int]:
    """The element counts between variable-size dimensions (Triton compares them in order)."""
    counts, current = [], 1
    for dim in dims:
        if dim == WILDCARD_DIM:
            counts.append(current)
            current = 1
        else:
            current *= dim
    counts.append(current)
    return counts


def _refuse(model: str, rule: str) -> NoReturn:
    raise ConfigRuleError(f"model {model!r}: {rule}: Triton would refuse to load it")
