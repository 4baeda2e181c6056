"""Serving a streaming pipeline (a decoupled model): each dynamic batch of streams decoded in
``execute``, then streamed step by step on a thread of its own.

Copied beside the pipeline's ``model.py`` as ``triton_builder_stream_serving.py``, which it
imports; like it, imports nothing from ``builder`` and loads on Python 3.8. What it needs of
Triton comes through the pipeline model's ``TritonApi`` (``sender``, ``send``, ``cancelled``,
``response``, ``error_response``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the copy beside model.py is this module
    from . import stream_outbox
    from .operator_metrics import OperatorTimes
else:
    try:  # in Triton: beside model.py
        from . import triton_builder_stream_outbox as stream_outbox
    except ImportError:  # in the builder's package
        from . import stream_outbox


COALESCE_PARAMETER = "builder_coalesce_items"
"""The request parameter (a bool) by which a client says it reads a response holding several
items, one per row of its outputs. Without it each item is a response of its own: HTTP's
generate_stream sends each response as one JSON event, which keeps no shapes, so rows coalesced
there could not be told apart. The builder's gRPC clients set it. (Names that start with
``triton_`` are Triton's own.)"""


@dataclass
class Streams:
    """The calls of a dynamic batch of streamed requests, decoded, each with its response
    sender and whether its client reads coalesced items: what :func:`run_streams` needs once
    ``execute`` has returned. ``done`` is called once the last of them has sent its final
    response."""

    calls: list[tuple]
    senders: list[Any]
    coalesce: list[bool]
    done: Callable[[], None] | None = None


def accept_streams(api: Any, requests: Sequence[Any],
                   decode: Callable[[Any], list[tuple]]) -> Streams:
    """Decode a dynamic batch of streamed requests, in ``execute``: one call each (a batch of
    one; ``decode`` reads a request's calls). A request that cannot be one is answered at
    once, its stream ended."""
    streams = Streams([], [], [])
    for request in requests:
        sender = api.sender(request)
        try:
            coalesce = api.parameters(request).get(COALESCE_PARAMETER) is True
            values = decode(request)
            if len(values) != 1:
                raise ValueError(f"a streaming pipeline takes one call per request, this one "
                                 f"holds {len(values)}: send them as requests of their own")
        except Exception as error:  # noqa: BLE001 - this request's error response
            api.send(sender, stream_error(api, f"bad request: {error}", bad_request=True),
                     final=True)
            continue
        streams.calls.append(values[0])
        streams.senders.append(sender)
        streams.coalesce.append(coalesce)
    return streams


class StreamLoop:
    """Where batches of streams join the instance's running loop, when its streaming operator
    admits rows: one loop, so one model call per step, for every stream in flight.

    :meth:`join` (``execute``) hands a batch to the loop if one runs; else the caller starts
    one. The loop takes what joined before each step (:meth:`arrivals`) and, once its streams
    have ended, what joined after its last step (:meth:`next_or_stop`), or stops: both under
    one lock, so a batch is never left between a loop that ends and one that starts.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = False
        self._joined: list[Streams] = []

    def join(self, streams: Streams) -> bool:
        """Whether a running loop takes ``streams``; if not, the caller's loop now runs."""
        with self._lock:
            if self._running:
                self._joined.append(streams)
                return True
            self._running = True
            return False

    def arrivals(self) -> list[Streams]:
        with self._lock:
            joined, self._joined = self._joined, []
        return joined

    def stop(self) -> list[Streams]:
        """Stop the loop (it failed): the batches that joined and were never taken."""
        with self._lock:
            joined, self._joined = self._joined, []
            self._running = False
        return joined

    def next_or_stop(self) -> Streams | None:
        """A batch that joined after the loop's last step (the others join its first step);
        else the loop stops."""
        with self._lock:
            if not self._joined:
                self._running = False
                return None
            return self._joined.pop(0)


@dataclass
class _Left:
    """A batch's streams whose final response is still to be sent; ``done`` once none is."""

    streams: int
    done: Callable[[], None] | None

    def count_down(self) -> None:
        self.streams -= 1
        if self.streams == 0 and self.done is not None:
            self.done()


@dataclass
class _Stream:
    """What the loop keeps of a stream in flight: where its responses go, how, and its
    batch."""

    sender: Any
    coalesce: bool
    left: _Left


STREAM_BATCHES = 4
"""Dynamic batches of streams one instance runs at once (each on a thread of its own); more
wait in Triton's queue."""
CANCEL_POLL_S = 0.005
"""How often a batch of streams asks whether its clients cancelled (each question is a round
trip to the server): every step, or every 5 ms where steps are shorter."""


def run_streams(pipeline: Any, api: Any, streams: Streams,
                times: Sequence[OperatorTimes] | None = None,
                failure_kind: Callable[[BaseException], dict[str, bool]] = lambda error: {},
                arrivals: Callable[[], Sequence[Streams]] | None = None,
                ) -> None:
    """Stream calls through a streaming pipeline: each item sent as it is made, then the final
    flag. The rows of every stream advance together, one step at a time, so a model call inside
    the loop serves them all; where the streaming operator admits rows, ``arrivals()`` hands
    over, before each step, the batches of streams that came since, which join the next step
    (continuous batching). A thread sends what the steps make (:mod:`stream_outbox`), the
    items made while the last response was sent in one response where the client reads them so
    (:data:`COALESCE_PARAMETER`), else one response each. A
    stream whose client has cancelled it ends within one step (:data:`CANCEL_POLL_S`), with the
    final flag alone; errors end a stream as the pipeline model's ``serve`` answers them
    (``failure_kind``: the client's mistake, a refusal for now, or the server's fault)."""
    book = _StreamBook(api, pipeline.signature(), arrivals)
    outbox = stream_outbox.Outbox(book.send_items, book.send_end, api.log_warning)
    try:
        for event in pipeline.run_stream(book.take(streams), times, book.stopped,
                                         book.joined if arrivals is not None else None):
            if event.error is not None:
                del book.live[event.call]
                outbox.end(event.call, stream_error(api, str(event.error),
                                                    **failure_kind(event.error)))
            elif event.final:
                del book.live[event.call]
                outbox.end(event.call)
            else:
                outbox.item(event.call, event.outputs)
    except Exception as error:  # noqa: BLE001 - a bug, not one call's failure: tell everyone
        message = f"pipeline failed: {type(error).__name__}: {error}"
        for call in list(book.live):
            outbox.end(call, stream_error(api, message))
    finally:
        outbox.close()


class _StreamBook:
    """The streams of one loop, by the call numbers the loop gives them: who to send each
    call's items and end to, which clients cancelled."""

    def __init__(self, api: Any, signature: Any,
                 arrivals: Callable[[], Sequence[Streams]] | None) -> None:
        self.api, self.signature, self.arrivals = api, signature, arrivals
        self.taken: dict[int, _Stream] = {}
        """The streams taken, each until its final response is sent (the outbox's thread lets
        it go): a loop that runs on holds only the streams in flight."""
        self.live: dict[int, Any] = {}
        """The senders of the streams whose end the loop has not yet made (its own thread)."""
        self.calls = 0
        self.polled = 0.0

    def take(self, batch: Streams) -> list[tuple]:
        """A batch's streams, numbered after those taken before (as the loop numbers calls)."""
        left = _Left(len(batch.calls), batch.done)
        for call, (sender, coalesce) in enumerate(zip(batch.senders, batch.coalesce),
                                                  self.calls):
            self.taken[call] = _Stream(sender, coalesce, left)
            self.live[call] = sender
        self.calls += len(batch.calls)
        return batch.calls

    def joined(self) -> list[tuple]:
        calls: list[tuple] = []
        for batch in self.arrivals() if self.arrivals is not None else ():
            calls.extend(self.take(batch))
        return calls

    def stopped(self) -> set[int]:
        """The calls whose clients cancelled, asked at most every :data:`CANCEL_POLL_S`."""
        now = time.monotonic()
        if now - self.polled < CANCEL_POLL_S:
            return set()
        self.polled = now
        return {call for call, sender in list(self.live.items()) if self.api.cancelled(sender)}

    def send_items(self, call: int, items: list[dict]) -> None:
        stream = self.taken[call]
        for part in [items] if stream.coalesce else ([item] for item in items):
            _send_items(self.api, self.signature, stream.sender, part)

    def send_end(self, call: int, response: Any) -> None:
        stream = self.taken.pop(call)
        try:
            self.api.send(stream.sender, response, final=True)
        finally:
            stream.left.count_down()


def _send_items(api: Any, signature: Any, sender: Any, items: list[dict]) -> None:
    """One response holding ``items`` (a batch of them: the client reads each row as one
    item); items whose shapes differ, one response each."""
    try:
        response = api.response({name: spec.encode_batch([item[name] for item in items])
                                 for name, spec in signature.outputs.items()})
    except Exception as error:  # noqa: BLE001 - shapes that do not stack, or a wrong type
        if len(items) > 1:
            for item in items:
                _send_items(api, signature, sender, [item])
            return
        response = api.error_response(f"output does not fit its type: {error}")
    api.send(sender, response)


def stream_error(api: Any, message: str, *, bad_request: bool = False,
                 unavailable: bool = False) -> Any:
    """An error response for a stream, its status written at the head of its message
    (``[INVALID_ARGUMENT] …``): gRPC's ``ModelStreamInfer`` carries an error's message and
    drops its code, so the client reads it there (:mod:`builder.client.response_stream`)."""
    code = "INVALID_ARGUMENT" if bad_request else "UNAVAILABLE" if unavailable else "INTERNAL"
    return api.error_response(f"[{code}] {message}", bad_request=bad_request,
                              unavailable=unavailable)
