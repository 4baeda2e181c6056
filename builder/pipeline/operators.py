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
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
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
from builder.pipeline.padding import (
    batch_key,
    check_pad_values,
    cut_rows,
    length_chunks,
    pad_rows,
)
from builder.pipeline.user_code import is_installed

OP_CONFIG_KEYS = ("device", "device_ids", "dynamic_batching", "format_priority",
                  "instance_count", "latency_budget_ms", "max_batch_size", "max_queue_size")
"""What ``op_config`` may set for a model operator's Triton model (see
:mod:`builder.repository.model_config`).

Tuples, not sets: this module is pickled by value into ``pipe.pickle``, and a set of strings is
pickled in an order that changes from one process to the next (string hashes are salted), which
would make the bytes — and the image — differ for an unchanged pipeline."""

DYNAMIC_BATCHING_KEYS = ("max_queue_delay_microseconds", "preferred_batch_size")
DEVICES = ("cpu", "gpu")
"""``op_config["device"]``: where the model's instances run (default: the target's GPUs, if any)."""

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
    served model call, padded to the batch's longest (:mod:`builder.pipeline.padding`).
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
        check_examples(self.name, self.example_inputs, self.adds_batch_axis)
        self.module_examples = module_examples(self.example_inputs, self.adds_batch_axis)
        """The examples as the module takes them, batch axis first."""
        self.input_names = tuple(input_names or _forward_names(module, len(self.example_inputs)))
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
        lengths then share one model call (:mod:`builder.pipeline.padding`)."""
        self.input_dtypes = tuple(
            str(e.detach().cpu().numpy().dtype) for e in self.example_inputs
        )
        self.input_dims = tuple(
            tuple(-1 if axis in self.module_axes(n) else size
                  for axis, size in enumerate(e.shape[1:], start=1))
            for n, e in zip(self.input_names, self.module_examples, strict=True)
        )
        """Each input's dims as the served model declares them: without the batch axis."""
        self.pre = pre
        self.post = post
        self.op_config = validate_op_config(op_config or {}, self.name)
        check_module(self.name, self.module, self.example_inputs, self.input_names,
                     self.adds_batch_axis, self.output_paths, self.output_names)
        self.served: BlsTarget | None = None
        self._runner: ModelRunner | None = None

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

    # -- padding (the served batch's, :mod:`builder.pipeline.padding`) ------------------------
    def pad_key(self, row: Sequence[np.ndarray]) -> tuple:
        """What rows padded into one model call share: dtypes, and the fixed sizes."""
        return batch_key(row, self._padded_axes()[0])

    def pad_chunks(self, rows: Sequence[Sequence[np.ndarray]], limit: int) -> list[list[int]]:
        """Which rows share a padded call: those of similar lengths, at most ``limit``."""
        return length_chunks(rows, self._padded_axes()[0], limit)

    def pad(self, rows: Sequence[Sequence[np.ndarray]]) -> tuple[list[np.ndarray], list]:
        """The rows' module inputs as one batch, padded to its longest row."""
        return pad_rows(rows, self._padded_axes()[0],
                        [self.pad_values.get(name, 0) for name in self.input_names])

    def cut(self, outputs: Sequence[np.ndarray], sizes: Sequence[int],
            lengths: list) -> list[tuple[np.ndarray, ...]]:
        """A padded batch's outputs, per row, cut back to each row's own lengths."""
        return cut_rows(outputs, sizes, lengths, self._padded_axes()[1])

    def _padded_axes(self) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        return ([self.module_axes(n) for n in self.input_names],
                [self.module_axes(n) for n in self.tensor_names_out])

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
                     _runner=None, warmup_inputs=tuple(
                         e.detach().cpu().numpy() for e in self.module_examples))
        return state


class ModelFields:
    """Some outputs of a model operator, chosen by name: what ``.map(inputs, "pooler_output",
    bert)`` calls when the module returns more fields (a Hugging Face ``ModelOutput``) than the
    map names. The model is exported with every field; each map takes the ones it names."""

    def __init__(self, model: ModelOp, names: Sequence[str]) -> None:
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


def fields_by_column(op: Any, columns: Sequence[str]) -> Any:
    """``op``, or the fields of a model operator that ``columns`` name when they are some of
    its outputs' names in another order or number (without ``post``, which returns its own)."""
    if (isinstance(op, ModelOp) and op.post is None and op.output_names
            and tuple(columns) != op.output_names and set(columns) <= set(op.output_names)):
        return ModelFields(op, columns)
    return op


def restore_model_op(cls: type, state: dict[str, Any]) -> ModelOp:
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


class Vectorized:
    """A function written for a batch, as an operator: see :func:`vectorized`."""

    def __init__(self, function: Callable[..., Any], batch: bool = True) -> None:
        if not callable(function):
            raise PipelineError(f"vectorized needs a function, got {type(function).__name__}")
        self.function = function
        self.batch = batch
        """``False``: one call per row, for a function whose rows depend on each other."""
        self.__qualname__ = operator_name(function)  # how errors and labels name it
        self.__doc__ = getattr(function, "__doc__", None)

    def __repr__(self) -> str:
        return f"vectorized({self.__qualname__})"

    def __call__(self, *args: Any) -> Any:
        return self.call_batch([args])[0]

    def call_batch(self, rows: Sequence[tuple[Any, ...]]) -> list[Any]:
        """One call of the function per group of rows whose arguments agree in shape and dtype."""
        results: list[Any] = [None] * len(rows)
        groups = _stacked_groups(rows) if self.batch else [
            ([index], [np.asarray(a)[None] for a in row]) for index, row in enumerate(rows)]
        for members, arrays in groups:
            outputs = self.function(*arrays)
            several = isinstance(outputs, tuple)
            columns = [np.asarray(o) for o in (outputs if several else (outputs,))]
            for column in columns:
                if column.ndim == 0 or column.shape[0] != len(members):
                    raise PipelineError(
                        f"vectorized operator {self.__qualname__!r} returned shape "
                        f"{list(column.shape)} for a batch of {len(members)}: every output "
                        "keeps the leading batch axis"
                    )
            for position, index in enumerate(members):
                row = tuple(column[position] for column in columns)
                results[index] = row if several else row[0]
        return results


def vectorized(function: Callable[..., Any] | None = None, *,
               batch: bool = True) -> Any:
    """Use ``function``, written for a batch, as a pipeline operator (a decorator:
    ``@vectorized``, or ``@vectorized(batch=False)``).

    ``function`` takes one NumPy array per input column, each with a leading batch axis, and
    returns one array (or a tuple, one per output column) with the same leading axis. The
    executor hands it every row of a dynamic batch at once, grouped by the shapes and dtypes of
    the arguments (rows that differ go in separate calls); in process, one call is a batch of
    one. Row ``i`` of the result must depend on row ``i`` of the arguments only: the build
    checks it and refuses a function whose rows depend on each other
    (:mod:`builder.pipeline.row_independence`); ``batch=False`` calls such a function on one
    row at a time, served too.
    """
    if function is None:
        return lambda wrapped: Vectorized(wrapped, batch)
    return Vectorized(function, batch)


def _stacked_groups(rows: Sequence[tuple[Any, ...]]) -> list[tuple[list[int], list[np.ndarray]]]:
    """Rows whose arguments agree in shape and dtype, each argument stacked on a batch axis."""
    if len(rows) == 1:  # a call in process: no grouping, nothing to copy
        return [([0], [np.asarray(a)[None] for a in rows[0]])]
    arrays = [[np.asarray(a) for a in row] for row in rows]
    groups: dict[tuple, list[int]] = {}
    for index, row in enumerate(arrays):
        groups.setdefault(tuple([(a.shape, a.dtype) for a in row]), []).append(index)
    return [(members, [np.stack([arrays[i][k] for i in members])
                       for k in range(len(arrays[members[0]]))])
            for members in groups.values()]


# -- op_config -------------------------------------------------------------------------------
def validate_op_config(config: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """Check ``op_config`` keys and value types; the error names the operator."""
    config = dict(config)
    unknown = set(config).difference(OP_CONFIG_KEYS)
    if unknown:
        raise PipelineError(
            f"operator {owner!r}: unknown op_config keys {sorted(unknown)}; "
            f"known: {sorted(OP_CONFIG_KEYS)}"
        )

    def fail(key: str, expected: str) -> None:
        raise PipelineError(
            f"operator {owner!r}: op_config[{key!r}] must be {expected}, got {config[key]!r}"
        )

    for key in ("instance_count", "max_batch_size", "max_queue_size"):
        lowest = 0 if key == "max_batch_size" else 1  # 0: no batching, one row per model call
        if key in config and (not isinstance(config[key], int) or isinstance(config[key], bool)
                              or config[key] < lowest):
            fail(key, "an int >= 0 (0: no batching, one row at a time)"
                 if lowest == 0 else "a positive int")
    if "latency_budget_ms" in config and (
            not isinstance(config["latency_budget_ms"], (int, float))
            or isinstance(config["latency_budget_ms"], bool) or config["latency_budget_ms"] <= 0):
        fail("latency_budget_ms", "a positive number of milliseconds")
    if "device_ids" in config and (
        not isinstance(config["device_ids"], (list, tuple))
        or not all(isinstance(d, int) and d >= 0 for d in config["device_ids"])
    ):
        fail("device_ids", "a list of GPU indices")
    if "device" in config and config["device"] not in DEVICES:
        fail("device", f"one of {list(DEVICES)}")
    if config.get("device") == "cpu" and config.get("device_ids"):
        raise PipelineError(
            f"operator {owner!r}: op_config pins GPUs {list(config['device_ids'])} and asks for "
            f"device 'cpu': drop one of them"
        )
    if "format_priority" in config:
        if isinstance(config["format_priority"], str) or not config["format_priority"]:
            fail("format_priority", "a non-empty list of formats")
        config["format_priority"] = list(config["format_priority"])
    if "dynamic_batching" in config:
        batching = config["dynamic_batching"]
        if not isinstance(batching, Mapping) or set(batching).difference(DYNAMIC_BATCHING_KEYS):
            fail("dynamic_batching", f"a mapping with keys {sorted(DYNAMIC_BATCHING_KEYS)}")
        config["dynamic_batching"] = dict(batching)
    return config


# -- naming and discovery --------------------------------------------------------------------
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


def find_model_ops(roots: Sequence[Any], max_depth: int = 8) -> list[ModelOp]:
    """Every :class:`ModelOp` reachable from ``roots``, in discovery order.

    Why: a model operator may sit inside another operator (a decoder inside a greedy-decoding
    loop); the build must export it and the served pipeline must bind it to BLS. We follow what
    such code can reach: attributes, closures, ``functools.partial`` arguments, bound methods,
    containers, and the globals a function of a user's module refers to.
    """
    found: dict[int, ModelOp] = {}
    seen: set[int] = set()

    def visit(obj: Any, depth: int) -> None:
        if depth > max_depth or id(obj) in seen or _is_leaf(obj):
            return
        seen.add(id(obj))
        if isinstance(obj, ModelOp):
            found.setdefault(id(obj), obj)
            for part in (obj.pre, obj.post):
                visit(part, depth + 1)
            return
        for child in _children(obj):
            visit(child, depth + 1)

    for root in roots:
        visit(root, 0)
    return list(found.values())


def _children(obj: Any) -> Iterator[Any]:
    if isinstance(obj, dict):
        yield from obj.values()
    elif isinstance(obj, (list, tuple, set, frozenset)):
        yield from obj
    elif isinstance(obj, functools.partial):
        yield obj.func
        yield from obj.args
        yield from obj.keywords.values()
    elif isinstance(obj, types.MethodType):
        yield obj.__func__
        yield obj.__self__
    elif isinstance(obj, types.FunctionType):
        for cell in obj.__closure__ or ():
            try:
                yield cell.cell_contents
            except ValueError:  # an empty cell
                continue
        yield from obj.__defaults__ or ()
        if not is_installed(obj.__module__):
            for name in _referenced_names(obj.__code__):
                if name in obj.__globals__:
                    yield obj.__globals__[name]
    elif isinstance(obj, type):
        if not is_installed(obj.__module__):  # a user class may hold model ops as attributes
            yield from (v for k, v in vars(obj).items() if not k.startswith("__"))
    else:
        state = getattr(obj, "__dict__", None)
        if isinstance(state, dict):
            yield from state.values()
        for slot in getattr(type(obj), "__slots__", ()):
            if hasattr(obj, slot):
                yield getattr(obj, slot)
        yield type(obj)
        for method in ("__call__", "call_batch"):  # their globals may hold model operators
            function = getattr(type(obj), method, None)
            if isinstance(function, types.FunctionType):
                yield function


def _referenced_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _referenced_names(const)


def _is_leaf(obj: Any) -> bool:
    if isinstance(obj, (str, bytes, bytearray, int, float, complex, bool, type(None),
                        np.ndarray, np.generic, types.ModuleType, types.BuiltinFunctionType)):
        return True
    module = type(obj).__module__ or ""
    return module.split(".")[0] in ("torch", "numpy", "onnx", "onnxruntime")


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
