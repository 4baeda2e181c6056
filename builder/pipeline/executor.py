"""Running a pipeline's DAG over many calls at once, node by node.

Why one executor for everything: the in-process call ``pipe(x)`` and the served pipeline model
(which receives a dynamic batch of requests, each holding a batch of calls) run the very same
code; only the runner behind model operators differs (torch here, BLS in Triton). So the served
result can differ from the reference only where the model's numerics do.

Running node by node over the rows of *all* calls is what lets a model operator see every row of
a dynamic batch at once and make one model call for them (see ``call_batch`` in
:mod:`builder.pipeline.operators`). A failure is confined to the call it happened in: that call is
dropped from the remaining nodes and reported, the others go on. When a batched operator call
fails, its rows are re-run one by one so that only the calls that fail on their own get the error.
An operator that refuses its input (:mod:`builder.pipeline.rejection`) fails the call as the
caller's mistake, not as a fault of the operator.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from builder.errors import InputError, OperatorError, PipelineError
from builder.pipeline.dag import ROOT, Node, Plan
from builder.pipeline.rejection import rejected, rejection

if TYPE_CHECKING:
    from builder.runtime.operator_metrics import OperatorTimes


class NodeTrace(Protocol):
    """What a trace of a served batch is told about each node it runs
    (:class:`builder.runtime.tracing.BatchTrace`); the executor imports nothing to tell it."""

    def node(self, index: int, started_ns: int, ended_ns: int, calls: list[int],
             failures: dict[int, tuple[str, str]]) -> None:
        """Node ``index`` ran on rows of ``calls`` (one entry per row); ``failures``: each call
        it failed → ``("rejected" | "failed", message)``."""

    def rows(self, calls: list[int]) -> Any:
        """A context manager around one ``call_batch`` of rows of ``calls`` (one per row): the
        model calls made inside are those rows'."""


class Row:
    """One row of a stream: the call it belongs to, its parent row, the columns it holds."""

    __slots__ = ("call", "parent", "values")

    def __init__(self, call: int, parent: Row | None, values: dict[str, Any]) -> None:
        self.call = call
        self.parent = parent
        self.values = values

    def get(self, column: str) -> Any:
        row: Row | None = self
        while row is not None:
            if column in row.values:
                return row.values[column]
            row = row.parent
        raise KeyError(column)  # compile_plan guarantees every column read is reachable


@dataclass
class CallResult:
    """The outcome of one call: ``outputs`` by column, or the ``error`` that stopped it (its
    outputs then empty)."""

    outputs: dict[str, Any] = field(default_factory=dict)
    error: OperatorError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def execute(plan: Plan, calls: Sequence[Sequence[Any]],
            times: Sequence[OperatorTimes] | None = None,
            arguments: dict[int, list[tuple]] | None = None,
            trace: NodeTrace | None = None) -> list[CallResult]:
    """Run ``calls`` (one tuple of input values each) through ``plan``; one result per call.

    Outputs from the root stream are single values; from other streams, lists of rows.
    ``times`` (one :class:`~builder.runtime.operator_metrics.OperatorTimes` per node of the
    plan) accumulates how long each node ran, each call's seconds, on how many rows, and how
    many calls it refused as bad input or failed: the served pipeline reports them as metrics.
    ``arguments`` collects each node's argument rows by node index (the build's
    row-independence check replays them). ``trace`` is told what each node ran and failed.
    """
    if any(node.kind == "stream" for node in plan.nodes):
        raise PipelineError("a streaming plan runs through builder.pipeline.streaming.run_plan")
    streams, failed = start_rows(plan, calls)
    run_nodes(plan, plan.order, streams, failed, times, arguments, trace)
    by_call: dict[int, dict[int, list[Row]]] = {}  # stream -> call -> its rows, in order
    for column in plan.outputs:
        stream = plan.column_stream[column]
        if stream != ROOT and stream not in by_call:
            by_call[stream] = {}
            for row in streams[stream]:
                by_call[stream].setdefault(row.call, []).append(row)
    roots = streams[ROOT]
    results = []
    for call in range(len(calls)):
        if call in failed:
            results.append(CallResult(error=failed[call]))
            continue
        outputs = {}
        for column in plan.outputs:
            stream = plan.column_stream[column]
            if stream == ROOT:
                outputs[column] = roots[call].get(column)
            else:
                outputs[column] = [r.get(column) for r in by_call[stream].get(call, ())]
        results.append(CallResult(outputs=outputs))
    return results


def start_rows(plan: Plan, calls: Sequence[Sequence[Any]], first: int = 0,
               ) -> tuple[dict[int, list[Row]], dict[int, OperatorError]]:
    """The root stream of ``calls`` (one row each, numbered from ``first``) and the empty
    record of failed calls."""
    return {ROOT: [Row(i, None, dict(zip(plan.inputs, call, strict=True)))
                   for i, call in enumerate(calls, start=first)]}, {}


def run_nodes(plan: Plan, indices: Sequence[int], streams: dict[int, list[Row]],
              failed: dict[int, OperatorError], times: Sequence[OperatorTimes] | None = None,
              arguments: dict[int, list[tuple]] | None = None,
              trace: NodeTrace | None = None) -> None:
    """Run the nodes ``indices`` (in that order) over ``streams``, adding the streams they
    make; a call that fails is recorded in ``failed`` and dropped from later nodes; ``trace``
    is told when each node ran, on which calls' rows, and which calls it failed."""
    for index in indices:
        node = plan.nodes[index]
        rows = streams.get(plan.node_stream[index], [])
        if failed:
            rows = [r for r in rows if r.call not in failed]
        if arguments is not None:
            arguments.setdefault(index, []).extend(argument_rows(
                rows, node.filter_columns if node.kind == "filter" else node.inputs))
        started_ns, before = (0 if trace is None else time.time_ns()), len(failed)
        if times is None:
            produced = _run_node(node, rows, failed, trace)
        else:
            started = time.perf_counter()
            produced = _run_node(node, rows, failed, trace)
            spent = times[index]
            spent.record(time.perf_counter() - started, len(rows))
            for error in list(failed.values())[before:]:  # this node's: failed only grows
                if isinstance(error, InputError):
                    spent.rejected += 1
                else:
                    spent.failed += 1
        if trace is not None:
            trace.node(index, started_ns, time.time_ns(), [r.call for r in rows], {
                call: ("rejected" if isinstance(error, InputError) else "failed", str(error))
                for call, error in list(failed.items())[before:]})
        if node.kind != "map":
            streams[plan.node_output_stream[index]] = produced


def _run_node(node: Node, rows: list[Row], failed: dict[int, OperatorError],
              trace: NodeTrace | None = None) -> list[Row]:
    """Apply one node to its rows; return the rows of its new stream (flat_map, filter)."""
    columns = node.filter_columns if node.kind == "filter" else node.inputs
    values, errors = _call(node, argument_rows(rows, columns),
                           None if trace is None else (trace, [r.call for r in rows]))
    if node.kind == "map" and len(node.outputs) == 1 and not errors:  # the common case
        (column,) = node.outputs
        for row, value in zip(rows, values, strict=True):
            row.values[column] = value
        return []
    produced: list[Row] = []
    for index, (row, value) in enumerate(zip(rows, values, strict=True)):
        if row.call in failed:  # an earlier row of the same call failed in this node
            continue
        if index in errors:
            failed[row.call] = failure(node, errors[index])
            continue
        try:
            if node.kind == "map":
                row.values.update(unpack(node, value))
            elif node.kind == "flat_map":
                produced.extend(Row(row.call, row, unpack(node, item)) for item in
                                _iterate(node, value))
            elif _truth(node, value):
                passed = {out: row.get(col) for col, out in
                          zip(node.inputs, node.outputs, strict=True)}
                produced.append(Row(row.call, row, passed))
        except Exception as error:  # noqa: BLE001 - e.g. a generator raising mid-way
            failed[row.call] = failure(node, error)
    return [r for r in produced if r.call not in failed]


def argument_rows(rows: Sequence[Row], columns: Sequence[str]) -> list[tuple]:
    """Each row's values of ``columns``, as the operator's arguments."""
    if len(columns) == 1:
        (column,) = columns
        return [(r.get(column),) for r in rows]
    return [tuple([r.get(c) for c in columns]) for r in rows]


def _call(node: Node, argument_rows: list[tuple],
          traced: tuple[NodeTrace, list[int]] | None = None,
          ) -> tuple[list[Any], dict[int, BaseException]]:
    """Call the operator on every row, batched when it offers ``call_batch``: each row's
    value, and the errors of the rows that failed, by position. ``traced``: the trace and
    each row's call, told which rows each ``call_batch`` is of."""
    if not argument_rows:
        return [], {}
    batch = getattr(node.op, "call_batch", None)
    if callable(batch) and traced is not None:
        batch = _traced_batch(batch, *traced)
    if callable(batch):
        try:
            results = list(batch(argument_rows))
        except Exception as error:  # noqa: BLE001 - attributed per row below
            if len(argument_rows) == 1:
                return [None], {0: error}
        else:
            if len(results) != len(argument_rows):
                wrong = _attributed(
                    f"operator {node.label}: call_batch returned {len(results)} results "
                    f"for {len(argument_rows)} rows"
                )
                errors: dict[int, BaseException] = dict.fromkeys(range(len(argument_rows)),
                                                                  wrong)
                return [None] * len(argument_rows), errors
            return results, {}
        return _call_each(lambda *args: batch([args])[0], argument_rows)
    return _call_each(node.op, argument_rows)


def _traced_batch(batch: Any, trace: NodeTrace, calls: list[int]) -> Any:
    """``batch`` telling ``trace`` whose rows each of its calls holds: all of them, or, where
    a failed batch is run again row by row, the one row's call."""
    def traced(rows: list[tuple]) -> Any:
        whose = calls if len(rows) == len(calls) else [calls[positions.pop(0)]]
        with trace.rows(whose):
            return batch(rows)

    positions = list(range(len(calls)))
    return traced


def _call_each(function: Any,
               argument_rows: list[tuple]) -> tuple[list[Any], dict[int, BaseException]]:
    values: list[Any] = []
    errors: dict[int, BaseException] = {}
    for index, args in enumerate(argument_rows):
        try:
            values.append(function(*args))
        except Exception as error:  # noqa: BLE001 - reported as this call's error
            values.append(None)
            errors[index] = error
    return values, errors


def _attributed(message: str) -> OperatorError:
    """An error the executor itself words, already naming the operator."""
    error = OperatorError(message)
    error.attributed = True
    return error


def failure(node: Node, error: BaseException) -> OperatorError:
    """The error a call reports: the operator, its columns and what it raised; a refusal of
    the input when the operator declared that exception as one."""
    if isinstance(error, OperatorError) and error.attributed:
        return error
    failure: OperatorError
    if rejected(node.op, error):
        columns = node.filter_columns if node.kind == "filter" else node.inputs
        failure = rejection(node.label, tuple(columns), error)
        failure.attributed = True
    else:
        failure = _attributed(f"operator {node.label} failed: {type(error).__name__}: {error}")
    failure.__cause__ = error
    return failure


def unpack(node: Node, value: Any) -> dict[str, Any]:
    if len(node.outputs) == 1:
        return {node.outputs[0]: value}
    if not isinstance(value, (tuple, list)) or len(value) != len(node.outputs):
        got = f"{len(value)} values" if isinstance(value, (tuple, list)) else (
            f"one {type(value).__name__}")
        raise _attributed(
            f"operator {node.label} returned {got} for {len(node.outputs)} output columns "
            f"({', '.join(node.outputs)}); return a tuple of {len(node.outputs)}"
        )
    return dict(zip(node.outputs, value, strict=True))


def _iterate(node: Node, value: Any) -> list[Any]:
    try:
        iterator = iter(value)
    except TypeError:
        raise _attributed(
            f"operator {node.label}: a flat_map operator returns an iterable of rows, got "
            f"{type(value).__name__}"
        ) from None
    return list(iterator)  # a generator's own error is the operator's failure


def _truth(node: Node, value: Any) -> bool:
    try:
        return bool(value)
    except Exception as error:  # noqa: BLE001 - e.g. a NumPy array of several booleans
        raise _attributed(
            f"operator {node.label}: a filter operator returns true or false, got "
            f"{type(value).__name__} ({error})"
        ) from error
