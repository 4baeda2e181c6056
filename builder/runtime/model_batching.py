"""Served batching, in one place: the rows of a dynamic batch into model calls, and back.

Copied beside the pipeline's ``model.py`` as ``triton_builder_model_batching.py``, which it imports;
like it, imports nothing from ``builder`` and loads on Python 3.8. The builder's own checks
(:mod:`builder.pipeline.row_independence`) pad with these same functions.

A model operator's rows reach :class:`BatchingRunner` as its module's inputs, batch axis first.
They go into one model call where their other axes agree (grouped by shape, in chunks of at
most the model's ``max_batch_size`` rows), and each row gets its part of the outputs back. Rows
of different lengths — texts tokenize to as many tokens as they have — would each be a call of
their own, which under load means many small calls; so where the operator declares what to pad
each input with (``ModelOp(..., pad_values={"input_ids": 0, "attention_mask": 0})``) the rows
are padded to the longest row *of their call* — not to a fixed maximum — along the axes
``dynamic_axes`` names, and each output axis that varies is cut back to the row's own length:
the length, among the inputs' padded axes, that the output's axis was padded to. A batch's rows
go into padded calls by length (:func:`length_chunks`): rows within a quarter of each other's
length share one. That is only right where the padding does not reach the answers (a mask that
hides it): the build checks it like row independence, a row padded must answer as the row alone
(:func:`builder.pipeline.row_independence.check_model`).

The operator supplies parameters only (``served``, its model's name, inputs, outputs and
``max_batch_size``; ``padding()``, its varying axes and pad values); everything done with them
is here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np


class BatchError(RuntimeError):
    """One row has more rows along the batch axis than its model takes at once."""


if TYPE_CHECKING:  # Python 3.8 cannot subscript collections.abc.Callable at run time
    Observer = Callable[[Any, int, int, Sequence[int], int, str | None], None]


class BatchingRunner:
    """Runs model operators, one model call for the rows whose non-batch shapes agree.

    ``observe`` (a trace's, :mod:`triton_builder_tracing`) is told of each model call: its
    target, when it started and ended (``time.time_ns``), the positions of the rows it
    answered (among those the runner was given), its batch size, and its error (``None``
    where it answered)."""

    def __init__(self, call: Callable[[Any, dict[str, np.ndarray]], list[np.ndarray]],
                 observe: Observer | None = None) -> None:
        self.observe = observe
        self.call: Callable[..., list[np.ndarray]] = (
            call if observe is None else self._observed(call, observe))

    @staticmethod
    def _observed(call: Callable[[Any, dict[str, np.ndarray]], list[np.ndarray]],
                  observe: Observer) -> Callable[..., list[np.ndarray]]:
        def observed(target: Any, inputs: dict[str, np.ndarray],
                     positions: Sequence[int] = (0,)) -> list[np.ndarray]:
            first = next(iter(inputs.values()), None)
            size = 0 if first is None else len(first)
            started = time.time_ns()
            try:
                outputs = call(target, inputs)
            except Exception as error:
                observe(target, started, time.time_ns(), positions, size, str(error))
                raise
            observe(target, started, time.time_ns(), positions, size, None)
            return outputs
        return observed

    def _call(self, target: Any, inputs: dict[str, np.ndarray],
              positions: Sequence[int]) -> list[np.ndarray]:
        return (self.call(target, inputs) if self.observe is None
                else self.call(target, inputs, positions))

    def infer(self, op: Any, rows: Sequence[tuple[np.ndarray, ...]]) -> list[tuple]:
        target = op.served
        if target.max_batch_size == 0:  # a model that must see one row at a time
            return [tuple(self._call(target, dict(zip(target.input_names, row)), (index,)))
                    for index, row in enumerate(rows)]
        if getattr(op, "pad_values", None) and len(rows) > 1:
            return self._padded(op, target, rows)
        if len(rows) == 1:  # a lone request: no grouping, no merging, no splitting
            (row,) = rows
            _check_row_size(row[0].shape[0], target.max_batch_size, op.name)
            return [tuple(self._call(target, dict(zip(target.input_names, row)), (0,)))]
        results: list[Any] = [None] * len(rows)
        groups: dict[tuple, list[int]] = {}
        for index, row in enumerate(rows):
            key = tuple([(a.shape[1:], a.dtype) for a in row])
            groups.setdefault(key, []).append(index)
        for members in groups.values():
            sizes = [rows[i][0].shape[0] for i in members]
            for chunk in _chunks(members, sizes, target.max_batch_size, op.name):
                merged = {
                    name: rows[chunk[0]][k] if len(chunk) == 1 else
                    np.concatenate([rows[i][k] for i in chunk])
                    for k, name in enumerate(target.input_names)
                }
                outputs = self._call(target, merged, chunk)
                for index, row_outputs in zip(chunk, _split_rows(outputs, rows, chunk)):
                    results[index] = row_outputs
        return results

    def _padded(self, op: Any, target: Any, rows: Sequence[tuple[np.ndarray, ...]],
                ) -> list[tuple]:
        """Rows whose fixed axes agree in one call, padded to the longest along the varying
        ones, and each row's outputs cut back to its own lengths."""
        inputs, outputs, values = op.padding()
        results: list[Any] = [None] * len(rows)
        groups: dict[tuple, list[int]] = {}
        for index, row in enumerate(rows):
            groups.setdefault(batch_key(row, inputs), []).append(index)
        for members in groups.values():
            for index in members:
                _check_row_size(rows[index][0].shape[0], target.max_batch_size, op.name)
            grouped = [rows[i] for i in members]
            for positions in length_chunks(grouped, inputs, target.max_batch_size):
                chunk = [members[p] for p in positions]
                merged, lengths = pad_rows([rows[i] for i in chunk], inputs, values)
                answered = self._call(target, dict(zip(target.input_names, merged)), chunk)
                cut = cut_rows(answered, [rows[i][0].shape[0] for i in chunk], lengths, outputs)
                for index, row_outputs in zip(chunk, cut):
                    results[index] = row_outputs
        return results


def _split_rows(outputs: Sequence[np.ndarray], rows: Sequence[tuple],
                chunk: list[int]) -> list[tuple]:
    """The outputs of one model call, back into one tuple of arrays per row."""
    if all(rows[i][0].shape[0] == 1 for i in chunk):  # the usual case: slicing beats np.split
        return [tuple(output[p:p + 1] for output in outputs) for p in range(len(chunk))]
    bounds = np.cumsum([rows[i][0].shape[0] for i in chunk])[:-1]
    parts = [np.split(output, bounds) for output in outputs]
    return [tuple(part[p] for part in parts) for p in range(len(chunk))]


def _chunks(members: list[int], sizes: list[int], limit: int, name: str) -> list[list[int]]:
    """Consecutive rows whose batch sizes add up to at most the model's ``max_batch_size``."""
    chunks: list[list[int]] = []
    total = 0
    for index, size in zip(members, sizes):
        _check_row_size(size, limit, name)
        if not chunks or total + size > limit:
            chunks.append([])
            total = 0
        chunks[-1].append(index)
        total += size
    return chunks


def _check_row_size(size: int, limit: int, name: str) -> None:
    if size > limit:
        raise BatchError(
            f"model operator {name!r}: one row has batch size {size}, more than the "
            f"model's max_batch_size {limit}"
        )


# -- padding --------------------------------------------------------------------------------
Axes = Sequence[Sequence[int]]
"""Per input (or output), its module axes that vary (the batch axis, 0, excluded)."""


def batch_key(row: Sequence[np.ndarray], axes: Axes) -> tuple:
    """What rows that may share a call have in common: dtypes, and sizes where they are fixed."""
    return tuple((tuple(-1 if a in varying else size for a, size in enumerate(array.shape)
                        if a > 0), array.dtype)
                 for array, varying in zip(array_row(row), axes))


FILL = 0.75
"""A row joins a call only if it is at least this share of the call's longest row: padding is
then at most a quarter of what the call computes. Chosen on BERT-base (2 CPUs, texts of 4-41
tokens, the ONNX model alone): a whole batch of 32 padded to its longest ran 25 rows/s, one call
per length 36, calls by this rule 39. Served, see BENCHMARKS.md, "Hugging Face BERT-base"."""


def length_chunks(rows: Sequence[Sequence[np.ndarray]], axes: Axes, limit: int) -> list[list[int]]:
    """The rows (indices) in calls: longest first, each call's rows within :data:`FILL` of its
    longest, and at most ``limit`` rows (their batch sizes summed) a call."""
    def length(row: Sequence[np.ndarray]) -> int:
        return max((int(np.prod([np.shape(a)[k] for k in varying])) for a, varying in
                    zip(row, axes) if varying), default=1)

    lengths = [length(row) for row in rows]
    chunks: list[list[int]] = []
    size = 0
    for index in sorted(range(len(rows)), key=lambda i: -lengths[i]):
        rows_in = int(np.shape(rows[index][0])[0])
        if (not chunks or lengths[index] < FILL * lengths[chunks[-1][0]]
                or size + rows_in > limit):
            chunks.append([])
            size = 0
        chunks[-1].append(index)
        size += rows_in
    return chunks


def pad_rows(rows: Sequence[Sequence[np.ndarray]], axes: Axes,
             values: Sequence[Any]) -> tuple[list[np.ndarray], list[dict[int, int]]]:
    """The rows' inputs concatenated along the batch axis, each padded with its value to the
    longest row along its varying axes; and per padded length, each row's own (by the padded
    length: what an output axis of that size is cut back to)."""
    merged = []
    own: list[dict[int, int]] = [{} for _ in rows]
    for k, (varying, value) in enumerate(zip(axes, values)):
        arrays = [row[k] for row in rows]
        longest = {a: max(array.shape[a] for array in arrays) for a in varying}
        padded = []
        for index, array in enumerate(arrays):
            widths = [(0, longest[a] - size if a in longest else 0)
                      for a, size in enumerate(array.shape)]
            for a in varying:
                own[index].setdefault(longest[a], array.shape[a])
            padded.append(np.pad(array, widths, constant_values=value) if any(
                w for _, w in widths) else array)
        merged.append(np.concatenate(padded) if len(padded) > 1 else padded[0])
    return merged, own


def cut_rows(outputs: Sequence[np.ndarray], sizes: Sequence[int], own: Sequence[dict[int, int]],
             axes: Axes) -> list[tuple[np.ndarray, ...]]:
    """One tuple of outputs per row (``sizes``: each row's batch size), the varying axes of each
    output cut back to the row's own length where the batch was padded to that axis's size."""
    bounds = np.cumsum(sizes)[:-1]
    parts = [np.split(output, bounds) for output in outputs]
    rows = []
    for index in range(len(sizes)):
        row = []
        for output, varying in zip(parts, axes):
            array = output[index]
            cut = tuple(slice(None) if a not in varying or size not in own[index]
                        else slice(0, own[index][size]) for a, size in enumerate(array.shape))
            row.append(array[cut])
        rows.append(tuple(row))
    return rows


def array_row(row: Sequence[Any]) -> list[np.ndarray]:
    return [np.asarray(a) for a in row]
