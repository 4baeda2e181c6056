"""The DAG under a pipeline: nodes, columns, validation, execution order and row streams.

A pipeline is a set of nodes, each reading named columns and producing new ones. A column is
produced exactly once (by a pipeline input or one node) and may be read by any number of nodes,
so the nodes form a DAG; they run in a topological order (declaration order among independent
nodes), not necessarily the order they were declared in.

Row streams ("domains"). One pipeline call starts as one row holding the input columns. ``map``
keeps the rows it reads; ``flat_map`` turns each row into zero or more rows of a new stream;
``filter`` keeps some rows in a new stream; ``stream`` makes a new stream of the items it
yields, sent as they come (:mod:`builder.pipeline.streaming`). A stream's rows each belong to
one row of its parent stream, so a node may read columns of one stream *and of its ancestors*
(a value from an ancestor row is shared by all the rows under it), never of two unrelated
streams. A pipeline output from the call's own stream (the root) is one value per call; from
any other stream it is the list of that call's rows, in order.

Every check here runs when the pipeline is defined, before anything is built, and each error
names the operator and the column.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from builder.errors import PipelineError
from builder.pipeline.operators import batch_stream, operator_name

NODE_KINDS = ("map", "flat_map", "filter", "stream")
ROOT = 0
"""The stream of the call itself: one row per call."""

_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


@dataclass(eq=False)
class Node:
    """One operator applied to columns: ``kind`` is ``map``, ``flat_map``, ``filter`` or
    ``stream``.

    For ``filter``, ``op`` is called on ``filter_columns`` and, where it returns true, the row's
    ``inputs`` are passed on under the names ``outputs``.
    """

    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    op: Callable[..., Any]
    filter_columns: tuple[str, ...] = ()
    name: str | None = None
    whole: str = "list"
    """For ``stream``: how the call answered whole gathers the items (``list``, ``join``)."""

    @property
    def op_name(self) -> str:
        return self.name or operator_name(self.op)

    @property
    def reads(self) -> tuple[str, ...]:
        """Every column the node needs: its inputs and, for a filter, the filter columns."""
        return tuple(dict.fromkeys(self.inputs + self.filter_columns))

    @property
    def label(self) -> str:
        """``'tokenize' (map text -> ids, mask)``: how errors name a node."""
        reads = ", ".join(self.inputs) or "()"
        writes = ", ".join(self.outputs)
        where = f" where {', '.join(self.filter_columns)}" if self.kind == "filter" else ""
        return f"{self.op_name!r} ({self.kind} {reads} -> {writes}{where})"


@dataclass
class Plan:
    """A validated DAG: execution order and the row stream of every node and column."""

    inputs: tuple[str, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    order: tuple[int, ...]
    node_stream: dict[int, int]
    """Index of a node → the stream it reads rows of."""
    node_output_stream: dict[int, int]
    column_stream: dict[str, int]
    stream_parent: dict[int, int] = field(default_factory=dict)
    producer: dict[str, int] = field(default_factory=dict)
    """Column → index of the node producing it (pipeline inputs are absent)."""

    def is_ragged(self, column: str) -> bool:
        """Whether a column holds a list of rows per call (it comes after a flat_map/filter)."""
        return self.column_stream[column] != ROOT

    def ancestry(self, stream: int) -> list[int]:
        """``stream`` and its ancestors, nearest first."""
        chain = [stream]
        while chain[-1] != ROOT:
            chain.append(self.stream_parent[chain[-1]])
        return chain


def compile_plan(
    inputs: Sequence[str], nodes: Sequence[Node], outputs: Sequence[str]
) -> Plan:
    """Validate a pipeline's structure and work out its execution order and row streams."""
    inputs, nodes, outputs = tuple(inputs), tuple(nodes), tuple(outputs)
    _check_names(inputs, nodes, outputs)
    producer = _producers(inputs, nodes)
    for node in nodes:
        for column in node.reads:
            if column not in producer and column not in inputs:
                raise PipelineError(
                    f"operator {node.label} reads column {column!r}, which is neither a "
                    f"pipeline input ({', '.join(inputs)}) nor produced by any operator"
                )
    for column in outputs:
        if column not in producer and column not in inputs:
            raise PipelineError(
                f"pipeline output {column!r} is neither a pipeline input nor produced by any "
                "operator"
            )
    order = _topological_order(nodes, producer)
    plan = Plan(inputs, nodes, outputs, order, {}, {}, {c: ROOT for c in inputs}, {}, producer)
    next_stream = ROOT + 1
    for index in order:
        node = nodes[index]
        stream = _deepest_stream(plan, node)
        plan.node_stream[index] = stream
        out_stream = stream
        if node.kind != "map":
            out_stream, next_stream = next_stream, next_stream + 1
            plan.stream_parent[out_stream] = stream
        plan.node_output_stream[index] = out_stream
        for column in node.outputs:
            plan.column_stream[column] = out_stream
    return plan


def _check_names(inputs: tuple[str, ...], nodes: tuple[Node, ...], outputs: tuple[str, ...]):  # noqa: C901 - issue 68: to be split
    if not inputs:
        raise PipelineError("a pipeline needs at least one input column")
    if not outputs:
        raise PipelineError("a pipeline needs at least one output column")
    for what, columns in (("input", inputs), ("output", outputs)):
        for column in columns:
            check_column(column, f"pipeline {what}")
        seen = set()
        for column in columns:
            if column in seen:
                raise PipelineError(f"duplicate pipeline {what} column {column!r}")
            seen.add(column)
    for node in nodes:
        if node.kind not in NODE_KINDS:
            raise PipelineError(f"operator {node.label}: unknown node kind {node.kind!r}")
        if not callable(node.op) and not (node.kind == "stream" and batch_stream(node.op)):
            raise PipelineError(
                f"operator {node.label} is not callable ({type(node.op).__name__})"
            )
        for column in node.reads + node.outputs:
            check_column(column, f"operator {node.label}")
        if not node.outputs:
            raise PipelineError(f"operator {node.label} produces no column")
        if len(set(node.outputs)) != len(node.outputs):
            duplicate = next(c for c in node.outputs if node.outputs.count(c) > 1)
            raise PipelineError(
                f"duplicate output: operator {node.label} produces column {duplicate!r} twice"
            )
        if node.kind == "filter":
            if len(node.inputs) != len(node.outputs):
                raise PipelineError(
                    f"operator {node.label}: a filter passes its {len(node.inputs)} input "
                    f"columns on as {len(node.outputs)} output columns; the counts must match"
                )
            if not node.filter_columns:
                raise PipelineError(f"operator {node.label}: a filter needs filter columns")


def check_column(column: Any, where: str) -> None:
    """Column names are Triton tensor names: keep them simple."""
    if not isinstance(column, str) or not _COLUMN.match(column):
        raise PipelineError(
            f"{where}: invalid column name {column!r} (a letter or '_' first, then letters, "
            "digits, '_', '.', '-')"
        )


def _producers(inputs: tuple[str, ...], nodes: tuple[Node, ...]) -> dict[str, int]:
    producer: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for column in node.outputs:
            if column in inputs:
                raise PipelineError(
                    f"duplicate output: operator {node.label} produces column {column!r}, "
                    "which is a pipeline input"
                )
            if column in producer:
                raise PipelineError(
                    f"duplicate output: column {column!r} is produced by operator "
                    f"{nodes[producer[column]].label} and by operator {node.label}"
                )
            producer[column] = index
    return producer


def _topological_order(nodes: tuple[Node, ...], producer: dict[str, int]) -> tuple[int, ...]:
    needs = {
        i: {producer[c] for c in node.reads if c in producer} for i, node in enumerate(nodes)
    }
    done: list[int] = []
    remaining = list(range(len(nodes)))
    while remaining:
        ready = next((i for i in remaining if needs[i] <= set(done)), None)
        if ready is None:
            raise PipelineError(_describe_cycle(nodes, producer, needs, remaining))
        done.append(ready)
        remaining.remove(ready)
    return tuple(done)


def _describe_cycle(nodes, producer, needs, remaining) -> str:
    """Walk dependencies among the stuck nodes until one repeats: that is a cycle."""
    path: list[int] = [remaining[0]]
    while True:
        current = path[-1]
        blocker = next(j for j in sorted(needs[current]) if j in remaining)
        if blocker in path:
            cycle = path[path.index(blocker):] + [blocker]
            break
        path.append(blocker)
    steps = []
    for a, b in zip(cycle, cycle[1:], strict=False):
        column = next(c for c in nodes[a].reads if producer.get(c) == b)
        steps.append(f"operator {nodes[a].label} needs column {column!r} from")
    return "cycle: " + " ".join(steps) + f" operator {nodes[cycle[-1]].label}"


def _deepest_stream(plan: Plan, node: Node) -> int:
    streams = {column: plan.column_stream[column] for column in node.reads}
    deepest = ROOT
    for stream in streams.values():
        if stream in plan.ancestry(deepest):
            continue
        if deepest in plan.ancestry(stream):
            deepest = stream
            continue
        first = next(c for c, s in streams.items() if s == deepest)
        second = next(c for c, s in streams.items() if s == stream)
        raise PipelineError(
            f"operator {node.label} reads columns {first!r} and {second!r}, which come from "
            "unrelated row streams (different flat_map/filter operators): their rows cannot "
            "be paired"
        )
    return deepest
