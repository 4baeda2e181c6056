"""The pipeline DSL, in the spirit of Towhee's, and the :class:`Pipeline` it builds.

>>> p = (pipe.input('text')
...      .map('text', ('ids', 'mask'), tokenize)
...      .map(('ids', 'mask'), 'hidden', encoder)       # a ModelOp
...      .map(('hidden', 'mask'), 'vec', mean_pool)
...      .output('vec'))
>>> p('hello world')                                    # runs in process: the reference

Semantics (see :mod:`builder.pipeline.dag` for the row streams):

* ``map(inputs, outputs, op)`` — ``op(*inputs)`` per row; several outputs → return a tuple.
* ``flat_map(inputs, outputs, op)`` — ``op(*inputs)`` returns an iterable; each item becomes a
  row of a new stream (a tuple per item when there are several outputs).
* ``filter(inputs, outputs, filter_columns, op)`` — keeps the rows where ``op(*filter_columns)``
  is true, passing ``inputs`` on as ``outputs`` in a new stream. ``filter(inputs, outputs, op)``
  filters on the inputs themselves.
* ``stream(inputs, outputs, op)`` — like ``flat_map``, but each item is the pipeline's answer
  the moment it is made: ``p.stream(*inputs)`` yields them, served they are streamed (see
  :mod:`builder.pipeline.streaming`); only ``map`` operators may follow, on each item.
* ``output(*columns)`` — ``p(*inputs)`` returns the value of the only output column, or a tuple
  of them; an output after a ``flat_map``/``filter`` is the *list* of that call's rows.

Columns are names (a ``str``, or a tuple of them for several). Builders are immutable, so one
prefix can grow several pipelines. Structure is validated by ``output()``; types by
:meth:`Pipeline.signature`, which runs the examples given with :meth:`Pipeline.with_example`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from builder.errors import OperatorError, PipelineError, SignatureError
from builder.pipeline.dag import Node, Plan, check_column, compile_plan
from builder.pipeline.executor import CallResult, NodeTrace
from builder.pipeline.model_discovery import find_model_ops
from builder.pipeline.operators import ModelOp, fields_by_column
from builder.pipeline.signature import (
    WHOLE_ANSWERS,
    PipelineSignature,
    TensorSpec,
    as_spec,
    fits,
    infer_spec,
    merge_tensor_specs,
    whole_answer,
)
from builder.pipeline.streaming import (
    StreamEvent,
    StreamPart,
    admits_rows,
    execute_stream,
    run_plan,
    stream_part,
)

if TYPE_CHECKING:
    from builder.runtime.operator_metrics import OperatorTimes

Columns = str | Sequence[str]


class Pipeline:
    """A validated pipeline: callable in process, and what ``build_pipeline_model`` serves."""

    def __init__(
        self,
        inputs: Sequence[str],
        nodes: Sequence[Node],
        outputs: Sequence[str],
        *,
        input_schema: Mapping[str, Any] | None = None,
        output_schema: Mapping[str, Any] | None = None,
        examples: Sequence[tuple[Any, ...]] = (),
    ) -> None:
        self.plan: Plan = compile_plan(inputs, nodes, outputs)
        self.streaming: StreamPart | None = stream_part(self.plan)
        """Where the pipeline streams its answer; ``None`` when it answers once."""
        self.input_schema = _schema(input_schema, self.plan.inputs, "input")
        self.output_schema = _schema(output_schema, self.plan.outputs, "output")
        self.examples: tuple[tuple[Any, ...], ...] = tuple(tuple(e) for e in examples)
        for example in self.examples:
            self._check_arity(example)
        self._signature: PipelineSignature | None = None
        self.model_ops()  # fails early on clashing model names

    # -- what it is ------------------------------------------------------------------------
    @property
    def inputs(self) -> tuple[str, ...]:
        return self.plan.inputs

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.plan.outputs

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.plan.nodes

    def __repr__(self) -> str:
        steps = " -> ".join(self.nodes[i].label for i in self.plan.order)
        return f"Pipeline({', '.join(self.inputs)} -> {steps} -> {', '.join(self.outputs)})"

    def model_ops(self) -> list[ModelOp]:
        """The model operators, including those inside other operators (a decoder in a loop)."""
        ops = find_model_ops([node.op for node in self.nodes])
        by_name: dict[str, ModelOp] = {}
        for op in ops:
            if op.name in by_name:
                raise PipelineError(
                    f"two different model operators are named {op.name!r}: each becomes its "
                    "own Triton model, give them distinct names (ModelOp(..., name=...))"
                )
            by_name[op.name] = op
        return ops

    # -- running in process ----------------------------------------------------------------
    def __call__(self, *values: Any) -> Any:
        """Run one call in process and return its output value(s): the reference result."""
        self._check_arity(values)
        result = run_plan(self.plan, self.streaming, [values])[0]
        if result.error is not None:
            raise result.error
        return self._whole_result(result)

    def stream(self, *values: Any) -> Iterator[Any]:
        """Run one call in process and yield each streamed item as it is made: the output
        value(s) of that item, as ``pipe(*values)`` would return them for it alone.

        Closing the iterator early stops the streaming operator (as a served stream cancelled).
        """
        self._check_arity(values)
        if self.streaming is None:
            raise PipelineError(f"{self!r} does not stream: no operator is added with "
                                ".stream(...); call it, pipe(*values), for its one answer")
        events = execute_stream(self.plan, self.streaming, [values])
        try:
            for event in events:
                if event.error is not None:
                    raise event.error
                if not event.final:
                    yield self._shape_result(event)
        finally:
            events.close()

    def batch(self, calls: Sequence[Sequence[Any]], *, return_exceptions: bool = False) -> list:
        """Run several calls together (model operators batch their rows), results in order.

        Each call is a tuple of input values; a one-input pipeline also takes plain values
        (so a tuple *value* for a one-input pipeline is written ``(value,)``).
        """
        if len(self.inputs) == 1:
            calls = [c if isinstance(c, tuple) else (c,) for c in calls]
        rows = [tuple(c) for c in calls]
        for values in rows:
            self._check_arity(values)
        results = []
        for result in self.run(rows):
            if result.error is None:
                results.append(self._whole_result(result))
            elif return_exceptions:
                results.append(result.error)
            else:
                raise result.error
        return results

    def run(self, calls: Sequence[tuple[Any, ...]],
            times: Sequence[OperatorTimes] | None = None,
            trace: NodeTrace | None = None) -> list[CallResult]:
        """Run calls and return each one's outputs or error (what the served model does);
        ``times`` and ``trace``: see :func:`~builder.pipeline.executor.execute`."""
        return run_plan(self.plan, self.streaming, calls, times, trace=trace)

    def run_stream(self, calls: Sequence[tuple[Any, ...]],
                   times: Sequence[OperatorTimes] | None = None,
                   stopped: Callable[[], Any] | None = None,
                   arrivals: Callable[[], Sequence[tuple[Any, ...]]] | None = None,
                   ) -> Iterator[StreamEvent]:
        """Run calls of a streaming pipeline, yielding their items as they are made (what the
        served, decoupled model does); ``stopped()`` names the calls to end (cancelled),
        ``arrivals()`` the calls that join between steps where the streaming operator admits
        rows (:attr:`admits_streams`)."""
        if self.streaming is None:
            raise PipelineError(f"{self!r} does not stream")
        return execute_stream(self.plan, self.streaming, calls, times, stopped,
                              arrivals=arrivals)

    @property
    def admits_streams(self) -> bool:
        """Whether streams that arrive while others run join their loop (the streaming
        operator admits rows between steps: :func:`~builder.pipeline.streaming.admits_rows`)."""
        return self.streaming is not None and admits_rows(
            self.plan.nodes[self.streaming.node].op)

    @property
    def whole(self) -> str:
        """How a call answered whole gathers each streamed output's items
        (:data:`~builder.pipeline.signature.WHOLE_ANSWERS`; ``list`` where nothing streams)."""
        return "list" if self.streaming is None else self.plan.nodes[self.streaming.node].whole

    def _whole_result(self, result: CallResult) -> Any:
        """A call's result answered whole: each streamed output's items gathered."""
        if self.whole != "list":
            result = CallResult({column: whole_answer(self.whole, items) if self._streamed(
                column) else items for column, items in result.outputs.items()})
        return self._shape_result(result)

    def _shape_result(self, result: Any) -> Any:
        values = tuple(result.outputs[c] for c in self.outputs)
        return values[0] if len(values) == 1 else values

    def _check_arity(self, values: tuple[Any, ...]) -> None:
        if len(values) != len(self.inputs):
            raise PipelineError(
                f"the pipeline takes {len(self.inputs)} inputs ({', '.join(self.inputs)}), "
                f"got {len(values)}"
            )

    # -- types -----------------------------------------------------------------------------
    def with_example(self, *values: Any) -> Pipeline:
        """A copy with one more example call, used to infer and check types at build time."""
        return Pipeline(
            self.inputs, self.nodes, self.outputs,
            input_schema=self.input_schema, output_schema=self.output_schema,
            examples=(*self.examples, values),
        )

    def signature(self) -> PipelineSignature:
        """The Triton type of every input and output: declared, else inferred from examples.

        Runs every example: an operator failing on one is reported with the example.
        """
        if self._signature is None:
            self._signature = self._infer_signature()
        return self._signature

    def _infer_signature(self) -> PipelineSignature:
        if not self.examples:
            missing = [c for c in self.inputs if c not in self.input_schema] + [
                c for c in self.outputs if c not in self.output_schema
            ]
            if missing:
                raise SignatureError(
                    f"the types of {', '.join(repr(c) for c in missing)} are unknown: give an "
                    "example call with pipeline.with_example(...) or declare them with "
                    "schema={...} in input()/output()"
                )
        results = run_plan(self.plan, self.streaming, self.examples)
        for number, (example, result) in enumerate(zip(self.examples, results, strict=True), 1):
            if result.error is not None:
                error = OperatorError(f"{result.error} (on example {number}: {_short(example)})")
                raise error from result.error.__cause__ or result.error
        inputs = {
            column: self._column_spec(
                column, self.input_schema.get(column), False,
                [example[i] for example in self.examples],
            )
            for i, column in enumerate(self.inputs)
        }
        outputs = {}
        for column in self.outputs:
            values = [r.outputs[column] for r in results]
            if self.plan.is_ragged(column):
                values = [row for rows in values for row in rows]
            ragged = self.plan.is_ragged(column) and not self._streamed(column)
            outputs[column] = self._column_spec(
                column, self.output_schema.get(column), ragged, values
            )
        streamed = tuple(c for c in self.outputs if self._streamed(c))
        if self.whole == "join":
            for column in streamed:
                spec = outputs[column]
                if spec.kind != "scalar" or spec.pytype not in ("str", "bytes"):
                    raise SignatureError(
                        f"output {column!r} is streamed as {spec.describe()} items, but "
                        "stream(..., whole='join') joins texts or bytes: each item one str "
                        "(or bytes), or whole='list'")
        return PipelineSignature(inputs, outputs, streamed, self.whole)

    def _streamed(self, column: str) -> bool:
        """Whether ``column`` is sent item by item (one value per response when served)."""
        return self.streaming is not None and (
            self.plan.column_stream[column] == self.streaming.items)

    def _column_spec(
        self, column: str, declared: TensorSpec | None, ragged: bool, values: list[Any]
    ) -> TensorSpec:
        if declared is not None:
            spec = replace(declared, ragged=False)
            for value in values:
                if not fits(spec, value):
                    raise SignatureError(
                        f"column {column!r} is declared {spec.describe()} but an example gives "
                        f"{_short(value)}"
                    )
            return replace(spec, ragged=ragged)
        if not values:
            raise SignatureError(
                f"column {column!r} has no rows in any example, so its type is unknown: add an "
                "example that produces rows or declare it with output(..., schema={...})"
            )
        spec = infer_spec(values[0], column)
        for value in values[1:]:
            spec = merge_tensor_specs(spec, infer_spec(value, column), column)
        return replace(spec, ragged=ragged)


class PipeBuilder:
    """A pipeline under construction; every step returns a new builder."""

    def __init__(
        self, inputs: tuple[str, ...], schema: Mapping[str, Any], nodes: tuple[Node, ...] = ()
    ) -> None:
        self._inputs = inputs
        self._schema = dict(schema)
        self._nodes = nodes

    def _add(self, node: Node) -> PipeBuilder:
        return PipeBuilder(self._inputs, self._schema, (*self._nodes, node))

    def map(self, inputs: Columns, outputs: Columns, op: Callable[..., Any], *,
            name: str | None = None) -> PipeBuilder:
        """``outputs = op(*inputs)`` for every row. A model operator whose module returns named
        fields (a Hugging Face ``ModelOutput``) gives the ones ``outputs`` name."""
        outputs = _columns(outputs)
        return self._add(Node("map", _columns(inputs), outputs, fields_by_column(op, outputs),
                              name=name))

    def flat_map(self, inputs: Columns, outputs: Columns, op: Callable[..., Any], *,
                 name: str | None = None) -> PipeBuilder:
        """Each item of ``op(*inputs)`` becomes a row of a new stream."""
        return self._add(Node("flat_map", _columns(inputs), _columns(outputs), op, name=name))

    def stream(self, inputs: Columns, outputs: Columns, op: Callable[..., Any], *,
               name: str | None = None, whole: str = "list") -> PipeBuilder:
        """Each item ``op(*inputs)`` yields is an answer of its own, sent as it is made: a
        generator, or a generator ``call_batch`` yielding one step of every row at a time
        (:mod:`builder.pipeline.streaming`). ``whole``: what the call answered whole
        (``pipe(x)``) gives for each output: the ``list`` of its items, or (``join``) their
        texts joined into one."""
        if whole not in WHOLE_ANSWERS:
            raise PipelineError(f"stream(..., whole={whole!r}): expected one of "
                                f"{', '.join(WHOLE_ANSWERS)}")
        return self._add(Node("stream", _columns(inputs), _columns(outputs), op, name=name,
                              whole=whole))

    def filter(self, inputs: Columns, outputs: Columns, filter_columns: Columns | Callable,
               op: Callable[..., Any] | None = None, *, name: str | None = None) -> PipeBuilder:
        """Rows where ``op(*filter_columns)`` is true, with ``inputs`` renamed ``outputs``."""
        if op is None:
            if not callable(filter_columns):
                raise PipelineError("filter(inputs, outputs, filter_columns, op): op is missing")
            op, filter_columns = filter_columns, inputs
        return self._add(Node("filter", _columns(inputs), _columns(outputs), op,
                              filter_columns=_columns(filter_columns), name=name))

    def output(self, *columns: str, schema: Mapping[str, Any] | None = None) -> Pipeline:
        """Finish: validate the DAG and return the :class:`Pipeline`."""
        flat = tuple(c for column in columns for c in _columns(column))
        return Pipeline(self._inputs, self._nodes, flat, input_schema=self._schema,
                        output_schema=schema)


class _Pipe:
    """The entry point, ``pipe.input(...)``, as in Towhee."""

    def input(self, *columns: str, schema: Mapping[str, Any] | None = None) -> PipeBuilder:
        """Start a pipeline with these input columns; ``schema`` declares their types."""
        flat = tuple(c for column in columns for c in _columns(column))
        if not flat:
            raise PipelineError("pipe.input() needs at least one column")
        for column in flat:
            check_column(column, "pipeline input")
            if flat.count(column) > 1:
                raise PipelineError(f"duplicate pipeline input column {column!r}")
        return PipeBuilder(flat, schema or {})


pipe = _Pipe()


def _columns(columns: object) -> tuple[str, ...]:
    """The names ``columns`` gives, checked: the caller's argument, whatever it is."""
    if isinstance(columns, str):
        return (columns,)
    if isinstance(columns, Sequence) and all(isinstance(c, str) for c in columns):
        return tuple(columns)
    raise PipelineError(f"columns are a name or a tuple of names, got {columns!r}")


def _schema(schema: Mapping[str, Any] | None, columns: tuple[str, ...], what: str):
    schema = dict(schema or {})
    unknown = set(schema) - set(columns)
    if unknown:
        raise PipelineError(
            f"schema names {sorted(unknown)}, which are not pipeline {what} columns "
            f"({', '.join(columns)})"
        )
    return {column: as_spec(declared, column) for column, declared in schema.items()}


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
