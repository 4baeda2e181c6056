"""Streaming operators: each item sent the moment it is made, decoding loops batched per step.

``pipe.input("image") ... .stream("memory", "char", decoder)`` declares an operator whose items
are the pipeline's answer, one at a time: a text decoder's tokens, a captioner's words. The
pipeline then answers as a stream (served: a decoupled model, one response per item and a final
flag), and :func:`execute_stream` runs it step by step so that a slow loop shows its first item
as soon as it is made, and a call that is no longer wanted (a cancelled request) stops within
one step.

An operator streams in one of two forms:

* a function returning an iterator (a generator), called per row: each step advances every
  running row by one item;
* an object whose ``call_batch(rows)`` is a generator: each ``yield`` is one step, a mapping of
  row position → item for every row still running; a row absent from a step has finished. The
  value the ``yield`` returns is the set of row positions to stop (cancelled or failed), which
  the operator drops from its loop. This is the form that batches a model call per step across
  every stream of the batch (the decoder of all running sequences as one call).

  Such an operator that also sets ``admits_rows = True`` takes rows *between* steps: the set
  sent back is then a :class:`StepControl`, whose ``added`` holds new rows (argument tuples)
  that join the next step, numbered after the rows the generator already holds. Served, calls
  that arrive while others stream join their loop instead of starting one of their own, so every
  stream in flight shares each step's model call (continuous batching), whenever it arrived.

Only ``map`` operators may follow a streaming one (each applies to every item), and every
pipeline output comes with each item; the streaming operator reads the call's own row, so a
call's items come in one order, the same in process (:meth:`Pipeline.stream`) and served.
Answered whole (``pipe(x)``), each output is the list of the call's items.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from builder.errors import OperatorError, PipelineError
from builder.pipeline.executor import (
    CallResult,
    NodeTrace,
    Row,
    argument_rows,
    execute,
    failure,
    run_nodes,
    start_rows,
    unpack,
)
from builder.pipeline.operators import batch_stream

if TYPE_CHECKING:
    from builder.runtime.operator_metrics import OperatorTimes

STEP_KINDS = ("map",)
"""What may follow a streaming operator: operators applied to each item."""


@dataclass
class StreamEvent:
    """One event of a call's stream: an item's ``outputs``, or its end (``final``), with the
    ``error`` that stopped it or ``cancelled`` when the caller asked it to stop."""

    call: int
    outputs: dict[str, Any] | None = None
    final: bool = False
    error: OperatorError | None = None
    cancelled: bool = False


@dataclass
class StreamPart:
    """Where a plan streams: the streaming node, what runs before it and on each of its items."""

    node: int
    before: tuple[int, ...]
    after: tuple[int, ...]
    items: int
    """The row stream of the items: the streaming node's, which the maps after it keep."""


def stream_part(plan: Any) -> StreamPart | None:
    """The streaming part of ``plan``, checked: one streaming operator at most, reading the
    call's own row, followed by ``map`` operators only; ``None`` when it streams nothing."""
    streaming = [i for i in plan.order if plan.nodes[i].kind == "stream"]
    if not streaming:
        return None
    if len(streaming) > 1:
        first, second = (plan.nodes[i].label for i in streaming[:2])
        raise PipelineError(f"operators {first} and {second} both stream: a pipeline streams "
                            "one operator's items")
    (index,) = streaming
    node = plan.nodes[index]
    if plan.node_stream[index] != 0:
        raise PipelineError(
            f"operator {node.label} streams rows made by a flat_map or filter: a streaming "
            "operator reads the call's own columns, so that each call is one stream")
    items = plan.node_output_stream[index]
    after = []
    for i in plan.order:
        if plan.node_stream[i] == items and i != index:
            other = plan.nodes[i]
            if other.kind not in STEP_KINDS:
                raise PipelineError(
                    f"operator {other.label} follows the streaming operator {node.label}: only "
                    "map operators apply to each streamed item")
            after.append(i)
    whole = [c for c in plan.outputs if plan.column_stream[c] != items]
    if whole:
        raise PipelineError(
            f"pipeline output {whole[0]!r} is one value per call, but operator {node.label} "
            "streams: every output of a streaming pipeline comes with each item (to send a "
            f"value of the call with every item, compute it with a map that reads an item's "
            f"column too: .map((<item column>, {whole[0]!r}), ...))")
    before = tuple(i for i in plan.order if i != index and i not in after)
    return StreamPart(index, before, tuple(after), items)


class StepControl(frozenset):
    """What a streaming ``call_batch`` that admits rows gets back from each ``yield``: the set
    of its row indices to stop, and the rows ``added`` since (argument tuples), which take the
    next indices in order and join the next step."""

    added: tuple[tuple, ...]

    def __new__(cls, stop: Collection[int] = (), added: Sequence[tuple] = ()) -> StepControl:
        control = super().__new__(cls, stop)
        control.added = tuple(added)
        return control


def admits_rows(op: Any) -> bool:
    """Whether ``op`` is a batched streaming operator that takes rows between its steps."""
    return batch_stream(op) and getattr(op, "admits_rows", False) is True


class Steps:
    """The rows of one streaming operator, advanced one step at a time; with :meth:`admit`,
    rows may join between steps."""

    def __init__(self, op: Any, argument_rows: Sequence[tuple]) -> None:
        self.running: set[int] = set()
        self._batch: Any = None
        self._iterators: dict[int, Iterator[Any]] = {}
        self.errors: dict[int, BaseException] = {}
        self._op: Any = op if batch_stream(op) else None
        self._function = op
        self._admitted = 0
        self._waiting: dict[int, tuple] = {}
        """The rows admitted since the generator's last step, by position: sent with the
        next."""
        self._positions: dict[int, int] = {}
        """The row positions the generator holds, by its own index; each leaves with its
        row, so a loop that never ends holds only the rows it runs."""
        self._own: dict[int, int] = {}
        self._given = 0
        """Rows the generator was given: the next one's own index."""
        self.admit(argument_rows)

    @property
    def admits(self) -> bool:
        """Whether rows may join while others run (:meth:`admit` between steps)."""
        return self._op is None or admits_rows(self._op)

    def admit(self, argument_rows: Sequence[tuple]) -> list[int]:
        """Rows that join at the next step; their positions follow the rows before them."""
        positions = list(range(self._admitted, self._admitted + len(argument_rows)))
        self._admitted += len(argument_rows)
        if self._op is not None:
            if self._batch is not None and not admits_rows(self._op):
                raise PipelineError("this streaming operator takes its rows when it starts: "
                                    "set admits_rows = True to take rows between steps")
            self.running.update(positions)
            self._waiting.update(zip(positions, argument_rows))
            return positions
        for position, args in zip(positions, argument_rows):
            try:
                self._iterators[position] = iter(self._function(*args))
                self.running.add(position)
            except Exception as error:  # noqa: BLE001 - this row's failure
                self.errors[position] = error
        return positions

    def step(self, stop: Collection[int] = ()) -> dict[int, Any]:
        """One step: the item of each row still running. ``stop``: rows to end first. Rows that
        fail are moved to :attr:`errors`; a row that made no item has ended."""
        stop = set(stop) & self.running
        self.running -= stop
        if self._op is not None:
            return self._batch_step(stop)
        items = {}
        for position in sorted(self.running):
            try:
                items[position] = next(self._iterators[position])
            except StopIteration:
                self.running.discard(position)
                del self._iterators[position]
            except Exception as error:  # noqa: BLE001 - this row's failure
                self.errors[position] = error
                self.running.discard(position)
                del self._iterators[position]
        for position in stop:
            _close(self._iterators.pop(position, None))
        return items

    def _batch_step(self, stop: set[int]) -> dict[int, Any]:
        """One ``yield`` of the generator. It starts at the first step with the rows still
        running then, so a row stopped before it never enters its batch; rows admitted later
        are sent with the next step (a generator that ended starts again with them)."""
        waiting = {p: row for p, row in self._waiting.items() if p in self.running}
        self._waiting = {}
        try:
            if self._batch is None:
                if not waiting:  # every row stopped before it started
                    return {}
                self._hold(waiting)
                self._batch = self._op.call_batch(list(waiting.values()))
                step = next(self._batch)
            else:
                own = {self._own[p] for p in stop if p in self._own}
                self._hold(waiting)
                control = (StepControl(own, list(waiting.values()))
                           if admits_rows(self._op) else own)
                step = self._batch.send(control)
        except StopIteration:
            self._end_batch()  # rows admitted later start another
            return {}
        except Exception as error:  # noqa: BLE001 - the batch's failure: every running row's
            self.errors.update(dict.fromkeys(self.running, error))
            self._end_batch()
            return {}
        if not isinstance(step, dict):
            raise PipelineError(
                f"a streaming call_batch yields, per step, a dict of row position -> item; got "
                f"{type(step).__name__}")
        items = {}
        for i, item in step.items():
            position = self._positions.get(i)
            if position in self.running:
                items[position] = item
        for position in (self.running | stop) - items.keys():  # ended or stopped: let go
            self._positions.pop(self._own.pop(position, -1), None)
        self.running = set(items)
        return items

    def _hold(self, rows: dict[int, tuple]) -> None:
        """Number ``rows`` (by position) as the generator does: after the rows it holds."""
        for position in rows:
            self._own[position], self._positions[self._given] = self._given, position
            self._given += 1

    def _end_batch(self) -> None:
        self._batch = None
        self._positions, self._own, self._given = {}, {}, 0
        self.running.clear()

    def close(self) -> None:
        """End every row still running (the caller stops reading)."""
        if self._batch is not None:
            self._batch.close()
        for iterator in self._iterators.values():
            _close(iterator)
        self._iterators.clear()
        self._end_batch()


def collect(op: Any, argument_rows: Sequence[tuple]) -> list[list[Any]]:
    """Every row's items, in order: a streaming operator answered whole."""
    steps = Steps(op, argument_rows)
    items: list[list[Any]] = [[] for _ in argument_rows]
    while steps.running:
        for position, item in steps.step().items():
            items[position].append(item)
    if steps.errors:
        raise next(iter(steps.errors.values()))
    return items


def _close(iterator: Any) -> None:
    close = getattr(iterator, "close", None)
    if callable(close):
        close()


def execute_stream(plan: Any, part: StreamPart, calls: Sequence[Sequence[Any]],
                   times: Sequence[OperatorTimes] | None = None,
                   stopped: Callable[[], Collection[int]] | None = None,
                   arguments: dict[int, list[tuple]] | None = None,
                   arrivals: Callable[[], Sequence[Sequence[Any]]] | None = None,
                   ) -> Generator[StreamEvent, None, None]:
    """Run ``calls`` through a streaming ``plan``, yielding each item as it is made.

    Events of different calls interleave, step by step; each call ends with one ``final``
    event (with its error, or ``cancelled``). ``stopped()`` is asked before every step which
    calls no longer want items: they end within that step. ``arrivals()``, where the streaming
    operator admits rows (:func:`admits_rows`), is asked before every step for calls that
    arrived since: they run up to the streaming operator and join the next step, numbered after
    the calls before them. ``times``: as for :func:`~builder.pipeline.executor.execute`; the
    streaming operator's row count is its rows, its time the steps'. ``arguments``: as for
    ``execute``.
    """
    run = StreamRun(plan, part, times, arguments)
    yield from run.admit(calls)
    if not run.steps.admits:
        arrivals = None
    try:
        while True:
            if arrivals is not None:
                new = arrivals()
                if new:
                    yield from run.admit(new)
            if not run.steps.running:
                break
            yield from run.step(set(stopped()) if stopped is not None else set())
    finally:
        run.steps.close()


class StreamRun:
    """One loop of a streaming operator: its running rows, the calls that failed or ended, and
    how many calls it has numbered. What it keeps of a call goes when the call ends, so a loop
    that never ends (calls keep arriving) holds only the calls it runs."""

    def __init__(self, plan: Any, part: StreamPart, times: Sequence[OperatorTimes] | None,
                 arguments: dict[int, list[tuple]] | None) -> None:
        self.plan, self.part, self.times, self.arguments = plan, part, times, arguments
        self.node = plan.nodes[part.node]
        self.failed: dict[int, OperatorError] = {}
        self.rows: dict[int, Row] = {}
        """The streaming operator's running rows, by their position in :class:`Steps`."""
        self.ended: set[int] = set()
        """Calls that ended while their row still runs (an item failed after the operator)."""
        self.steps = Steps(self.node.op, ())
        self.calls = 0
        """Calls numbered so far: the next call's number."""

    def final(self, call: int, **state: Any) -> StreamEvent:
        return StreamEvent(call, final=True, error=self.failed.pop(call, None), **state)

    def admit(self, new: Sequence[Sequence[Any]]) -> Iterator[StreamEvent]:
        """Number ``new`` calls, run them up to the streaming operator and start their rows
        there; a call that failed on the way ends at once."""
        plan, node, part = self.plan, self.node, self.part
        first = self.calls
        self.calls += len(new)
        streams, _ = start_rows(plan, new, first)
        run_nodes(plan, part.before, streams, self.failed, self.times, self.arguments)
        joined = [r for r in streams.get(0, []) if r.call not in self.failed]
        for call in sorted(set(range(first, self.calls)) - {r.call for r in joined}):
            yield self.final(call)
        started = time.perf_counter()
        node_arguments = argument_rows(joined, node.inputs)
        if self.arguments is not None:
            self.arguments.setdefault(part.node, []).extend(node_arguments)
        self.rows.update(zip(self.steps.admit(node_arguments), joined))
        _account(self.times, part.node, started, len(joined), len(self.steps.errors))
        for position, error in sorted(self.steps.errors.items()):  # rows that failed to start
            call = self.rows.pop(position).call
            self.failed.setdefault(call, failure(node, error))
            yield self.final(call)
        self.steps.errors.clear()

    def step(self, cancelled: set[int]) -> Iterator[StreamEvent]:
        """One step of every running row (those of ``cancelled`` or failed calls stopped),
        its items through the nodes after the operator, then the events: calls that ended,
        the items, calls an item failed."""
        plan, node, part, rows, failed, ended = (self.plan, self.node, self.part, self.rows,
                                                 self.failed, self.ended)
        stop = {p for p in self.steps.running if rows[p].call in cancelled or
                rows[p].call in failed}
        started = time.perf_counter()
        running = set(self.steps.running)
        items = self.steps.step(stop)
        _account(self.times, part.node, started, 0, len(self.steps.errors))
        for position, error in list(self.steps.errors.items()):
            failed.setdefault(rows[position].call, failure(node, error))
        self.steps.errors.clear()
        made = [Row(rows[p].call, rows[p], unpack(node, item)) for p, item in items.items()]
        run_nodes(plan, part.after, {part.items: made}, failed, self.times, self.arguments)
        for position in sorted(running - self.steps.running):
            call = rows.pop(position).call  # ended this step (no item), stopped, or failed
            if call in ended:
                ended.discard(call)
                failed.pop(call, None)
            else:
                yield self.final(call, cancelled=call in cancelled and call not in failed)
        for row in made:
            if row.call not in failed:
                yield StreamEvent(row.call, {c: row.get(c) for c in plan.outputs})
        for call in sorted({r.call for r in made} & set(failed) - ended):
            ended.add(call)  # an item failed after the operator: the call ends now
            yield StreamEvent(call, final=True, error=failed[call])


def run_plan(plan: Any, part: StreamPart | None, calls: Sequence[Sequence[Any]],
             times: Sequence[OperatorTimes] | None = None,
             arguments: dict[int, list[tuple]] | None = None,
             trace: NodeTrace | None = None) -> list[CallResult]:
    """Any plan's calls answered whole: :func:`~builder.pipeline.executor.execute`, or for a
    streaming plan (``part``, the pipeline's :func:`stream_part`) its items collected, each
    output the list of the call's items. ``trace`` is told each node's run (a streaming
    plan's are not traced)."""
    if part is None:
        return execute(plan, calls, times, arguments, trace)
    items: dict[int, dict[str, list[Any]]] = {i: {c: [] for c in plan.outputs}
                                               for i in range(len(calls))}
    results: list[CallResult] = [CallResult()] * len(calls)
    for event in execute_stream(plan, part, calls, times, arguments=arguments):
        if event.outputs is not None:  # an item: every event but the final one has outputs
            for column in plan.outputs:
                items[event.call][column].append(event.outputs[column])
        elif event.error is not None:
            results[event.call] = CallResult(error=event.error)
        else:
            results[event.call] = CallResult(items[event.call])
    return results


def _account(times: Sequence[OperatorTimes] | None, index: int, started: float, rows: int,
             failed: int) -> None:
    if times is not None:
        spent = times[index]
        spent.record(time.perf_counter() - started, rows)
        spent.failed += failed
