"""Streaming operators in process: items in order, per step, cancellation within one step."""

from __future__ import annotations

import pytest

from builder import pipe
from builder.errors import OperatorError, PipelineError, SignatureError
from builder.pipeline.streaming import StreamEvent, collect, execute_stream


def count_up(n: int):
    yield from range(n)


class Decoder:
    """A decoding loop in the batched form: one step of every running row per ``yield``,
    counting the rows it advanced (what a model call per step would cost)."""

    def __init__(self) -> None:
        self.advanced = 0

    def call_batch(self, rows):
        lengths = [row[0] for row in rows]
        running = [i for i, n in enumerate(lengths) if n > 0]
        step = 0
        while running:
            self.advanced += len(running)
            made = {i: f"{i}:{step}" for i in running}
            stopped = yield made
            running = [i for i in running if step + 1 < lengths[i]
                       and i not in (stopped or ())]
            step += 1


def test_a_generator_operator_streams_its_items_and_the_whole_answer_is_their_list():
    p = (pipe.input("n").stream("n", "i", count_up).map("i", "square", lambda i: i * i)
         .output("square"))
    assert list(p.stream(4)) == [0, 1, 4, 9]
    assert p(4) == [0, 1, 4, 9]
    assert p.batch([3, 0, 2]) == [[0, 1, 4], [], [0, 1]]
    assert p.streaming is not None


def spell(word: str):
    yield from word


def test_whole_join_answers_a_call_with_its_texts_joined_and_the_clients_read_it_so():
    from builder.pipeline.signature_document import parse_signature, signature_parameter

    p = (pipe.input("word").stream("word", "letter", spell, whole="join")
         .map("letter", "upper", str.upper).output("upper").with_example("ab"))
    assert list(p.stream("tea")) == ["T", "E", "A"]
    assert p("tea") == "TEA" and p("") == ""
    assert p.batch(["ab", "c"]) == ["AB", "C"]
    signature = p.signature()
    assert signature.whole == "join" and signature.streamed == ("upper",)
    assert signature.outputs["upper"].pytype == "str"  # one item's type
    (document,) = signature_parameter(signature).values()
    assert parse_signature(document) == signature


def test_whole_join_of_items_that_are_not_text_is_refused_naming_the_output():
    p = (pipe.input("n").stream("n", "i", count_up, whole="join").output("i")
         .with_example(3))
    with pytest.raises(SignatureError, match="output 'i' is streamed as int items.*joins texts"):
        p.signature()


def test_an_unknown_whole_answer_is_refused_where_the_stream_is_added():
    with pytest.raises(PipelineError, match="whole='concat'.*list, join"):
        pipe.input("n").stream("n", "i", count_up, whole="concat")


def test_a_batched_streaming_operator_advances_every_row_per_step():
    decoder = Decoder()
    p = pipe.input("n").stream("n", "token", decoder).output("token")
    assert p.batch([2, 3, 1]) == [["0:0", "0:1"], ["1:0", "1:1", "1:2"], ["2:0"]]
    assert decoder.advanced == 6  # 3 rows, then 2, then 1: one step each


def test_each_call_ends_in_the_step_its_row_makes_no_item():
    p = pipe.input("n").stream("n", "token", Decoder()).output("token")
    events = list(execute_stream(p.plan, p.streaming, [(1,), (3,)]))
    finals = [i for i, e in enumerate(events) if e.final]
    first_end = next(i for i, e in enumerate(events) if e.final and e.call == 0)
    assert first_end < next(i for i, e in enumerate(events) if e.call == 1 and not e.final
                            and e.outputs["token"] == "1:1")
    assert len(finals) == 2


def test_a_cancelled_call_stops_within_one_step_and_the_others_go_on():
    decoder = Decoder()
    p = pipe.input("n").stream("n", "token", decoder).output("token")
    cancelled: set[int] = set()
    events: list[StreamEvent] = []
    for event in execute_stream(p.plan, p.streaming, [(12,), (12,)], stopped=lambda: cancelled):
        events.append(event)
        if event.call == 0 and not event.final:
            cancelled.add(0)  # after its first item
    mine = [e for e in events if e.call == 0]
    assert [e.outputs["token"] for e in mine if not e.final] == ["0:0"]
    assert mine[-1].final and mine[-1].cancelled
    assert len([e for e in events if e.call == 1 and not e.final]) == 12
    assert decoder.advanced == 1 + 12  # row 0 advanced once, never after its cancel


def test_closing_the_in_process_stream_stops_the_operator():
    decoder = Decoder()
    p = pipe.input("n").stream("n", "token", decoder).output("token")
    stream = p.stream(12)
    assert next(stream) == "0:0"
    stream.close()
    assert decoder.advanced == 1


def test_an_error_mid_stream_reaches_the_caller_after_the_items_before_it():
    def breaks(n):
        yield "a"
        raise ValueError("step two broke")

    p = pipe.input("n").stream("n", "item", breaks).output("item")
    stream = p.stream(3)
    assert next(stream) == "a"
    with pytest.raises(OperatorError, match="step two broke"):
        next(stream)
    with pytest.raises(OperatorError, match="breaks' \\(stream n -> item\\) failed"):
        p(3)


def test_a_map_after_the_stream_that_fails_ends_only_its_call():
    def check(i):
        if i == 1:
            raise ValueError("one is refused")
        return i

    p = pipe.input("n").stream("n", "i", count_up).map("i", "j", check).output("j")
    results = p.batch([1, 3], return_exceptions=True)
    assert results[0] == [0]
    assert isinstance(results[1], OperatorError)


def test_a_value_of_the_call_comes_with_every_item_through_a_map_after_the_stream():
    p = (pipe.input("n").map("n", "label", lambda n: f"n={n}").stream("n", "i", count_up)
         .map(("i", "label"), "tag", lambda i, label: label.upper()).output("tag", "i"))
    assert list(p.stream(2)) == [("N=2", 0), ("N=2", 1)]
    assert p(2) == (["N=2", "N=2"], [0, 1])
    assert p(0) == ([], [])


def test_the_signature_of_a_streamed_output_is_one_item():
    p = pipe.input("n").stream("n", "i", count_up).output("i").with_example(3)
    spec = p.signature().outputs["i"]
    assert not spec.ragged


def test_collect_answers_a_streaming_operator_whole():
    assert collect(Decoder(), [(2,), (1,)]) == [["0:0", "0:1"], ["1:0"]]


@pytest.mark.parametrize("build, message", [
    (lambda: pipe.input("n").stream("n", "a", count_up).stream("a", "b", count_up)
     .output("b"), "both stream"),
    (lambda: pipe.input("n").flat_map("n", "m", lambda n: [n]).stream("m", "a", count_up)
     .output("a"), "call's own columns"),
    (lambda: pipe.input("n").stream("n", "a", count_up).flat_map("a", "b", lambda a: [a])
     .output("b"), "only map operators"),
    (lambda: pipe.input("n").map("n", "m", abs).stream("n", "a", count_up).output("m"),
     "every output of a streaming pipeline comes with each item"),
])
def test_pipelines_that_cannot_stream_are_refused_naming_the_operator(build, message):
    with pytest.raises(PipelineError, match=message):
        build()


def test_a_pipeline_that_does_not_stream_says_so():
    p = pipe.input("n").map("n", "m", abs).output("m")
    with pytest.raises(PipelineError, match="does not stream"):
        list(p.stream(1))


class AdmittingDecoder(Decoder):
    """:class:`Decoder` taking rows between steps (``admits_rows``): each item says how many
    rows shared its step, and every generator it starts is counted."""

    admits_rows = True

    def __init__(self) -> None:
        super().__init__()
        self.started = 0

    def call_batch(self, rows):
        self.started += 1
        lengths = [row[0] for row in rows]
        done = [0 for _ in rows]
        running = [i for i, n in enumerate(lengths) if n > 0]
        while running:
            self.advanced += len(running)
            control = yield {i: (f"{i}:{done[i]}", len(running)) for i in running}
            for i in running:
                done[i] += 1
            running = [i for i in running if done[i] < lengths[i] and i not in control]
            for n in (row[0] for row in control.added):
                lengths.append(n)
                done.append(0)
                if n > 0:
                    running.append(len(lengths) - 1)


def _admitting_pipeline(decoder):
    return (pipe.input("n").stream("n", "item", decoder)
            .map("item", "shared", lambda item: item[1]).output("shared"))


def test_calls_that_arrive_between_steps_join_the_running_loop():
    decoder = AdmittingDecoder()
    p = _admitting_pipeline(decoder)
    waiting = [[], [(2,)], [], [(3,), (1,)]]  # asked before each step: 1 call before the
    # second, 2 before the fourth

    def arrivals():
        return waiting.pop(0) if waiting else []

    events = list(execute_stream(p.plan, p.streaming, [(4,)], arrivals=arrivals))
    shared = {call: [e.outputs["shared"] for e in events if e.call == call and not e.final]
              for call in range(4)}
    assert shared == {0: [1, 2, 2, 3], 1: [2, 2], 2: [3, 1, 1], 3: [3]}
    assert decoder.started == 1  # one loop, its model call per step shared by every call
    assert sorted(e.call for e in events if e.final) == [0, 1, 2, 3]
    assert p.batch([4, 2]) == [[2, 2, 1, 1], [2, 2]]  # answered whole, as before


def test_rows_admitted_after_the_loop_ended_start_a_new_one():
    decoder = AdmittingDecoder()
    p = _admitting_pipeline(decoder)
    waiting = [[], [], [(2,)]]  # the second call arrives once the first one's loop has ended

    def arrivals():
        return waiting.pop(0) if waiting else []

    events = list(execute_stream(p.plan, p.streaming, [(1,)], arrivals=arrivals))
    assert [(e.call, e.final) for e in events] == [
        (0, False), (0, True), (1, False), (1, False), (1, True)]
    assert decoder.started == 2


def test_a_row_cancelled_in_the_step_others_join_stops_and_they_run():
    decoder = AdmittingDecoder()
    p = _admitting_pipeline(decoder)
    cancelled: set[int] = set()
    waiting = [[], [(2,)]]

    def arrivals():
        if waiting and len(waiting) == 1:
            cancelled.add(0)  # the first call is cancelled as the second arrives
        return waiting.pop(0) if waiting else []

    events = list(execute_stream(p.plan, p.streaming, [(12,)], stopped=lambda: cancelled,
                                 arrivals=arrivals))
    assert [e.outputs["shared"] for e in events if e.call == 0 and not e.final] == [1]
    assert [e.cancelled for e in events if e.call == 0 and e.final] == [True]
    assert [e.outputs["shared"] for e in events if e.call == 1 and not e.final] == [1, 1]
    assert decoder.started == 1


def test_an_operator_that_does_not_admit_rows_is_never_asked_for_arrivals():
    p = pipe.input("n").stream("n", "token", Decoder()).output("token")

    def arrivals():
        raise AssertionError("asked for arrivals")

    events = list(execute_stream(p.plan, p.streaming, [(2,)], arrivals=arrivals))
    assert [e.outputs["token"] for e in events if not e.final] == ["0:0", "0:1"]


def test_a_generator_per_row_takes_calls_that_arrive_between_steps():
    p = pipe.input("n").stream("n", "i", count_up).output("i")
    waiting = [[(2,)]]
    events = list(execute_stream(p.plan, p.streaming, [(3,)],
                                 arrivals=lambda: waiting.pop(0) if waiting else []))
    assert [(e.call, e.outputs["i"]) for e in events if not e.final] == [
        (1, 0), (0, 0), (1, 1), (0, 1), (0, 2)] or [
        (e.call, e.outputs["i"]) for e in events if not e.final] == [
        (0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]


def test_an_operator_that_raises_mid_loop_ends_every_call_that_joined_it():
    """The trade-off of one loop: a joined generator's failure is every running row's."""
    class Breaks(AdmittingDecoder):
        def call_batch(self, rows):
            control = yield {i: ("x", 1) for i in range(len(rows))}
            if control.added:
                raise ValueError("the decoder broke")
            yield {}

    p = _admitting_pipeline(Breaks())
    waiting = [[], [(5,)]]
    events = list(execute_stream(p.plan, p.streaming, [(5,)],
                                 arrivals=lambda: waiting.pop(0) if waiting else []))
    finals = {e.call: e for e in events if e.final}
    assert sorted(finals) == [0, 1]
    assert all("the decoder broke" in str(e.error) for e in finals.values())


class Box:
    """A call's value: what only the call's own rows hold."""


class BoxedCount:
    """A per-row iterator that holds its call's :class:`Box` while it runs."""

    def __init__(self, n: int, box: Box) -> None:
        self.left, self.box = n, box

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.left == 0:
            raise StopIteration
        self.left -= 1
        return self.left


@pytest.mark.parametrize("streaming", ["call_batch", "per row"])
def test_a_joined_loop_lets_go_of_each_call_once_it_has_ended(streaming):
    """A loop that always has a stream in flight never ends, so what it keeps of a call must go
    with the call's end, or it grows with every stream it ever served: a short call that joins
    a long one is collected once its stream has ended, while the long one runs on."""
    import gc
    import weakref

    short: list[weakref.ref] = []

    def boxed(n: int) -> Box:
        box = Box()
        if n == 1:
            short.append(weakref.ref(box))
        return box

    op = AdmittingDecoder() if streaming == "call_batch" else BoxedCount
    p = pipe.input("n").map("n", "box", boxed).stream(("n", "box"), "item", op).output("item")
    held: list[bool] = []

    def arrivals():  # asked before every step
        gc.collect()
        held.append(bool(short) and short[0]() is not None)
        return [(1,)] if len(held) == 2 else []

    events = [(e.call, e.final) for e in execute_stream(p.plan, p.streaming, [(8,)],
                                                        arrivals=arrivals)]
    assert events.index((1, True)) < events.index((0, True))
    assert held[:3] == [False, False, True], held  # it joins and makes its item
    assert not any(held[3:]), held  # it ended in the third step; the long call runs on
