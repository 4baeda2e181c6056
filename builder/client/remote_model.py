"""Calling a served model from Python with plain values: :class:`TritonRemoteModel`.

Raw tritonclient makes every caller build ``InferInput`` objects with the right names, shapes and
datatype strings, add the batch dimension by hand and decode bytes; mistakes come back from the
server as errors about tensors. Here the model's metadata and config are read once from the
server, and a call takes numpy arrays, lists, scalars, ``str`` and ``bytes``, checks them against
the model before sending (:mod:`builder.client.coercion`) and returns numpy arrays by output name.

Results are always a ``dict`` of output name to array, even for a one-output model: the shape
of the result never depends on the model. The pipeline-level client, which returns what the
in-process pipeline returns, is :class:`builder.client.Client`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from builder.client.coercion import Request, bind, prepare
from builder.client.fanout import map_bounded
from builder.client.lifecycle import Closing, RemoteModelBase
from builder.client.retry import call_with_retry
from builder.client.served_model import ServedModel, served_model
from builder.client.transport import open_transport

T = TypeVar("T")
R = TypeVar("R")


class TritonRemoteModel(RemoteModelBase, Closing):
    """One model on a Triton server, called like a function.

    >>> with TritonRemoteModel("grpc://127.0.0.1:8001/linear") as linear:
    ...     linear([1.0, 2.0, 3.0, 4.0])["OUTPUT"]          # one sample: shape (3,)
    ...     linear(np.ones((5, 4), np.float32))["OUTPUT"]  # a batch: shape (5, 3)

    Arguments: see :class:`builder.client.lifecycle.RemoteModelBase`. Nothing is connected
    until the first call, so a model may be created before its server is up. Safe to share
    between threads; :meth:`batch` runs up to ``max_in_flight`` requests at once on the
    model's own threads.
    """

    open_transport = staticmethod(open_transport)
    new_lock = threading.Lock
    _executor: ThreadPoolExecutor | None = None

    @property
    def spec(self) -> ServedModel:
        """The model's inputs, outputs and batching, read from the server on first use."""
        if self._spec is None:
            with self._lock:
                if self._spec is None:
                    metadata = call_with_retry(self._transport.metadata, self.retry_policy)
                    config = call_with_retry(self._transport.config, self.retry_policy)
                    self._spec = served_model(metadata, config)
        return self._spec

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, np.ndarray]:
        """Run the model on the inputs given in the model's input order or by name.

        A value of rank ``len(dims)`` for a batching model is one sample: the batch dimension is
        added and taken off the outputs again. Wrong names, ranks, sizes or kinds of value raise
        :class:`builder.client.coercion.InputError` before anything is sent.
        """
        return self.send(self.prepare(*args, **kwargs))

    def infer(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Like calling the model, with inputs in a mapping (names need not be identifiers)."""
        return self(**inputs)

    def prepare(self, *args: Any, **kwargs: Any) -> Request:
        """Check and convert the inputs of one call, without sending them."""
        return prepare(self.spec, bind(self.spec, args, kwargs))

    def send(self, request: Request) -> dict[str, np.ndarray]:
        """Send a prepared request (retrying while the server is unavailable)."""
        names = [output.name for output in self.spec.outputs]
        outputs = call_with_retry(lambda: self._transport.infer(request.tensors, names),
                                  self.retry_policy)
        return unbatch(outputs) if request.single else outputs

    def stream(self, request: Request) -> Generator[dict[str, np.ndarray], None, None]:
        """Send a prepared request to a decoupled model; yield each response's outputs as it
        comes, with their batch axis (a response may hold several rows: a streaming pipeline
        sends the items made while its last response was on the way in one). Closing the
        iterator early cancels the request on the server."""
        names = [output.name for output in self.spec.outputs]
        yield from self._transport.stream(request.tensors, names)

    def batch(self, items: Iterable[Any]) -> list[dict[str, np.ndarray]]:
        """Call the model once per item, up to ``max_in_flight`` requests at a time.

        An item is a mapping of input names to values, a tuple of positional values (models
        with several inputs), or else the first input's value. Results are in the order of
        ``items``. All items are checked before the first is sent.
        """
        requests = [self.prepare(*args, **kwargs)
                    for args, kwargs in (call_arguments(item, len(self.spec.inputs))
                                         for item in items)]
        return self.fan_out(self.send, requests)

    def fan_out(self, call: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``call(item)`` for each item on the model's threads, ``max_in_flight`` at a time."""
        return list(map_bounded(call, items, self.max_in_flight, self._pool()))

    def close(self) -> None:
        """Finish the batch threads and close the connections."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        self._transport.close()

    def _pool(self) -> ThreadPoolExecutor:
        # Kept for the model's lifetime: each thread holds its own HTTP connection.
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_in_flight,
                                                    thread_name_prefix="triton-client")
            return self._executor


def unbatch(outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Take off the batch dimension the client added to a single sample."""
    return {name: array[0] for name, array in outputs.items()}


def call_arguments(item: Any, input_count: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """How one item of a batch becomes ``(args, kwargs)`` of one call.

    A mapping gives values by name; with several inputs a tuple gives them by position; any
    other item (and any tuple, for a one-input model: a vector may well be written as one) is
    the value of the first input.
    """
    if isinstance(item, Mapping):
        return (), dict(item)
    if input_count > 1 and isinstance(item, tuple):
        return item, {}
    return (item,), {}
