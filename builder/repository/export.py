"""Exporting a model operator's torch module to a Triton model, format by format.

Formats are tried in ``format_priority`` order; a format that fails to export, or whose model
disagrees with torch on the example inputs, falls through to the next, and every attempt is
kept with its reason so the build can report it:

* ``onnx`` — ``torch.onnx.export`` with a dynamic batch axis: the TorchScript-based exporter,
  else the ``torch.export``-based one (what current transformers models need); served by the
  onnxruntime backend (``platform: "onnxruntime_onnx"``). A model past protobuf's 2 GiB keeps
  its weights in ``model.onnx.data`` beside the graph (:mod:`.onnx_external_data`), checked and
  run from the path.
* ``torchscript`` — ``torch.jit.trace``; served by the PyTorch backend (``pytorch_libtorch``),
  whose tensor names follow its ``<name>__<index>`` convention.
* ``python`` — the module itself, pickled by value, run with torch inside the python backend by
  :mod:`builder.runtime.torch_model`: the fallback for whatever the other formats cannot express.
* ``tensorrt`` — a TensorRT engine built from the ONNX export, where ``tensorrt`` and a CUDA
  device exist.

The numerical check runs the exported model on the example inputs and on the examples stacked
twice along the batch axis (which proves the batch axis really is dynamic), and compares with
torch: floats within ``tolerance`` (absolute and relative), integers and booleans exactly.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from builder.errors import ExportError, TritonBuilderError
from builder.pipeline.operators import ModelOp
from builder.pipeline.signature import triton_dtype
from builder.repository.batching import MAX_BATCH_SIZE
from builder.repository.model_config import TensorConfig
from builder.repository.onnx_external_data import EXTERNAL_DATA_BYTES, gather_external_data

TOLERANCE = 1e-4
"""How far an export's outputs may be from the module's on its examples (absolute and relative,
as ``numpy.allclose``) where the build does not say (``export_tolerance``)."""
TORCH_MODEL_RUNTIME = Path(__file__).parents[1] / "runtime" / "torch_model.py"
ONNX_OPSET = 17
DYNAMO_OPSET = 18
"""The lowest opset the torch.export-based exporter writes without a version conversion."""

_COLOURS = re.compile(r"\x1b\[[0-9;]*m")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportAttempt:
    """One format tried for one model: whether it worked and, if not, why."""

    format: str
    ok: bool
    reason: str = ""


@dataclass
class ExportedModel:
    """A model exported into a Triton model version directory."""

    format: str
    inputs: list[TensorConfig]
    outputs: list[TensorConfig]
    backend: str | None = None
    platform: str | None = None
    attempts: list[ExportAttempt] = field(default_factory=list)


class FormatFailed(TritonBuilderError, RuntimeError):
    """This format cannot serve this module; the message says why."""


@dataclass
class Reference:
    """Inputs and torch's outputs: the examples, and the examples stacked twice; and the module
    every format exports (:meth:`ModelOp.exportable`: the operator's outputs as a tuple)."""

    cases: list[tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]]
    output_names: tuple[str, ...]
    module: Any = None


def check_formats(formats: Sequence[str], owner: str) -> list[str]:
    """Validate a ``format_priority`` list; the error names the operator it is for."""
    if isinstance(formats, str) or not formats:
        raise ExportError(f"{owner}: format_priority must be a non-empty list of formats")
    unknown = [f for f in formats if f not in EXPORT_FORMATS]
    if unknown:
        raise ExportError(f"{owner}: unknown formats {unknown}; known: {list(EXPORT_FORMATS)}")
    return list(formats)


def export_model(
    op: ModelOp,
    version_directory: Path,
    formats: Sequence[str],
    tolerance: float = TOLERANCE,
    max_batch_size: int = MAX_BATCH_SIZE,
    reference: Reference | None = None,
) -> ExportedModel:
    """Export ``op``'s module into ``version_directory`` in the first format that works
    (``reference``: :func:`reference_outputs` of ``op``, if already run).

    Raises :class:`ExportError` naming the operator and every format's reason when none does.
    """
    formats = check_formats(formats, f"model operator {op.name!r}")
    reference = reference or reference_outputs(op)
    attempts: list[ExportAttempt] = []
    for name in formats:
        version_directory.mkdir(parents=True, exist_ok=True)
        try:
            record = EXPORT_FORMATS[name]
            exported = record.export(op, version_directory, reference, tolerance,
                                     max_batch_size=max_batch_size)
            exported.platform, exported.backend = record.platform, record.backend
        except FormatFailed as failure:
            attempts.append(ExportAttempt(name, False, str(failure)))
            log.warning("model operator %r: format %s failed: %s", op.name, name, failure)
            _empty(version_directory)
            continue
        except Exception as error:  # noqa: BLE001 - an exporter crash is a failed format too
            reason = _first_line(f"{type(error).__name__}: {error}")
            attempts.append(ExportAttempt(name, False, reason))
            log.warning("model operator %r: format %s failed: %s", op.name, name, reason)
            _empty(version_directory)
            continue
        attempts.append(ExportAttempt(name, True))
        exported.attempts = attempts
        return exported
    reasons = "; ".join(f"{a.format}: {a.reason}" for a in attempts)
    raise ExportError(
        f"model operator {op.name!r} could not be exported in any of {formats} ({reasons}); "
        "add a fallback format such as 'python' to format_priority"
    )


def reference_outputs(op: ModelOp) -> Reference:
    """Run torch on the examples (and on them stacked twice) to get what exports must match."""
    import torch

    module = op.exportable()
    single = tuple(e.detach().cpu().numpy() for e in op.module_examples)
    double = tuple(np.concatenate([a, a]) for a in single)
    cases = []
    with torch.no_grad():
        for inputs in (single, double):
            outputs = module(*(torch.from_numpy(a.copy()) for a in inputs))
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            if not all(isinstance(o, torch.Tensor) for o in outputs):
                raise ExportError(
                    f"model operator {op.name!r}: the module must return tensors, got "
                    f"{', '.join(type(o).__name__ for o in outputs)}"
                )
            cases.append((inputs, tuple(o.detach().cpu().numpy() for o in outputs)))
    count = len(cases[0][1])
    names = tuple(op.output_names or [f"output_{i}" for i in range(count)])
    if len(names) != count:
        raise ExportError(
            f"model operator {op.name!r}: {len(names)} output names for {count} outputs"
        )
    return Reference(cases, names, module)


def row_bytes(reference: Reference) -> int:
    """The bytes of one row of the module's inputs and outputs, from its examples."""
    inputs, outputs = reference.cases[0]
    rows = max(1, inputs[0].shape[0]) if inputs and inputs[0].ndim else 1
    return -(-sum(array.nbytes for array in (*inputs, *outputs)) // rows)


def compare(expected: Sequence[np.ndarray], got: Sequence[np.ndarray], names: Sequence[str],
            tolerance: float) -> None:
    """Raise :class:`FormatFailed` unless ``got`` matches torch's ``expected`` outputs."""
    if len(got) != len(expected):
        raise FormatFailed(f"{len(got)} outputs, torch gives {len(expected)}")
    for name, want, have in zip(names, expected, got, strict=True):
        have = np.asarray(have)
        if have.shape != want.shape:
            raise FormatFailed(f"output {name!r} has shape {list(have.shape)}, torch gives "
                               f"{list(want.shape)}")
        if want.dtype.kind in "fc":
            if not np.allclose(have, want, rtol=tolerance, atol=tolerance, equal_nan=True):
                worst = float(np.max(np.abs(have.astype(np.float64) - want)))
                raise FormatFailed(
                    f"output {name!r} differs from torch by up to {worst:.3g} "
                    f"(tolerance {tolerance:g})"
                )
        elif not np.array_equal(have, want):
            raise FormatFailed(f"output {name!r} differs from torch")


# -- onnx ------------------------------------------------------------------------------------
def export_onnx(op: ModelOp, directory: Path, reference: Reference, tolerance: float,
                filename: str = "model.onnx", *,
                max_batch_size: int = MAX_BATCH_SIZE) -> ExportedModel:
    import onnx
    import onnxruntime as ort

    path = directory / filename
    names = list(op.input_names) + list(reference.output_names)
    dynamic_axes = {
        name: {0: "batch", **{axis: f"{name}_{axis}" for axis in op.module_axes(name)}}
        for name in names
    }
    _export_onnx_graph(op, reference, path, dynamic_axes)
    gather_external_data(path)  # past 2 GiB: the weights in model.onnx.data, beside the graph
    onnx.checker.check_model(str(path))  # by path: a loaded model past 2 GiB cannot be checked
    model = onnx.load(str(path), load_external_data=False)
    inputs, outputs = onnx_io(model)
    if [t.name for t in inputs] != list(op.input_names):
        raise FormatFailed(
            f"the ONNX graph takes inputs {[t.name for t in inputs]}, the operator gives "
            f"{list(op.input_names)} (torch drops inputs the model does not use)"
        )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for feeds, expected in reference.cases:
        got = session.run(list(reference.output_names), dict(zip(op.input_names, feeds,
                                                                 strict=True)))
        compare(expected, got, reference.output_names, tolerance)
        _check_dims(outputs, got)
    if not any(op.module_axes(name) for name in op.input_names):
        outputs = _tight(outputs, reference)
    return ExportedModel("onnx", inputs, outputs)


def _tight(outputs: list[TensorConfig], reference: Reference) -> list[TensorConfig]:
    """Outputs as the examples shaped them, where no input axis varies: then only the batch
    axis can (tracing names the other axes of some outputs, ``[-1, 768]`` for a fixed
    ``[8, 768]``, and a config declared that loose lets a client expect any length)."""
    return [TensorConfig(t.name, t.dtype, tuple(array.shape[1:]))
            for t, array in zip(outputs, reference.cases[0][1], strict=True)]


def _export_onnx_graph(op: ModelOp, reference: Reference, path: Path,
                       dynamic_axes: dict[str, dict[int, str]]) -> None:
    """Torch's TorchScript-based ONNX exporter, else its ``torch.export``-based one.

    Why both: the first still exports most modules and is what every image so far was built
    with; the second (``dynamo=True``, which needs ``onnxscript``) exports what tracing cannot,
    such as current transformers models. Both failing, each one's reason is reported.
    """
    import torch

    names = dict(input_names=list(op.input_names), output_names=list(reference.output_names))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(reference.module, op.module_examples, str(path), **names,
                              dynamic_axes=dynamic_axes, opset_version=ONNX_OPSET, dynamo=False)
        return
    except Exception as error:  # noqa: BLE001 - the other exporter is tried, then both reported
        first = _first_line(f"{type(error).__name__}: {error}")
        log.info("model operator %r: TorchScript-based ONNX export failed (%s); trying the "
                 "torch.export-based exporter", op.name, first)
    # torch.export specializes axes of size 1: the examples stacked twice show a batch of 2.
    examples = tuple(torch.cat([e, e]) for e in op.module_examples)
    external = _weight_bytes(reference.module) >= EXTERNAL_DATA_BYTES
    dims = {name: {axis: torch.export.Dim(label, min=1)
                   for axis, label in dynamic_axes[name].items()} for name in op.input_names}
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):  # progress
            warnings.simplefilter("ignore")
            torch.onnx.export(reference.module, examples, str(path), **names,
                              dynamic_shapes=tuple(dims[n] for n in op.input_names),
                              opset_version=max(ONNX_OPSET, DYNAMO_OPSET), dynamo=True,
                              external_data=external, verbose=False)
    except Exception as error:  # noqa: BLE001 - a failed format, with both reasons
        second = _first_line(f"{type(error).__name__}: {error}")
        raise FormatFailed(f"TorchScript-based exporter: {first}; torch.export-based exporter: "
                           f"{second}") from None


def _weight_bytes(module: Any) -> int:
    """The bytes of a module's parameters and buffers (each shared tensor once)."""
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def onnx_io(model: Any) -> tuple[list[TensorConfig], list[TensorConfig]]:
    """An ONNX graph's inputs and outputs as config tensors (batch axis dropped, -1 if named).

    Raises :class:`FormatFailed` when a tensor's first axis is not dynamic: Triton batches on it.
    """
    import onnx

    initializers = {i.name for i in model.graph.initializer}

    def convert(values) -> list[TensorConfig]:
        tensors = []
        for value in values:
            if value.name in initializers:
                continue
            kind = value.type.tensor_type
            dtype = triton_dtype(onnx.helper.tensor_dtype_to_np_dtype(kind.elem_type))
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in kind.shape.dim]
            if not dims or dims[0] != -1:
                raise FormatFailed(f"tensor {value.name!r} has no dynamic batch axis: {dims}")
            tensors.append(TensorConfig(value.name, dtype, tuple(dims[1:])))
        return tensors

    return convert(model.graph.input), convert(model.graph.output)


# -- torchscript -----------------------------------------------------------------------------
def export_torchscript(op: ModelOp, directory: Path, reference: Reference,
                       tolerance: float, *, max_batch_size: int = MAX_BATCH_SIZE) -> ExportedModel:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(reference.module, op.module_examples, check_trace=False)
        path = directory / "model.pt"
        traced.save(str(path))
        loaded = torch.jit.load(str(path))
    outputs = _run_torch(loaded, reference, tolerance)
    input_names = [f"{name}__{i}" for i, name in enumerate(op.input_names)]
    output_names = [f"{name}__{i}" for i, name in enumerate(reference.output_names)]
    return ExportedModel(
        "torchscript",
        _tensor_configs(input_names, reference.cases[0][0], op.input_dims),
        _tensor_configs(output_names, outputs, _output_dims(op, reference)),
    )


# -- python ----------------------------------------------------------------------------------
def export_python(op: ModelOp, directory: Path, reference: Reference,
                  tolerance: float, *, max_batch_size: int = MAX_BATCH_SIZE) -> ExportedModel:
    from builder.pipeline.serialization import round_trip

    payload, module = round_trip(reference.module)
    (directory / "module.pickle").write_bytes(payload)
    shutil.copyfile(TORCH_MODEL_RUNTIME, directory / "model.py")
    outputs = _run_torch(module, reference, tolerance)
    return ExportedModel(
        "python",
        _tensor_configs(op.input_names, reference.cases[0][0], op.input_dims),
        _tensor_configs(reference.output_names, outputs, _output_dims(op, reference)),
    )


# -- tensorrt --------------------------------------------------------------------------------
def export_tensorrt(op: ModelOp, directory: Path, reference: Reference,
                    tolerance: float, *, max_batch_size: int = MAX_BATCH_SIZE) -> ExportedModel:
    """A TensorRT engine from the ONNX export, batch profile 1..max_batch_size."""
    try:
        import tensorrt as trt
    except ImportError as error:
        raise FormatFailed(f"TensorRT is not installed ({error})") from None
    import torch

    if not torch.cuda.is_available():
        raise FormatFailed("TensorRT needs a CUDA device to build and check an engine")
    if any(op.module_axes(name) for name in op.dynamic_axes):
        raise FormatFailed("only the batch axis may vary in a TensorRT engine built here")
    with tempfile.TemporaryDirectory() as scratch:
        onnx_model = export_onnx(op, Path(scratch), reference, tolerance)
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        explicit = int(trt.__version__.split(".")[0]) < 10  # always explicit from TRT 10
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH) if explicit else 0
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(Path(scratch) / "model.onnx")):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise FormatFailed(f"TensorRT cannot parse the ONNX model: {errors}")
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for tensor in onnx_model.inputs:
        dims = tuple(tensor.dims)
        profile.set_shape(tensor.name, (1, *dims), (max(1, max_batch_size // 2), *dims),
                          (max_batch_size, *dims))
    config.add_optimization_profile(profile)
    engine_bytes = builder.build_serialized_network(network, config)
    if engine_bytes is None:
        raise FormatFailed("TensorRT could not build an engine")
    (directory / "model.plan").write_bytes(bytes(engine_bytes))
    engine = trt.Runtime(logger).deserialize_cuda_engine(bytes(engine_bytes))
    context = engine.create_execution_context()
    for feeds, expected in reference.cases:
        tensors = {}
        for name, array in zip(op.input_names, feeds, strict=True):
            tensors[name] = torch.from_numpy(array.copy()).cuda()
            context.set_input_shape(name, array.shape)
        for name in reference.output_names:
            shape = tuple(context.get_tensor_shape(name))
            dtype = trt.nptype(engine.get_tensor_dtype(name))
            tensors[name] = torch.from_numpy(np.empty(shape, dtype=dtype)).cuda()
        for name, tensor in tensors.items():
            context.set_tensor_address(name, tensor.data_ptr())
        stream = torch.cuda.Stream()
        context.execute_async_v3(stream.cuda_stream)
        stream.synchronize()
        got = [tensors[n].cpu().numpy() for n in reference.output_names]
        compare(expected, got, reference.output_names, tolerance)
    return ExportedModel("tensorrt", onnx_model.inputs, onnx_model.outputs)


@dataclass(frozen=True)
class ExportFormat:
    """One export format, all that the stages ask of it: a format is added here (its exporter
    and this record) and, where the python backend runs it, by its runtime file."""

    name: str
    export: Callable[..., ExportedModel]
    """``(op, directory, reference, tolerance, *, max_batch_size)``: one signature, so
    :func:`export_model` names no format (only a TensorRT engine's batch profile uses the
    largest batch)."""
    model_file: str
    """What the exporter writes in the version directory (Triton's default file name)."""
    platform: str | None = None
    """The config's ``platform``, where Triton fills the backend in itself."""
    backend: str | None = None
    """The config's ``backend``, where no platform names it."""
    check_model: Callable[[Any, Path], None] | None = None
    """Checks the config against the model file as the backend will at load:
    ``(config, path)``."""
    in_process: bool = False
    """A CPU model operator of this format may run inside the pipeline model (ONNX Runtime, the
    onnxruntime backend's numerics), no BLS round trip."""
    served_from_environment_on_slim: bool = False
    """On a slim GPU base, the backend that serves it runs on the packed environment (our
    Python onnxruntime backend: the environment holds onnxruntime-gpu)."""
    needs_torch: bool = False
    """The python backend runs the module with torch: the environment holds the builder's."""


def _check_onnx(config: Any, path: Path) -> None:
    from builder.repository.config_rules import check_onnx_model

    check_onnx_model(config, path)


EXPORT_FORMATS: dict[str, ExportFormat] = {record.name: record for record in (
    ExportFormat("onnx", export_onnx, "model.onnx", platform="onnxruntime_onnx",
                 check_model=_check_onnx, in_process=True,
                 served_from_environment_on_slim=True),
    ExportFormat("torchscript", export_torchscript, "model.pt", platform="pytorch_libtorch"),
    ExportFormat("python", export_python, "model.py", backend="python", needs_torch=True),
    ExportFormat("tensorrt", export_tensorrt, "model.plan", platform="tensorrt_plan"),
)}
"""Every export format by name, in the order ``format_priority`` lists them in its help."""


# -- helpers shared by the torch-run formats -------------------------------------------------
def _run_torch(module: Any, reference: Reference, tolerance: float) -> tuple[np.ndarray, ...]:
    """Run a re-loaded module on the reference cases, compare, return the first outputs."""
    import torch

    first: tuple[np.ndarray, ...] | None = None
    with torch.no_grad():
        for feeds, expected in reference.cases:
            outputs = module(*(torch.from_numpy(a.copy()) for a in feeds))
            outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
            got = [o.detach().cpu().numpy() for o in outputs]
            compare(expected, got, reference.output_names, tolerance)
            first = first or tuple(got)
    if first is None:  # never: the reference has the operator's examples, at least one
        raise ExportError("the exported module answered no reference case")
    return first


def _output_dims(op: ModelOp, reference: Reference) -> list[tuple[int, ...]]:
    dims = []
    for i, name in enumerate(reference.output_names):
        shape = reference.cases[0][1][i].shape[1:]
        varying = op.module_axes(name)
        dims.append(tuple(-1 if axis in varying else size
                          for axis, size in enumerate(shape, start=1)))
    return dims


def _tensor_configs(names: Sequence[str], arrays: Sequence[np.ndarray],
                    dims: Sequence[tuple[int, ...]]) -> list[TensorConfig]:
    return [TensorConfig(n, triton_dtype(a.dtype), tuple(d))
            for n, a, d in zip(names, arrays, dims, strict=True)]


def _check_dims(declared: list[TensorConfig], arrays: Sequence[np.ndarray]) -> None:
    for tensor, array in zip(declared, arrays, strict=True):
        shape = array.shape[1:]
        if len(shape) != len(tensor.dims) or any(
            d != -1 and d != s for d, s in zip(tensor.dims, shape, strict=True)
        ):
            raise FormatFailed(
                f"output {tensor.name!r} has shape {list(array.shape)} but the graph declares "
                f"[-1, {', '.join(map(str, tensor.dims))}]"
            )


def _first_line(text: str, limit: int = 300) -> str:
    """Exporters put whole graphs in their messages (and terminal colours); the first line
    says what went wrong."""
    text = _COLOURS.sub("", text)
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _empty(directory: Path) -> None:
    """Remove what a failed format left behind, so the next one starts clean."""
    for item in directory.iterdir():
        if item.is_dir():
            shutil.rmtree(item)
        else:
            item.unlink()
