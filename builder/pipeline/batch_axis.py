"""Who adds a model operator's batch axis, and the checks that hold the module to it.

A pipeline is called one row at a time, and its model operators are written the same way:
``example_inputs`` describe **one row, as the pipeline passes it** to the operator. One rule says
where the batch axis comes from:

* **Without** ``pre``, the builder adds it around the module: in process one row is a batch of
  one, served the rows of a dynamic batch are stacked; each row then gets its own slice of the
  outputs back, without the axis (so ``post``, if any, and the next operator see one row). The
  served model's ``dims`` are the example's shape; a per-row scalar (a 0-d example) is served
  with Triton's ``reshape`` (``dims [1]``, ``reshape []``).
* **With** ``pre``, ``pre`` makes the module's batch: it returns the module's inputs with their
  leading batch axis, as ``example_inputs`` then show them, and ``post`` receives the outputs
  with that axis (``pre=add_batch_axis, post=first_row`` in ``pipelines/``).

Either way the module sees in process what it sees when served. Before anything is written the
module runs on a batch of one and of two rows (:func:`check_module`), and each row the pipeline
passes is checked against the example (:func:`check_row`): a module that cannot take the shapes,
or a row that does not fit them, is refused naming the operator, the shapes and the fix — not
left to PyTorch's ``mat1 and mat2 shapes cannot be multiplied`` or to Triton's refusal to load.

``dynamic_axes`` index the axes of ``example_inputs`` (and of the outputs one row gets), so
without ``pre`` axis 0 is a row's first axis, module axis 1.

This module is captured by value into ``pipe.pickle`` (rows are checked in the served pipeline
model too): torch is imported only inside the functions that run the module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from builder.errors import PipelineError

PRE_FIX = ("give pre= (and post=) to add and remove the batch axis yourself, with "
           "example_inputs holding it")


def module_examples(examples: Sequence[Any], adds_batch_axis: bool) -> tuple[Any, ...]:
    """The examples as the module takes them: a batch of one row when the builder adds it."""
    return tuple(e[None] for e in examples) if adds_batch_axis else tuple(examples)


def module_axes(dynamic_axes: Mapping[str, Sequence[int]], name: str,
                adds_batch_axis: bool) -> tuple[int, ...]:
    """The module's varying axes of tensor ``name`` (the batch axis, 0, excluded)."""
    shift = 1 if adds_batch_axis else 0
    return tuple(sorted({axis + shift for axis in dynamic_axes.get(name, ())} - {0}))


def shape_text(shape: Sequence[int]) -> str:
    """``[1, 8]``; ``-1`` where an axis varies; ``[] (a scalar)`` for no axes."""
    return f"{list(shape)}" if len(shape) else "[] (a scalar)"


def check_examples(name: str, examples: Sequence[Any], adds_batch_axis: bool) -> None:
    """Refuse examples no Triton model can declare: no batch axis where ``pre`` owns it, or an
    empty axis (Triton's dims are at least 1)."""
    for index, example in enumerate(examples):
        shape = tuple(example.shape)
        if not adds_batch_axis and not shape:
            raise PipelineError(
                f"model operator {name!r}: with pre=, example_inputs are the module's inputs "
                f"with their leading batch axis; example {index} is a scalar: give it a batch "
                "axis, or drop pre= and the builder adds the batch axis to one row"
            )
        row = shape if adds_batch_axis else shape[1:]
        if 0 in row:
            raise PipelineError(
                f"model operator {name!r}: example {index} has shape {shape_text(shape)}, with "
                "an empty axis: give an example with at least one element along each axis, "
                "and name the axes that vary in dynamic_axes"
            )


def check_axes(name: str, dynamic_axes: Mapping[str, Sequence[int]],
               shapes: Mapping[str, tuple[int, ...]],
               adds_batch_axis: bool) -> dict[str, tuple[int, ...]]:
    """``dynamic_axes`` as tuples, each naming an input or output (``shapes``: theirs, as the
    axes are counted) and axes it has; the error says how axes are counted."""
    unknown = sorted(set(dynamic_axes) - set(shapes))
    if unknown:
        raise PipelineError(
            f"model operator {name!r}: dynamic_axes names unknown tensors {unknown}; the "
            f"inputs and outputs are {list(shapes)} (keys are forward()'s argument names and "
            f"the outputs' names)")
    for tensor, axes in dynamic_axes.items():
        shape = shapes[tensor]
        for axis in axes:
            if not isinstance(axis, int) or isinstance(axis, bool) or not 0 <= axis < len(shape):
                counted = ("counted from 0 in one row as the pipeline passes it (the batch "
                           "axis the builder adds is not counted)" if adds_batch_axis else
                           "counted from 0 in the module's inputs and outputs, batch axis first")
                raise PipelineError(
                    f"model operator {name!r}: dynamic_axes[{tensor!r}] names axis {axis!r}, "
                    f"but {tensor!r} has {len(shape)} ax{'i' if len(shape) == 1 else 'e'}s "
                    f"(shape {shape_text(shape)}): axes are {counted}")
    return {tensor: tuple(axes) for tensor, axes in dynamic_axes.items()}


def check_row(name: str, input_name: str, shape: tuple[int, ...], dims: Sequence[int],
              adds_batch_axis: bool) -> None:
    """Refuse a row whose input ``shape`` does not fit the example's ``dims`` (-1 varies).

    Without ``pre`` ``shape`` is one row's; with ``pre`` it is what ``pre`` returned, batch
    axis first.
    """
    if adds_batch_axis:
        if _fits(shape, dims):
            return
        hint = (
            "example_inputs seem to hold a batch axis: without pre= they describe one row as "
            f"the pipeline passes it ({shape_text(shape)}) and the builder adds the batch axis; "
            f"give one row, or {PRE_FIX}"
            if len(dims) == len(shape) + 1 and dims[0] in (1, -1) and _fits(shape, dims[1:])
            else "give example_inputs of the shape the pipeline passes (one row, without a "
                 f"batch axis), name the axes that vary in dynamic_axes, or {PRE_FIX}"
        )
        raise PipelineError(
            f"model operator {name!r}: input {input_name!r} is {shape_text(shape)} in this row, "
            f"but example_inputs give one row as {shape_text(dims)}: {hint}"
        )
    if len(shape) == len(dims) + 1 and _fits(shape[1:], dims):
        return
    raise PipelineError(
        f"model operator {name!r}: input {input_name!r} has shape {list(shape)}, the model "
        f"takes [batch, {', '.join(map(str, dims))}] (see example_inputs and dynamic_axes): "
        "pre= returns the module's inputs with their leading batch axis"
    )


def check_module(name: str, module: Any, examples: Sequence[Any], input_names: Sequence[str],
                 adds_batch_axis: bool, output_paths: Sequence[tuple[Any, ...]],
                 output_names: Sequence[str] | None = None) -> None:
    """Run ``module`` on the examples as a batch, and on them twice as one batch: each output
    (at ``output_paths`` in its result) must be a tensor that keeps the batch axis, as a
    served model's outputs do."""
    import torch

    from builder.pipeline.module_outputs import pick

    single = module_examples(examples, adds_batch_axis)
    for inputs in (single, tuple(torch.cat([e, e]) for e in single)):
        result = run_module(name, module, inputs, input_names, adds_batch_axis)
        outputs = pick(result, output_paths)
        batch = int(inputs[0].shape[0])
        for index, output in enumerate(outputs):
            which = repr(output_names[index]) if output_names else str(index)
            if not isinstance(output, torch.Tensor):
                raise PipelineError(
                    f"model operator {name!r}: the module must return tensors (a tensor, a tuple "
                    f"of them, or a mapping such as a Hugging Face ModelOutput), got "
                    f"{type(output).__name__} for output {which}"
                )
            if output.dim() == 0 or output.shape[0] != batch:
                raise PipelineError(
                    f"model operator {name!r}: on a batch of {batch} (inputs "
                    f"{_shapes(input_names, inputs)}) the module returns output {which} of "
                    f"shape {shape_text(tuple(output.shape))}: a served model runs the rows of "
                    f"a dynamic batch as one batch, so each output needs the leading batch "
                    f"axis of its inputs"
                )


def run_module(name: str, module: Any, inputs: Sequence[Any], input_names: Sequence[str],
               adds_batch_axis: bool) -> Any:
    """``module(*inputs)`` without gradients, as the module returns it; a failure names the
    operator, the shapes it was given and why it was given them."""
    import torch

    try:
        with torch.no_grad():
            return module(*inputs)
    except Exception as error:  # noqa: BLE001 - any failure here is the module refusing them
        cause = str(error).strip().splitlines()[0] if str(error).strip() else ""
        given = _shapes(input_names, inputs)
        if adds_batch_axis:
            why = (f"one row of example_inputs with the batch axis the builder adds ({given}); "
                   "example_inputs describe one row as the pipeline passes it, without a batch "
                   f"axis: give them so, or, for a module that wants its inputs otherwise, "
                   f"{PRE_FIX}")
        else:
            why = (f"example_inputs as pre= makes the module's batch ({given}): give "
                   "example_inputs the module takes, with their leading batch axis")
        raise PipelineError(
            f"model operator {name!r}: the module fails on {why} ({type(error).__name__}: "
            f"{cause})"
        ) from error


def _fits(shape: Sequence[int], dims: Sequence[int]) -> bool:
    return len(shape) == len(dims) and all(d in (-1, s) for d, s in zip(dims, shape))


def _shapes(names: Sequence[str], arrays: Sequence[Any]) -> str:
    return ", ".join(f"{n} {list(a.shape)} {str(a.dtype).removeprefix('torch.')}"
                     for n, a in zip(names, arrays))


def row_of(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """One row's outputs out of its batch of one: the batch axis the builder added, taken off."""
    return tuple(a[0] for a in arrays)
