"""Refusing operators whose rows depend on each other, before anything is built.

Served, Triton's dynamic batcher puts the rows of concurrent requests into one batch: the
pipeline model hands every row of its batch to an operator's ``call_batch`` (``@vectorized``
functions, user classes) and a model operator's module runs them as one forward pass. An
operator that computes a statistic across the batch axis (``h - h.mean(0)``, ``x / x.max()``)
or compares rows with each other (CLIP's ``logits_per_image``: every image against every text
*of the batch*) then answers each request according to the others. In process, and in a
verification that sends one request at a time, every batch is one row, so nothing shows it.

So each such operator runs once on a batch of distinct rows — the rows the pipeline's examples
give it, and copies of them perturbed (floats scaled, elements shuffled, texts rotated) — and each
row's answer is compared with that row's answer alone. An operator whose answers move is refused
with :class:`~builder.errors.RowDependenceError`, naming the operator, the output, the rows and
the fix; the opt-outs serve it one row at a time, correctly: ``op_config={"max_batch_size": 0}``
for a model operator, ``@vectorized(batch=False)`` for a batch function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from builder.errors import RowDependenceError
from builder.pipeline.module_outputs import pick
from builder.pipeline.operators import ModelFields, ModelOp, batch_stream
from builder.pipeline.streaming import collect, run_plan
from builder.pipeline.vectorized import Vectorized
from builder.runtime.model_batching import cut_rows, pad_rows

ROWS = 4
"""Distinct rows in the batch each operator is checked on."""
TOLERANCE = 1e-4
"""Relative and absolute: a batch's arithmetic may round differently from one row's."""

MODEL_FIX = ('compute each row from its own inputs only (no statistic across the batch axis), '
             'or serve the model one row at a time: op_config={"max_batch_size": 0}')
VECTORIZED_FIX = ("compute each row from its own inputs only (no statistic across the batch "
                  "axis), or call the function one row at a time: @vectorized(batch=False)")
CALL_BATCH_FIX = ("make call_batch compute each row from that row alone, or drop call_batch "
                  "(the operator is then called once per row)")


def check_row_independence(pipe: Any, tolerance: float = TOLERANCE) -> None:
    """Refuse the first operator of ``pipe`` whose rows depend on each other (see above).

    Runs the pipeline's examples once to find the rows each operator gets; model operators found
    inside other operators (a decoder in a decoding loop) are checked on their own examples.
    """
    arguments: dict[int, list[tuple]] = {}
    if pipe.examples:
        run_plan(pipe.plan, pipe.streaming, pipe.examples, arguments=arguments)
    for index, node in enumerate(pipe.nodes):
        op, rows = node.op, arguments.get(index, [])
        if isinstance(op, (ModelOp, ModelFields)) or (isinstance(op, Vectorized)
                                                       and not op.batch):
            continue  # model operators: below, with those inside other operators
        if batch_stream(op) and rows:
            _check_call_batch(Collected(op), node.label, rows, tolerance)
        elif callable(getattr(op, "call_batch", None)) and rows:
            _check_call_batch(op, node.label, rows, tolerance)
    node_rows = {id(node.op.model if isinstance(node.op, ModelFields) else node.op):
                 arguments.get(i, []) for i, node in enumerate(pipe.nodes)}
    for op in pipe.model_ops():
        if op.batches:
            check_model(op, node_rows.get(id(op), []), tolerance)


class Collected:
    """A streaming operator answered whole, each row's items as one answer: how its rows are
    compared batched and alone."""

    def __init__(self, op: Any) -> None:
        self.op = op

    def call_batch(self, rows: Sequence[tuple]) -> list[list[Any]]:
        return collect(self.op, rows)


def check_model(op: ModelOp, arguments: Sequence[tuple] = (),
                tolerance: float = TOLERANCE) -> None:
    """Run ``op``'s module on distinct module rows stacked, and on each alone; refuse a moved
    answer. ``arguments``: operator arguments the pipeline gave it (prepared as served)."""
    import torch

    batches = [tuple(e.detach().cpu().numpy() for e in op.module_examples)]
    for args in arguments:
        try:
            batches.append(op.prepare(*args))
        except Exception:  # noqa: BLE001 - a row the operator itself refuses: not a batch row
            continue
    module_rows = [tuple(a[i:i + 1] for a in batch) for batch in batches
                   for i in range(batch[0].shape[0])]
    rows = _distinct_rows(module_rows, _same_shapes)

    def forward(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        with torch.no_grad():
            outputs = pick(op.module(*(torch.from_numpy(a) for a in arrays)), op.output_paths)
        return tuple(o.detach().cpu().numpy() for o in outputs)

    def run(inputs: Sequence[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
        return forward([np.concatenate(column) for column in zip(*inputs)])

    together, rows = _run_together(run, rows, len(module_rows))
    alone = None if together is None else _answers_alone(run, rows, tolerance)
    if alone is None:
        return  # fewer than two rows, or answers that vary anyway: the export check's to report
    names = op.tensor_names_out
    moved: dict[str, list[tuple[int, str]]] = {}
    for position, answers in enumerate(alone):
        for name, batch_output, own in zip(names, together, answers, strict=True):
            mine = batch_output[position] if batch_output.shape[:1] == (len(rows),) else None
            difference = ("its batch axis is lost" if mine is None
                          else _difference(mine, own[0], tolerance))
            if difference:
                moved.setdefault(name, []).append((position, difference))
    if moved:
        name, rows_moved = next(iter(moved.items()))
        raise RowDependenceError(
            f"model operator {op.name!r}: output {name!r} of a row depends on the other rows "
            f"of its batch: {_which(rows_moved, len(rows))}. Served, a dynamic batch holds the "
            f"rows of concurrent requests, so each answer would depend on other users' "
            f"requests: {MODEL_FIX}")
    if op.pad_values:
        _check_padding(op, rows[0], forward, run, tolerance)


def _check_padding(op: ModelOp, row: tuple[np.ndarray, ...], forward: Any, run: Any,
                   tolerance: float) -> None:
    """Rows shorter than ``row`` along the varying axes, padded with it into one batch, must
    each answer as alone, padded as the served batch pads them
    (:mod:`builder.runtime.model_batching`)."""
    inputs, outputs, values = op.padding()
    shorter: list[tuple[np.ndarray, ...]] = []
    for cut in range(1, ROWS):
        short = tuple(array[tuple(slice(0, max(1, size - cut)) if a in varying else slice(None)
                                  for a, size in enumerate(array.shape))]
                      for array, varying in zip(row, inputs))
        if not any(same_value(short, known) for known in (row, *shorter)):
            shorter.append(short)
    if not shorter:
        return
    batch = [row, *shorter]
    merged, lengths = pad_rows(batch, inputs, values)
    padded = cut_rows(forward(merged), [1] * len(batch), lengths, outputs)
    names = op.tensor_names_out
    for position, (answer, alone) in enumerate(zip(padded, (run([r]) for r in batch))):
        for name, got, want in zip(names, answer, alone):
            difference = _difference(got, want, tolerance)
            if difference:
                lengths_text = ", ".join(str(list(r[0].shape[1:])) for r in batch)
                raise RowDependenceError(
                    f"model operator {op.name!r}: padded to the batch's longest, a row answers "
                    f"otherwise than alone: output {name!r} of row {position} "
                    f"({difference}) in a batch of rows of shapes {lengths_text}. Give "
                    f"pad_values the module ignores (0 where attention_mask hides the "
                    f"padding), or drop pad_values: rows of each length then get their own "
                    f"model call")


def _check_call_batch(op: Any, label: str, arguments: Sequence[tuple],
                      tolerance: float) -> None:
    rows = _distinct_rows([tuple(args) for args in arguments], _same_kinds)
    together, rows = _run_together(lambda batch: list(op.call_batch(list(batch))), rows,
                                   len(arguments))
    alone = (None if together is None or len(together) != len(rows)
             else _answers_alone(op.call_batch, rows, tolerance))
    if alone is None:
        return  # too few rows, a wrong count or answers that vary: not the other rows' doing
    moved = []
    for position, answers in enumerate(alone):
        difference = _difference(together[position], answers[0], tolerance)
        if difference:
            moved.append((position, difference))
    if moved:
        fix = VECTORIZED_FIX if isinstance(op, Vectorized) else CALL_BATCH_FIX
        kind = "vectorized operator" if isinstance(op, Vectorized) else "operator"
        raise RowDependenceError(
            f"{kind} {label}: a row's result depends on the other rows "
            f"of its batch: {_which(moved, len(rows))}. Served, the pipeline model runs the "
            f"rows of concurrent requests as one batch, so each answer would depend on other "
            f"users' requests: {fix}")


def _answers_alone(run: Any, rows: list[tuple], tolerance: float) -> list[Any] | None:
    """``run([row])`` for each row, or ``None`` where the first row's answer differs between two
    runs (answers that vary anyway). The first of those two runs is the first row's answer: a
    run can be a whole stream."""
    first = run(rows[:1])
    if _difference(first, run(rows[:1]), tolerance):
        return None
    return [first, *(run([row]) for row in rows[1:])]


def _run_together(run: Any, rows: list[tuple], originals: int) -> tuple[Any, list[tuple]]:
    """``run(rows)``; where a perturbed row makes it fail, the original rows alone."""
    for candidate in (rows, rows[:originals]):
        if len(candidate) < 2:
            return None, candidate
        try:
            return run(candidate), candidate
        except Exception:  # noqa: BLE001 - perturbed rows the operator refuses: fewer rows
            continue
    return None, rows


def _distinct_rows(rows: list[tuple], compatible: Any) -> list[tuple]:
    """Up to :data:`ROWS` different rows that can share a batch: the given ones first, then
    perturbed copies of them."""
    if not rows:
        return []
    chosen: list[tuple] = []
    for row in [*rows, *(perturb(rows[k % len(rows)], k + 1) for k in range(ROWS))]:
        if len(chosen) == ROWS:
            break
        if compatible(row, rows[0]) and not any(same_value(row, c) for c in chosen):
            chosen.append(row)
    return chosen


def perturb(value: Any, k: int) -> Any:
    """A different value of the same type, shape and kind: floats scaled by ``1 + k/2`` and
    shuffled, integers and booleans shuffled (token ids stay in the vocabulary), texts rotated
    by ``k`` characters; anything else (encoded bytes) as it is."""
    if isinstance(value, tuple):
        return tuple(perturb(v, k) for v in value)
    if isinstance(value, list):
        return [perturb(v, k) for v in value]
    if isinstance(value, str):
        return value[k % len(value):] + value[:k % len(value)] if value else value
    if type(value).__module__.startswith("torch") and hasattr(value, "numpy"):
        import torch

        return torch.from_numpy(perturb(value.detach().cpu().numpy(), k))
    if isinstance(value, (np.ndarray, np.generic, float)) and not isinstance(value, bool):
        array = np.asarray(value)
        if array.dtype.kind not in "fciub":
            return value
        if array.dtype.kind in "fc":
            array = array * (1 + k / 2)
        if array.ndim:
            flat = array.reshape(-1).copy()
            np.random.default_rng(k).shuffle(flat)
            array = flat.reshape(array.shape)
        array = array.astype(np.asarray(value).dtype)
        return array if isinstance(value, np.ndarray) else type(value)(array)
    return value


def same_value(a: Any, b: Any) -> bool:
    """Whether two values (arrays, texts, tuples of them…) are equal, exactly."""
    return _difference(a, b, 0.0) is None


def _difference(got: Any, want: Any, tolerance: float) -> str | None:
    """How ``got`` differs from ``want`` (``None``: it does not), through tuples, lists and
    mappings."""
    if isinstance(want, Mapping):
        if not isinstance(got, Mapping) or list(got) != list(want):
            return "its keys differ"
        return next((f"[{k!r}] {d}" for k in want
                     if (d := _difference(got[k], want[k], tolerance))), None)
    if isinstance(want, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            return f"{_length(got)} items against {len(want)}"
        return next((f"[{i}] {d}" for i, (g, w) in enumerate(zip(got, want))
                     if (d := _difference(g, w, tolerance))), None)
    if isinstance(want, (str, bytes)) or want is None:
        return None if got == want else f"{got!r:.40} against {want!r:.40}"
    got, want = _array(got), _array(want)
    if got.shape != want.shape:
        return f"shape {list(got.shape)} against {list(want.shape)}"
    if want.dtype.kind in "fc" and got.dtype.kind in "fc":
        if np.allclose(got, want, rtol=tolerance, atol=tolerance, equal_nan=True):
            return None
        return f"by up to {float(np.max(np.abs(got.astype(np.float64) - want))):.3g}"
    return None if np.array_equal(got, want) else "its values differ"


def _array(value: Any) -> np.ndarray:
    if type(value).__module__.startswith("torch") and hasattr(value, "numpy"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _length(value: Any) -> str:
    return str(len(value)) if isinstance(value, (tuple, list)) else type(value).__name__


def _same_shapes(row: tuple, first: tuple) -> bool:
    return all(a.shape[1:] == b.shape[1:] and a.dtype == b.dtype for a, b in zip(row, first))


def _same_kinds(row: tuple, first: tuple) -> bool:
    """Rows a batch function takes together: arrays of the same shapes and dtypes."""
    return all(type(a) is type(b) and (not isinstance(a, np.ndarray)
                                       or (a.shape == b.shape and a.dtype == b.dtype))
               for a, b in zip(row, first))


def _which(moved: Sequence[tuple[int, str]], count: int) -> str:
    rows = ", ".join(str(position) for position, _ in moved)
    return (f"with {count} distinct rows in one batch, row{'s' if len(moved) > 1 else ''} "
            f"{rows} differ{'' if len(moved) > 1 else 's'} from the same row run alone "
            f"({moved[0][1]})")
