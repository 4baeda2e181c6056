"""Rows of different lengths in one model call: padded to the batch's longest, then cut back.

Texts tokenize to as many tokens as they have, so the rows a served batch holds differ along
the axes ``dynamic_axes`` names. Without padding each length is its own model call (rows are
stacked only where their shapes agree), which under load means many small calls. With pad
values declared per input (``ModelOp(..., pad_values={"input_ids": 0, "attention_mask": 0})``)
the rows are padded to the longest row *of their call* — not to a fixed maximum — along those
axes, and each output axis that varies is cut back to the row's own length: the length, among
the inputs' padded axes, that the output's axis was padded to. A batch's rows go into calls by
length (:func:`length_chunks`): rows within a quarter of each other's length share one.

That is only right where the padding does not reach the answers (a mask that hides it): the
build checks it like row independence, a row padded must answer as the row alone
(:func:`builder.pipeline.row_independence.check_model`).

Captured by value into ``pipe.pickle`` with the operators (the served pipeline pads): NumPy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

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


def check_pad_values(owner: str, pad_values: Mapping[str, Any], input_names: Sequence[str],
                     varying: Mapping[str, Sequence[int]]) -> dict[str, Any]:
    """Pad values for every input whose axes vary, and for no other name; numbers only."""
    from builder.errors import PipelineError

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


def array_row(row: Sequence[Any]) -> list[np.ndarray]:
    return [np.asarray(a) for a in row]
