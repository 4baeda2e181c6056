"""Operators: plain callables, batch-aware callables, and :class:`ModelOp` (a torch model).

Any Python callable is an operator: a function, a lambda, an instance with ``__call__``. It gets
one argument per input column and returns one value (or a tuple, one per output column).

An operator may also offer ``call_batch(rows) -> results``, taking a list of argument tuples (one
per row, across all the calls and requests the pipeline runs together) and returning one result
per row. The executor prefers it: that is how model operators batch the rows of many requests
into one model call, and how a loop operator (a greedy decoder) calls its model once per step for
all rows at once. ``op(*args)`` must equal ``op.call_batch([args])[0]``.

:func:`vectorized` makes such an operator of a function written for a batch: NumPy arrays with a
leading batch axis in, arrays with the same leading axis out. Pre- and post-processing written
that way costs one NumPy call per dynamic batch instead of one per row, which is what makes
Triton's batching pay for the Python operators as it does for the models.

A :class:`ModelOp` wraps a ``torch.nn.Module``. Its ``example_inputs`` describe one row as the
pipeline passes it, and the builder adds the batch axis around the module; or ``pre`` turns the
operator's arguments into the module's inputs with a leading batch axis, and ``post`` the
module's outputs (NumPy arrays, in process and when served alike) into the operator's result —
the rule is :mod:`builder.pipeline.batch_axis`'s. In process the module runs in torch; in the
served pipeline the module is its own Triton model, exported by :mod:`builder.repository.export`,
and the pipeline model reaches it through BLS. Which of the two runs is a *runner* bound to the
operator, so the same ``pre``/``post`` code runs in both places.

This module is captured by value into ``pipe.pickle``: torch is imported only inside the
functions that run the module in process, so the served pipeline model does not need it.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from builder.errors import PipelineError
from builder.pipeline.batch_axis import (
    check_axes,
    check_examples,
    check_module,
    check_row,
    module_axes,
    module_examples,
    row_of,
    run_module,
)
from builder.pipeline.module_outputs import choose_outputs, pick, selecting_module
from builder.pipeline.op_config import validate_op_config

_MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class ModelRunner(Protocol):
    """Runs a model operator's module on prepared inputs (one tuple of arrays per row)."""

    def infer(
        self, op: ModelOp, rows: Sequence[tuple[np.ndarray, ...]]
    ) -> list[tuple[np.ndarray, ...]]: ...


@dataclass(frozen=True)
class BlsTarget:
    """The Triton model a served model operator calls through BLS, and its tensor names.

    Filled in by the build from the export actually chosen (names differ per format: TorchScript
    wants ``name__index``), and carried in ``pipe.pickle`` in place of the torch module.
    """

    model_name: str
    format: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    max_batch_size: int
    reshaped: tuple[str, ...] = ()
    """Tensors with only the batch axis: Triton serves them as ``[batch, 1]`` reshaped to
    ``[batch]``, so a BLS request carries them with that trailing 1 (a session in the pipeline
    model's own process takes them as they are)."""


class ModelOp:
    """A ``torch.nn.Module`` as a pipeline operator that is served as its own Triton model.

    ``example_inputs`` (a tensor, array or a tuple of them, one per argument) describe **one
    row, as the pipeline passes it**: the builder adds the batch axis around the module — a
    batch of one in process, the stacked rows of a dynamic batch when served — and each row gets
    its slice of the outputs back without it. ``post`` (if given) then receives one row's
    outputs. With ``pre``, ``pre`` makes the module's batch instead: it returns the module's
    inputs with a leading batch axis, ``example_inputs`` show them so, and ``post`` receives the
    outputs with that axis (see :mod:`builder.pipeline.batch_axis`). The examples drive export
    and its numerical check and fix the dtypes and dims of the model's inputs; ``dynamic_axes``
    maps a ``forward()`` argument (or output) name to the axes of ``example_inputs`` that vary,
    counted in one row as the pipeline passes it (``{"input_ids": [0]}``: a tokenizer's
    per-text length; with ``pre`` the module's axes, so 1); the batch axis always varies. A
    module that cannot take the examples so, on a batch of one and of two rows, is refused
    here, naming the shapes and the fix. A module may return a tensor, a tuple of them, or
    named fields (a Hugging Face ``ModelOutput``, a dict, a named tuple:
    :mod:`builder.pipeline.module_outputs`); ``output_names`` names a tuple's tensors, or
    chooses fields, which are otherwise all the operator's outputs, by name. ``pad_values``
    (``{"input_ids": 0, "attention_mask": 0}``) lets rows whose varying axes differ share one
    served model call, padded to the batch's longest (:mod:`builder.runtime.model_batching`).
    ``op_config`` sets the model's Triton configuration: ``instance_count``, ``device``
    (``"cpu"`` keeps the model on the CPU of a GPU image), ``device_ids`` (GPUs to pin it to),
    ``dynamic_batching`` (``preferred_batch_size``, ``max_queue_delay_microseconds``),
    ``max_batch_size`` (``0``: one row per model call, for a module whose rows depend on each
    other, :mod:`builder.pipeline.row_independence`), ``format_priority``,
    ``latency_budget_ms`` (the longest its queue holds
    a request before refusing it ``UNAVAILABLE``; default: its share of the pipeline's budget)
    and ``max_queue_size``.

    The module is put in eval mode: operators do inference.
    """

    def __init__(
        self,
        module: Any,
        example_inputs: Any,
        pre: Callable[..., Any] | None = None,
        post: Callable[..., Any] | None = None,
        name: str | None = None,
        op_config: Mapping[str, Any] | None = None,
        *,
        input_names: Sequence[str] | None = None,
        output_names: Sequence[str] | None = None,
        dynamic_axes: Mapping[str, Sequence[int]] | None = None,
        pad_values: Mapping[str, Any] | None = None,
    ) -> None:
        import torch

        if not isinstance(module, torch.nn.Module):
            raise PipelineError(f"ModelOp needs a torch.nn.Module, got {type(module).__name__}")
        self.name = name or _default_model_name(module)
        if not _MODEL_NAME.match(self.name):
            raise PipelineError(
                f"model operator name {self.name!r} is not a valid Triton model name "
                "(letters, digits, '_', '.', '-')"
            )
        self.module = module.eval()
        examples = example_inputs if isinstance(example_inputs, (tuple, list)) else (
            example_inputs,
        )
        self.example_inputs = tuple(torch.as_tensor(e) for e in examples)
        if not self.example_inputs:
            raise PipelineError(f"model operator {self.name!r}: example_inputs are empty")
        self.adds_batch_axis = pre is None
        """Whether the builder adds the batch axis around the module (no ``pre``)."""
        self.pre = pre
        self.post = post
        self.op_config = validate_op_config(op_config or {}, self.name)
        self._describe(input_names, output_names, dynamic_axes, pad_values)
        check_module(self.name, self.module, self.example_inputs, self.input_names,
                     self.adds_batch_axis, self.output_paths, self.output_names)
        self.served: BlsTarget | None = None
        self._runner: ModelRunner | None = None

    def _describe(self, input_names: Sequence[str] | None, output_names: Sequence[str] | None,
                  dynamic_axes: Mapping[str, Sequence[int]] | None,
                  pad_values: Mapping[str, Any] | None) -> None:
        """Run the module once on its examples, and say what the served model is: its inputs'
        and outputs' names, which of their axes vary, what a padded batch fills each input
        with, and each input's dtype and dims as the model's config declares them."""
        check_examples(self.name, self.example_inputs, self.adds_batch_axis)
        self.module_examples = module_examples(self.example_inputs, self.adds_batch_axis)
        """The examples as the module takes them, batch axis first."""
        self.input_names = tuple(input_names or _forward_names(self.module,
                                                               len(self.example_inputs)))
        if len(self.input_names) != len(self.example_inputs):
            raise PipelineError(
                f"model operator {self.name!r}: {len(self.input_names)} input names for "
                f"{len(self.example_inputs)} example inputs"
            )
        result = run_module(self.name, self.module, self.module_examples, self.input_names,
                            self.adds_batch_axis)
        self.output_names, self.output_paths = choose_outputs(self.name, result, output_names)
        """The module's outputs the operator returns, in order: names (``None``: positional,
        named ``output_i`` when exported) and where each is in the module's result
        (:mod:`builder.pipeline.module_outputs`: a Hugging Face ``ModelOutput``'s fields)."""
        self.dynamic_axes = check_axes(self.name, dynamic_axes or {}, self._row_shapes(result),
                                       self.adds_batch_axis)
        self.pad_values = check_pad_values(
            self.name, pad_values or {}, self.input_names,
            {name: self.module_axes(name) for name in self.input_names})
        """Per input whose axes vary, what the served batch pads it with: rows of different
        lengths then share one model call (:mod:`builder.runtime.model_batching`)."""
        self.input_dtypes = tuple(
            str(e.detach().cpu().numpy().dtype) for e in self.example_inputs
        )
        self.input_dims = tuple(
            tuple(-1 if axis in self.module_axes(n) else size
                  for axis, size in enumerate(e.shape[1:], start=1))
            for n, e in zip(self.input_names, self.module_examples, strict=True)
        )
        """Each input's dims as the served model declares them: without the batch axis."""

    def __repr__(self) -> str:
        return f"ModelOp({self.name!r})"

    def _row_shapes(self, result: Any) -> dict[str, tuple[int, ...]]:
        """Each input's and output's shape as ``dynamic_axes`` counts its axes: one row's
        without ``pre`` (the batch axis the builder adds left out)."""
        outputs = self.tensor_names_out
        skip = 1 if self.adds_batch_axis else 0
        shapes = dict(zip(self.input_names, (tuple(e.shape) for e in self.example_inputs)))
        shapes.update((name, tuple(getattr(value, "shape", ()))[skip:])
                      for name, value in zip(outputs, pick(result, self.output_paths)))
        return shapes

    @property
    def tensor_names_out(self) -> tuple[str, ...]:
        """The outputs' names as exported: ``output_names``, else ``output_0``, ``output_1``…"""
        return self.output_names or tuple(f"output_{i}" for i in range(len(self.output_paths)))

    @property
    def batches(self) -> bool:
        """Whether the served model stacks the rows of many requests into one batch: not with
        ``op_config={"max_batch_size": 0}``, the opt-out for a module whose rows depend on each
        other (:mod:`builder.pipeline.row_independence`)."""
        return self.op_config.get("max_batch_size") != 0

    def exportable(self) -> Any:
        """The module as every export format takes it: positional inputs, the operator's
        outputs as a tuple (:func:`~builder.pipeline.module_outputs.selecting_module`)."""
        return selecting_module(self.module, self.output_paths)

    def module_axes(self, tensor: str) -> tuple[int, ...]:
        """The module's varying axes of input or output ``tensor``, batch axis excluded."""
        return module_axes(self.dynamic_axes, tensor, self.adds_batch_axis)

    # -- padding (the served batch's: :mod:`builder.runtime.model_batching`) ----------------------
    def padding(self) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]], list[Any]]:
        """What the served batch pads with: each input's and output's varying axes (batch
        axis excluded), and each input's pad value."""
        return ([self.module_axes(n) for n in self.input_names],
                [self.module_axes(n) for n in self.tensor_names_out],
                [self.pad_values.get(name, 0) for name in self.input_names])

    # -- calling ---------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        return self.call_batch([args])[0]

    def call_batch(self, rows: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``pre`` per row, the module once for all rows the runner can batch, ``post`` per row."""
        prepared = [self.prepare(*row) for row in rows]
        outputs = self.runner().infer(self, prepared)
        return [self.finish(out) for out in outputs]

    def prepare(self, *args: Any) -> tuple[np.ndarray, ...]:
        """One row's module inputs, batch axis first, as arrays of the exported dtypes: the
        arguments with the batch axis added, or what ``pre`` returns; shapes checked."""
        if self.pre is not None:
            value = self.pre(*args)
            values = value if isinstance(value, (tuple, list)) else (value,)
            if len(values) != len(self.input_names):
                raise PipelineError(
                    f"model operator {self.name!r}: pre returned {len(values)} inputs, the "
                    f"model takes {len(self.input_names)} ({', '.join(self.input_names)})"
                )
        else:
            together = len(args) == 1 and len(self.input_names) > 1 and isinstance(
                args[0], (tuple, list))  # one column holding every input of the module
            values = tuple(args[0]) if together else args
            if len(values) != len(self.input_names):
                raise PipelineError(
                    f"model operator {self.name!r} gets {len(values)} values per row, its "
                    f"module takes {len(self.input_names)} inputs "
                    f"({', '.join(self.input_names)}): map as many columns as example_inputs "
                    "has tensors, or give pre= to make the inputs"
                )
        arrays = []
        for value, name, dtype, dims in zip(
            values, self.input_names, self.input_dtypes, self.input_dims, strict=True
        ):
            array = value if type(value) is np.ndarray else _to_numpy(value)
            check_row(self.name, name, array.shape, dims, self.adds_batch_axis)
            if self.adds_batch_axis:
                array = np.asarray(array, dtype=np.dtype(dtype))[None]
            arrays.append(np.ascontiguousarray(array, dtype=np.dtype(dtype)))
        return tuple(arrays)

    def finish(self, outputs: tuple[np.ndarray, ...]) -> Any:
        """One row's module outputs (batch axis taken off where the builder added it) through
        ``post``, or the outputs themselves."""
        if self.adds_batch_axis:
            outputs = row_of(outputs)
        if self.post is not None:
            return self.post(*outputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    # -- where the module runs -------------------------------------------------------------
    def runner(self) -> ModelRunner:
        if self._runner is not None:
            return self._runner
        if self.module is None:
            raise PipelineError(
                f"model operator {self.name!r} has no module and no runner: it was not bound "
                "to its served model (was it hidden from the build's operator discovery?)"
            )
        return LocalRunner()

    def bind(self, runner: ModelRunner | None) -> None:
        """Route calls to ``runner`` (the served pipeline binds its BLS runner here)."""
        self._runner = runner

    def serving_state(self, served: BlsTarget) -> dict[str, Any]:
        """What ``pipe.pickle`` keeps of this operator: everything but the module and examples;
        the examples as the module takes them, for the served model's warm-up run."""
        state = dict(self.__dict__)
        state.update(module=None, example_inputs=None, module_examples=None, served=served,
                     _runner=None, warmup_inputs=self.example_arrays())
        return state

    def example_arrays(self) -> tuple[np.ndarray, ...]:
        """The examples as the module takes them, as host arrays: what warms its served model
        (Triton's ``model_warmup``; the pipeline's in-process session)."""
        return tuple(np.asarray(e.detach().cpu().numpy() if hasattr(e, "detach") else e)
                     for e in self.module_examples)


class ModelFields:
    """Some outputs of a model operator, chosen by name: what ``.map(inputs, "pooler_output",
    bert)`` calls when the module returns more fields (a Hugging Face ``ModelOutput``) than the
    map names. The model is exported with every field; each map takes the ones it names."""

    def __init__(self, model: ModelOp, names: Sequence[str]) -> None:
        if model.output_names is None:
            raise PipelineError(f"model operator {model.name!r}: its outputs have no names")
        self.model = model
        self.names = tuple(names)
        self.positions = tuple(model.output_names.index(n) for n in self.names)

    def __repr__(self) -> str:
        return f"{self.model!r}[{', '.join(self.names)}]"

    def __call__(self, *args: Any) -> Any:
        return self.call_batch([args])[0]

    def call_batch(self, rows: Sequence[tuple[Any, ...]]) -> list[Any]:
        chosen = []
        for result in self.model.call_batch(rows):
            values = result if isinstance(result, tuple) else (result,)
            picked = tuple(values[p] for p in self.positions)
            chosen.append(picked[0] if len(picked) == 1 else picked)
        return chosen


def check_pad_values(owner: str, pad_values: Mapping[str, Any], input_names: Sequence[str],
                     varying: Mapping[str, Sequence[int]]) -> dict[str, Any]:
    """Pad values for every input whose axes vary, and for no other name; numbers only."""
    values = dict(pad_values)
    unknown = sorted(set(values) - set(input_names))
    if unknown:
        raise PipelineError(f"model operator {owner!r}: pad_values names {unknown}, which are "
                            f"not inputs ({', '.join(input_names)})")
    wanted = [name for name in input_names if varying.get(name)]
    missing = [name for name in wanted if name not in values]
    if values and (missing or not wanted):
        raise PipelineError(
            f"model operator {owner!r}: pad_values pad the inputs whose axes vary "
            f"(dynamic_axes): give one for each of {wanted or 'none: no input axis varies'}"
            + (f"; missing {missing}" if missing and wanted else ""))
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PipelineError(f"model operator {owner!r}: pad_values[{name!r}] must be a "
                                f"number, got {value!r}")
    return values


def fields_by_column(op: Any, columns: Sequence[str]) -> Any:
    """``op``, or the fields of a model operator that ``columns`` name when they are some of
    its outputs' names in another order or number (without ``post``, which returns its own)."""
    if (isinstance(op, ModelOp) and op.post is None and op.output_names
            and tuple(columns) != op.output_names and set(columns) <= set(op.output_names)):
        return ModelFields(op, columns)
    return op


def restore_model_op(cls: type[ModelOp], state: dict[str, Any]) -> ModelOp:
    """Rebuild a served :class:`ModelOp` from :meth:`ModelOp.serving_state` (unpickling)."""
    op = cls.__new__(cls)
    op.__dict__.update(state)
    return op


class LocalRunner:
    """Runs the torch module in this process, one row at a time: the in-process reference."""

    def infer(
        self, op: ModelOp, rows: Sequence[tuple[np.ndarray, ...]]
    ) -> list[tuple[np.ndarray, ...]]:
        import torch

        results = []
        with torch.no_grad():
            for row in rows:
                outputs = pick(op.module(*(torch.from_numpy(np.array(a)) for a in row)),
                               op.output_paths)
                results.append(tuple(_to_numpy(o) for o in outputs))
        return results


# -- naming and discovery --------------------------------------------------------------------
def batch_stream(op: Any) -> bool:
    """Whether ``op`` streams through a generator ``call_batch`` (one step of every row per
    ``yield``: :mod:`builder.pipeline.streaming`)."""
    return inspect.isgeneratorfunction(getattr(op, "call_batch", None))


def operator_name(op: Any) -> str:
    """A readable name for error messages: the model name, function or class name."""
    if isinstance(op, ModelOp):
        return op.name
    if isinstance(op, ModelFields):
        return op.model.name
    if isinstance(op, functools.partial):
        return operator_name(op.func)
    name = getattr(op, "__qualname__", None)  # functions, methods, classes; not instances
    if isinstance(name, str):
        return "lambda" if name.endswith("<lambda>") else name
    return type(op).__name__


def _default_model_name(module: Any) -> str:
    name = re.sub(r"[^A-Za-z0-9_]+", "_", type(module).__name__)
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
    return name or "model"


def _forward_names(module: Any, count: int) -> list[str]:
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    names = [
        p.name for p in parameters
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(names) >= count and len(set(names[:count])) == count:
        return names[:count]
    return [f"input_{i}" for i in range(count)]


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach") and type(value).__module__.startswith("torch"):
        return value.detach().cpu().numpy()
    return np.asarray(value)
