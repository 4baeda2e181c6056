"""The pipeline model of a streaming pipeline (decoupled): each item its own response as it is
made, one BLS call per step for every stream of the batch, cancellation within one step.

Triton's plumbing is the stand-in of :mod:`tests.support.pb_utils_standin` (response senders
recording what they sent, requests a client cancels after N responses); the model the loop
calls is the exported ONNX file, run by onnxruntime.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from builder import build_pipeline_model, pipe
from builder.repository.model_config import read_config
from builder.runtime import pipeline_model, stream_serving
from builder.runtime.stream_outbox import Outbox
from tests.support import pb_utils_standin as pb
from tests.support.tiny_models import affine_op
from tests.unit.runtime.test_pipeline_model import _args, _wire_bls

FINAL = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class Walk:
    """``v[0]`` steps of the affine model, fed its own output: one model call per step for
    every running row, each step's sum an item."""

    def __init__(self, op) -> None:
        self.op = op

    def call_batch(self, rows):
        states = [np.asarray(row[0], dtype=np.float32) for row in rows]
        left = [int(row[0][0]) for row in rows]
        running = [i for i in range(len(rows)) if left[i] > 0]
        while running:
            stopped = yield self.step(states, left, running)
            running = [i for i in running if left[i] > 0 and i not in (stopped or ())]

    def step(self, states: list, left: list[int], running: list[int]) -> dict[int, float]:
        """One model call for the running rows: their states and steps left, advanced."""
        outputs = self.op.call_batch([(states[i],) for i in running])
        step = {}
        for i, y in zip(running, outputs, strict=True):
            states[i] = np.concatenate([y, [1.0]]).astype(np.float32)
            step[i] = round(float(y.sum()), 5)
            left[i] -= 1
        return step


def _fail_on_big(total):
    if total > -0.65:
        raise ValueError("too big")
    return total


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("streaming") / "models"
    pipeline = (pipe.input("v").stream("v", "total", Walk(affine_op())).output("total")
                .with_example([3.0, 1.0, 2.0, 0.5]))
    build_pipeline_model(pipeline, root, in_process=False)
    return pipeline, root


@pytest.fixture
def model(built, monkeypatch):
    monkeypatch.setattr(pipeline_model, "pb_utils", pb)
    _, root = built
    _wire_bls(root)
    served = pipeline_model.TritonPythonModel()
    served.initialize(_args(root / "pipeline"))
    yield served
    served.finalize()


def _execute(model, requests) -> None:
    """``execute``, then wait for the streams it started on a thread of their own."""
    assert model.execute(requests) is None  # decoupled: responses go through the senders
    for worker in list(model.streaming_threads):
        worker.join(30)


def _request(vector, cancel_after=None, **options) -> pb.Request:
    return pb.Request({"v": np.array([vector], dtype=np.float64)}, cancel_after=cancel_after,
                      **options)


def _rows(request) -> list[int]:
    """How many items each of a stream's responses held."""
    return [len(response.output_tensors[0].as_numpy()) for response, _ in request.sent[:-1]]


def _items(request) -> list[float]:
    assert request.sent[-1] == (None, FINAL), request.sent[-1]
    assert all(flags == 0 for _, flags in request.sent[:-1])
    values = []
    for response, _ in request.sent[:-1]:  # a response holds the items made while the last
        assert not response.has_error(), response.error().message()  # one was being sent
        (tensor,) = response.output_tensors
        values.extend(float(v) for v in tensor.as_numpy().reshape(-1))
    return values


def test_the_pipeline_model_is_decoupled(built):
    _, root = built
    assert read_config(root / "pipeline").model_transaction_policy.decoupled


def test_each_item_is_a_response_and_one_bls_call_serves_every_stream_per_step(built, model):
    pipeline, _ = built
    vectors = [[3.0, 1.0, 2.0, 0.5], [1.0, -1.0, 0.0, 2.0], [5.0, 0.5, 0.5, 0.5]]
    requests = [_request(v) for v in vectors]
    _execute(model, requests)
    for request, vector in zip(requests, vectors, strict=True):
        np.testing.assert_allclose(_items(request), list(pipeline.stream(vector)), atol=1e-4)
    assert [c.batch_size for c in pb.Models.calls] == [3, 2, 2, 1, 1]


@pytest.mark.parametrize("coalesce", [False, True])
def test_items_made_while_a_response_is_sent_share_one_only_where_the_client_asked(
        built, model, coalesce):
    """A generic client (and HTTP's generate_stream, whose JSON events keep no shapes) gets each
    item as a response of its own; the builder's gRPC clients ask for coalesced rows."""
    pipeline, _ = built
    vector = [12.0, 1.0, 0.5, 0.5]
    parameters = {stream_serving.COALESCE_PARAMETER: True} if coalesce else {}
    request = _request(vector, send_s=0.02, request_parameters=parameters)
    _execute(model, [request])
    np.testing.assert_allclose(_items(request), list(pipeline.stream(vector)), atol=1e-4)
    if coalesce:
        assert max(_rows(request)) > 1, _rows(request)
    else:
        assert _rows(request) == [1] * 12


def test_a_cancelled_stream_stops_before_its_next_step_and_frees_its_place(model):
    cancelled = _request([12.0, 1.0, 1.0, 1.0], cancel_after=0)  # cancelled as it arrives
    other = _request([12.0, 0.0, 1.0, 0.0])
    _execute(model, [cancelled, other])
    assert cancelled.sent == [(None, FINAL)]
    assert len(_items(other)) == 12
    # the cancelled stream never took a place in the batch: every step served the other alone
    assert [c.batch_size for c in pb.Models.calls] == [1] * 12


def test_a_request_of_several_calls_is_refused_as_the_clients_mistake(model):
    request = pb.Request({"v": np.ones((2, 4))})
    good = _request([2.0, 0.0, 0.0, 0.0])
    _execute(model, [request, good])
    ((response, flags),) = request.sent
    assert flags == FINAL and response.error().code() == pb.TritonError.INVALID_ARG
    assert response.error().message().startswith("[INVALID_ARGUMENT] bad request: a streaming")
    assert len(_items(good)) == 2


def _served_over_bls(pipeline, root, monkeypatch) -> pipeline_model.TritonPythonModel:
    """``pipeline``'s model, its model operators called over BLS (the stand-in's)."""
    build_pipeline_model(pipeline, root, in_process=False)
    monkeypatch.setattr(pipeline_model, "pb_utils", pb)
    _wire_bls(root)
    served = pipeline_model.TritonPythonModel()
    served.initialize(_args(root / "pipeline"))
    return served


def test_an_error_mid_stream_ends_that_stream_after_its_items(tmp_path, monkeypatch):
    pipeline = (pipe.input("v").stream("v", "total", Walk(affine_op()))
                .map("total", "checked", _fail_on_big).output("checked")
                .with_example([1.0, 0.0, 0.0, 0.0]))
    served = _served_over_bls(pipeline, tmp_path / "models", monkeypatch)
    try:
        request = _request([12.0, 3.0, 3.0, 3.0])
        _execute(served, [request])
    finally:
        served.finalize()
    *items, (error, flags) = request.sent
    assert flags == FINAL and error.error().message().startswith("[INTERNAL] operator ")
    assert "too big" in error.error().message()
    assert all(not r.has_error() for r, _ in items)
    made = [float(v) for r, _ in items for v in r.output_tensors[0].as_numpy().reshape(-1)]
    assert np.allclose(made, [-2.5579, -0.71029], atol=1e-4)  # the two before the failing one


def test_before_23_10_a_stream_runs_to_its_end(built, monkeypatch):
    monkeypatch.setattr(pipeline_model, "pb_utils", pb.generation("r23.05"))
    _, root = built
    _wire_bls(root)
    served = pipeline_model.TritonPythonModel()
    served.initialize(_args(root / "pipeline"))
    try:
        request = _request([4.0, 1.0, 1.0, 1.0], cancel_after=0)
        _execute(served, [request])
    finally:
        served.finalize()
    assert len(_items(request)) == 4  # nothing told it to stop


def test_the_outbox_sends_items_while_the_loop_goes_on_and_a_streams_end_last():
    sent: list = []
    entered, release = threading.Event(), threading.Event()

    def send_items(call, items):
        entered.set()
        release.wait(5)  # a slow send: the loop makes more meanwhile
        sent.append((call, list(items)))

    box = Outbox(send_items, lambda call, response: sent.append((call, "end")))
    box.item(0, "a")
    entered.wait(5)
    box.item(0, "b")
    box.item(1, "x")
    box.item(0, "c")
    box.end(0)
    release.set()
    box.close()
    assert sent == [(0, ["a"]), (0, ["b", "c"]), (1, ["x"]), (0, "end")]


def test_batches_beyond_the_instances_slots_wait_in_execute(tmp_path, monkeypatch):
    """STREAM_BATCHES batches stream at once; the next ``execute`` waits for a slot (so
    Triton's queue, and its queue policy, hold the requests meanwhile)."""
    gate = tmp_path / "open"  # the pickled operator waits for this file to exist

    def held(v):
        import pathlib
        import time

        deadline = time.monotonic() + 10
        while v[1] == 0.5 and not pathlib.Path(str(gate)).exists() and (
                time.monotonic() < deadline):  # a request of the test, not the example
            time.sleep(0.01)
        yield float(v[0])

    pipeline = (pipe.input("v").stream("v", "x", held).output("x")
                .with_example([1.0, 0.0, 0.0, 0.0]))
    root = tmp_path / "models"
    build_pipeline_model(pipeline, root)
    monkeypatch.setattr(pipeline_model, "pb_utils", pb)
    monkeypatch.setattr(stream_serving, "STREAM_BATCHES", 2)
    served = pipeline_model.TritonPythonModel()
    served.initialize(_args(root / "pipeline"))
    requests = [_request([float(i), 0.5, 0.0, 0.0]) for i in range(3)]
    try:
        served.execute([requests[0]])
        served.execute([requests[1]])
        third = threading.Thread(target=served.execute, args=([requests[2]],))
        third.start()
        third.join(0.5)
        assert third.is_alive()  # no slot: it waits
        gate.touch()
        third.join(10)
        assert not third.is_alive()
        for worker in list(served.streaming_threads):
            worker.join(10)
    finally:
        gate.touch()
        served.finalize()
    assert [_items(r) for r in requests] == [[0.0], [1.0], [2.0]]


class JoiningWalk(Walk):
    """:class:`Walk`, its rows joined between steps by those of streams that arrive while it
    runs (``admits_rows``); a step each 50 ms, so that they arrive mid-walk."""

    admits_rows = True

    def call_batch(self, rows):
        import time

        states, left = [], []

        def add(row):
            states.append(np.asarray(row[0], dtype=np.float32))
            left.append(int(row[0][0]))
            return len(states) - 1

        running = [i for i in map(add, rows) if left[i] > 0]
        while running:
            step = self.step(states, left, running)
            time.sleep(0.05)
            control = yield step
            running = [i for i in running if left[i] > 0 and i not in control]
            running += [i for i in map(add, control.added) if left[i] > 0]


def test_streams_that_arrive_while_others_run_join_their_loop_and_share_its_bls_calls(
        tmp_path, monkeypatch):
    """Batches reach ``execute`` apart (a stream already running); with ``admits_rows`` they
    join the running loop between two steps, so one BLS call per step serves every stream in
    flight, and each stream reads what it reads alone."""
    pipeline = (pipe.input("v").stream("v", "total", JoiningWalk(affine_op())).output("total")
                .with_example([3.0, 1.0, 2.0, 0.5]))
    served = _served_over_bls(pipeline, tmp_path / "models", monkeypatch)
    vectors = [[8.0, 1.0, 2.0, 0.5], [3.0, -1.0, 0.0, 2.0], [4.0, 0.5, 0.5, 0.5]]
    requests = [_request(v) for v in vectors]
    pb.Models.calls.clear()
    try:
        served.execute([requests[0]])
        import time

        time.sleep(0.12)  # the first stream is two or three steps in
        served.execute([requests[1]])
        served.execute([requests[2]])
        assert len(served.streaming_threads) <= 1  # no loop of their own
        for worker in list(served.streaming_threads):
            worker.join(30)
    finally:
        served.finalize()
    for request, vector in zip(requests, vectors, strict=True):
        np.testing.assert_allclose(_items(request), list(pipeline.stream(vector)), atol=1e-4)
    sizes = [c.batch_size for c in pb.Models.calls]
    assert max(sizes) == 3, sizes  # the three streams, arrived apart, in one call per step
    assert sum(sizes) == 8 + 3 + 4
    assert stream_serving.STREAM_BATCHES == 4 and served.stream_slots._value == 4  # all freed


class Pacer:
    """``n`` steps per row, one item each, a step every 6 ms (so that cancellation is asked
    before each); rows join between steps."""

    admits_rows = True

    def call_batch(self, rows):
        import time

        left = {i: int(row[0]) for i, row in enumerate(rows)}
        given = len(rows)  # rows that join take the next numbers
        while left:
            time.sleep(0.006)
            control = yield {i: float(n) for i, n in left.items()}
            left = {i: n - 1 for i, n in left.items() if n > 1 and i not in control}
            for n in (int(row[0]) for row in control.added):
                left[given], given = n, given + 1


class Sender:
    """A response sender: what it was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []


class SendingApi:
    """What :func:`stream_serving.run_streams` needs of the pipeline model's ``TritonApi``."""

    def cancelled(self, sender) -> bool:
        return False

    def send(self, sender, response, final=False) -> None:
        sender.sent.append((response, final))

    def response(self, outputs):
        return outputs

    def error_response(self, message, **kind):
        raise AssertionError(message)

    def log_warning(self, message) -> None:
        raise AssertionError(message)


@pytest.mark.light  # gives the outbox thread one second
def test_a_loop_that_runs_on_lets_go_of_each_stream_once_its_final_response_is_sent():
    """Under steady load a joined loop never ends: what it keeps of a stream (its sender, its
    batch) goes once the stream's final response is sent, and the batch is done then."""
    import gc
    import time
    import weakref

    pipeline = pipe.input("n").stream("n", "item", Pacer()).output("item").with_example(2)
    first = Sender()
    short: list[weakref.ref] = []
    done: list[int] = []
    held: list[bool] = []

    def arrivals():  # before every step
        if len(held) == 1:
            sender = Sender()
            short.append(weakref.ref(sender))
            held.append(True)
            return [stream_serving.Streams([(1,)], [sender], [False], lambda: done.append(1))]
        deadline = time.monotonic() + 1.0  # the outbox thread sends its final meanwhile
        while short and time.monotonic() < deadline:
            gc.collect()
            if short[0]() is None:
                break
            time.sleep(0.01)
        held.append(bool(short) and short[0]() is not None)
        return []

    stream_serving.run_streams(pipeline, SendingApi(), stream_serving.Streams(
        [(8,)], [first], [False]), arrivals=arrivals)
    assert [final for _, final in first.sent] == [False] * 8 + [True]
    assert done == [1]
    assert held[2] is True, held  # it makes its item before the third step, which ends it
    assert not any(held[3:]), held  # collected while the first stream runs on
