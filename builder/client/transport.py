"""The blocking gRPC and HTTP transports: tritonclient's two clients behind one small interface.

The two clients differ in ways that leak into every caller if left alone: how inputs and
requested outputs are built, how timeouts are set, what errors look like, and threading (the
gRPC client is thread-safe, the gevent-based HTTP client is not). A transport hides that: it
takes and returns numpy arrays by name, raises the errors of :mod:`builder.client.errors`, and
may be used from any thread.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np
from tritonclient.utils import np_to_triton_dtype

from builder.client.endpoint import Endpoint
from builder.client.errors import classify
from builder.client.event_stream import (
    EventReader,
    KnownShapes,
    cut,
    generate_stream_path,
    refusal,
    request_body,
)
from builder.client.response_stream import grpc_stream
from builder.client.trace_context import trace_headers

# gRPC channels back off up to 120 s between reconnection attempts by default, and every call
# made meanwhile fails at once with UNAVAILABLE: a server that came back would stay unreachable
# long after our retries gave up. Keep the channel's own backoff short; ours paces the retries.
GRPC_RECONNECT_ARGS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# The limits tritonclient sets when given no channel arguments (ours replace its defaults).
GRPC_MESSAGE_ARGS = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
]


class Transport(Protocol):
    """What the client needs from a protocol; implemented for gRPC and HTTP."""

    def metadata(self) -> dict[str, Any]: ...

    def config(self) -> dict[str, Any]: ...

    def infer(self, tensors: Mapping[str, np.ndarray],
              outputs: Sequence[str]) -> dict[str, np.ndarray]: ...

    def stream(self, tensors: Mapping[str, np.ndarray],
               outputs: Sequence[str]) -> Iterator[dict[str, np.ndarray]]: ...

    def close(self) -> None: ...


def open_transport(endpoint: Endpoint, timeout: float, max_in_flight: int = 1) -> Transport:
    """The transport for ``endpoint.scheme``; ``timeout`` bounds each request, in seconds.

    ``max_in_flight`` needs no pool here: gRPC multiplexes one channel, HTTP has a client per
    thread.
    """
    if endpoint.scheme == "grpc":
        return GrpcTransport(endpoint, timeout)
    return HttpTransport(endpoint, timeout)


@contextmanager
def translated_errors(what: str) -> Iterator[None]:
    """Re-raise tritonclient's, sockets' and gevent's errors as :mod:`builder.client.errors`."""
    try:
        yield
    except BaseException as error:
        replacement = classify(error, what)
        if replacement is None:
            raise
        raise replacement from error


def grpc_inputs(tensors: Mapping[str, np.ndarray]) -> list[Any]:
    """``tritonclient.grpc.InferInput`` of each named array: what a gRPC request carries (the
    asyncio client takes the same)."""
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, array in tensors.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


class GrpcTransport:
    """One gRPC channel shared by all threads (it multiplexes concurrent calls)."""

    def __init__(self, endpoint: Endpoint, timeout: float) -> None:
        import tritonclient.grpc as grpcclient

        self._grpc = grpcclient
        self._endpoint = endpoint
        self._timeout = timeout
        self._client = grpcclient.InferenceServerClient(
            endpoint.address, ssl=endpoint.ssl,
            channel_args=GRPC_MESSAGE_ARGS + GRPC_RECONNECT_ARGS)

    def metadata(self) -> dict[str, Any]:
        with translated_errors(f"metadata of {self._endpoint.url}"):
            return self._client.get_model_metadata(
                self._endpoint.model, self._endpoint.version, as_json=True,
                client_timeout=self._timeout)

    def config(self) -> dict[str, Any]:
        with translated_errors(f"config of {self._endpoint.url}"):
            return self._client.get_model_config(
                self._endpoint.model, self._endpoint.version, as_json=True,
                client_timeout=self._timeout)

    def infer(self, tensors: Mapping[str, np.ndarray],
              outputs: Sequence[str]) -> dict[str, np.ndarray]:
        with translated_errors(f"inference on {self._endpoint.url}"):
            result = self._client.infer(
                self._endpoint.model, grpc_inputs(tensors), self._endpoint.version,
                outputs=[self._grpc.InferRequestedOutput(name) for name in outputs],
                client_timeout=self._timeout, headers=trace_headers())
        return {name: result.as_numpy(name) for name in outputs}

    def stream(self, tensors: Mapping[str, np.ndarray],
               outputs: Sequence[str]) -> Iterator[dict[str, np.ndarray]]:
        """One request's responses as they come (a decoupled model), on a stream of its own."""
        return grpc_stream(self._endpoint, grpc_inputs(tensors), outputs, self._timeout,
                           GRPC_MESSAGE_ARGS + GRPC_RECONNECT_ARGS)

    def close(self) -> None:
        self._client.close()


class HttpTransport:
    """One HTTP client per thread: tritonclient's gevent-based client must stay in one thread.

    Each client keeps its keep-alive connection; those of threads that have ended are closed
    when the next thread opens one (a server answering each request on a new thread would
    otherwise pile them up), and :meth:`close` closes the rest. gevent still keeps a hub (two
    file descriptors) for every thread that ever used it: for a thread-per-request caller,
    prefer gRPC or the asyncio client.
    """

    def __init__(self, endpoint: Endpoint, timeout: float) -> None:
        import tritonclient.http as httpclient

        self._http = httpclient
        self._endpoint = endpoint
        self._timeout = timeout
        self._local = threading.local()
        self._clients: list[tuple[threading.Thread, Any]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._shapes = KnownShapes()

    def _client(self) -> Any:
        if self._closed:
            raise RuntimeError(f"the client of {self._endpoint.url} is closed")
        client = getattr(self._local, "client", None)
        if client is None:
            with self._lock:
                ended = [c for thread, c in self._clients if not thread.is_alive()]
                self._clients = [(t, c) for t, c in self._clients if t.is_alive()]
                client = self._http.InferenceServerClient(
                    self._endpoint.address, ssl=self._endpoint.ssl,
                    connection_timeout=self._timeout, network_timeout=self._timeout)
                self._clients.append((threading.current_thread(), client))
            self._local.client = client
            for stale in ended:
                stale.close()
        return client

    def metadata(self) -> dict[str, Any]:
        with translated_errors(f"metadata of {self._endpoint.url}"):
            return self._client().get_model_metadata(self._endpoint.model, self._endpoint.version)

    def config(self) -> dict[str, Any]:
        with translated_errors(f"config of {self._endpoint.url}"):
            return self._client().get_model_config(self._endpoint.model, self._endpoint.version)

    def infer(self, tensors: Mapping[str, np.ndarray],
              outputs: Sequence[str]) -> dict[str, np.ndarray]:
        inputs = []
        for name, array in tensors.items():
            tensor = self._http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        requested = [self._http.InferRequestedOutput(name, binary_data=True) for name in outputs]
        with translated_errors(f"inference on {self._endpoint.url}"):
            result = self._client().infer(
                self._endpoint.model, inputs, self._endpoint.version, outputs=requested,
                headers=trace_headers())
        return {name: result.as_numpy(name) for name in outputs}

    def stream(self, tensors: Mapping[str, np.ndarray],
               outputs: Sequence[str]) -> Iterator[dict[str, np.ndarray]]:
        """One request's responses as they come (a decoupled model), over Triton's
        ``generate_stream`` (:mod:`builder.client.event_stream`) on a connection of its own;
        leaving early closes it."""
        what = f"stream from {self._endpoint.url}"
        shapes = self._shapes.get(outputs) or self._shapes.read(self.metadata(), outputs, what)
        body = request_body(tensors, what)
        host, port = self._endpoint.address.rsplit(":", 1)
        connection_class = http.client.HTTPSConnection if self._endpoint.ssl else \
            http.client.HTTPConnection
        connection = connection_class(host, int(port), timeout=self._timeout)
        try:
            with translated_errors(what):
                connection.request("POST", generate_stream_path(self._endpoint),
                                   body, {"Content-Type": "application/json"})
                response = connection.getresponse()
            if response.status != 200:
                raise refusal(response.status, response.read(), what)
            reader = EventReader(shapes, what)
            while True:
                try:
                    with translated_errors(what):
                        line = response.readline()
                except http.client.IncompleteRead:
                    raise cut(what) from None
                if not line:
                    return
                yield from reader.line(line)
        finally:
            connection.close()

    def close(self) -> None:
        with self._lock:
            clients, self._clients, self._closed = self._clients, [], True
        for _, client in clients:
            client.close()
