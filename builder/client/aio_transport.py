"""The asyncio gRPC and HTTP transports: ``tritonclient.grpc.aio`` and ``tritonclient.http.aio``.

The asyncio twins of :mod:`builder.client.transport`, with the same interface made of coroutines.
The
underlying clients (a ``grpc.aio`` channel, an ``aiohttp`` session) belong to the event loop
they are created in, so they are created on first use inside the loop, not in ``__init__``.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from tritonclient.utils import np_to_triton_dtype

from builder.client.endpoint import Endpoint
from builder.client.errors import ServerUnavailableError
from builder.client.event_stream import (
    EventReader,
    KnownShapes,
    cut,
    generate_stream_path,
    refusal,
    request_body,
)
from builder.client.response_stream import READS_COALESCED, stream_failure
from builder.client.trace_context import trace_headers
from builder.client.transport import (
    GRPC_MESSAGE_ARGS,
    GRPC_RECONNECT_ARGS,
    grpc_inputs,
    translated_errors,
)


class AsyncTransport(Protocol):
    """What the asyncio client needs from a protocol."""

    async def metadata(self) -> dict[str, Any]: ...

    async def config(self) -> dict[str, Any]: ...

    async def infer(self, tensors: Mapping[str, np.ndarray],
                    outputs: Sequence[str]) -> dict[str, np.ndarray]: ...

    async def close(self) -> None: ...


def open_async_transport(endpoint: Endpoint, timeout: float,
                         max_connections: int) -> AsyncTransport:
    """The asyncio transport for ``endpoint.scheme``; ``timeout`` bounds each request."""
    if endpoint.scheme == "grpc":
        return AsyncGrpcTransport(endpoint, timeout, max_connections)
    return AsyncHttpTransport(endpoint, timeout, max_connections)


class _LazyClient(abc.ABC):
    """A tritonclient asyncio client made on first use — inside the running loop, which
    ``aiohttp`` and ``grpc.aio`` bind to — and refused once closed."""

    def __init__(self, endpoint: Endpoint, timeout: float, max_connections: int) -> None:
        self._endpoint = endpoint
        self._timeout = timeout
        self._max_connections = max_connections
        self._client: Any = None
        self._closed = False

    @abc.abstractmethod
    def _connect(self) -> Any:
        """The tritonclient asyncio client for ``self._endpoint``."""

    def _get_client(self) -> Any:
        if self._closed:
            raise RuntimeError(f"the client of {self._endpoint.url} is closed")
        if self._client is None:
            self._client = self._connect()
        return self._client

    async def close(self) -> None:
        client, self._client, self._closed = self._client, None, True
        if client is not None:
            await client.close()


class AsyncGrpcTransport(_LazyClient):
    """One ``grpc.aio`` channel; concurrent calls are multiplexed on it."""

    def _connect(self) -> Any:
        import tritonclient.grpc.aio as grpcaio

        return grpcaio.InferenceServerClient(
            self._endpoint.address, ssl=self._endpoint.ssl,
            channel_args=GRPC_MESSAGE_ARGS + GRPC_RECONNECT_ARGS)

    async def metadata(self) -> dict[str, Any]:
        with translated_errors(f"metadata of {self._endpoint.url}"):
            return await self._get_client().get_model_metadata(
                self._endpoint.model, self._endpoint.version, as_json=True,
                client_timeout=self._timeout)

    async def config(self) -> dict[str, Any]:
        with translated_errors(f"config of {self._endpoint.url}"):
            return await self._get_client().get_model_config(
                self._endpoint.model, self._endpoint.version, as_json=True,
                client_timeout=self._timeout)

    async def infer(self, tensors: Mapping[str, np.ndarray],
                    outputs: Sequence[str]) -> dict[str, np.ndarray]:
        import tritonclient.grpc as grpcclient

        with translated_errors(f"inference on {self._endpoint.url}"):
            result = await self._get_client().infer(
                self._endpoint.model, grpc_inputs(tensors), self._endpoint.version,
                outputs=[grpcclient.InferRequestedOutput(name) for name in outputs],
                client_timeout=self._timeout, headers=trace_headers())
        return {name: result.as_numpy(name) for name in outputs}

    async def stream(self, tensors: Mapping[str, np.ndarray],
                     outputs: Sequence[str]) -> AsyncIterator[dict[str, np.ndarray]]:
        """One request's responses as they come (a decoupled model), on a stream of its own
        that ends when the server has sent the last; leaving early cancels the request."""
        import tritonclient.grpc as grpcclient

        request = {"model_name": self._endpoint.model, "inputs": grpc_inputs(tensors),
                   "model_version": self._endpoint.version,
                   "outputs": [grpcclient.InferRequestedOutput(name) for name in outputs],
                   "parameters": READS_COALESCED}

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield request

        what = f"stream from {self._endpoint.url}"
        with translated_errors(what):
            responses = self._get_client().stream_infer(one_request())
        finished = False
        try:
            while True:
                try:
                    with translated_errors(what):
                        result, error = await asyncio.wait_for(responses.__anext__(),
                                                               self._timeout)
                except StopAsyncIteration:
                    finished = True
                    return
                if error is not None:
                    raise stream_failure(error, what)
                if result.get_response().outputs:
                    yield {name: result.as_numpy(name) for name in outputs}
        finally:
            if not finished:
                responses.cancel()


class AsyncHttpTransport(_LazyClient):
    """One ``aiohttp`` session with a pool of up to ``max_connections`` keep-alive connections,
    and one of our own for streams (made on the first)."""

    def __init__(self, endpoint: Endpoint, timeout: float, max_connections: int) -> None:
        super().__init__(endpoint, timeout, max_connections)
        self._streams: Any = None
        self._shapes = KnownShapes()

    def _connect(self) -> Any:
        import tritonclient.http.aio as httpaio

        return httpaio.InferenceServerClient(
            self._endpoint.address, ssl=self._endpoint.ssl,
            conn_limit=self._max_connections, conn_timeout=self._timeout)

    async def metadata(self) -> dict[str, Any]:
        with translated_errors(f"metadata of {self._endpoint.url}"):
            return await self._get_client().get_model_metadata(
                self._endpoint.model, self._endpoint.version)

    async def config(self) -> dict[str, Any]:
        with translated_errors(f"config of {self._endpoint.url}"):
            return await self._get_client().get_model_config(
                self._endpoint.model, self._endpoint.version)

    async def infer(self, tensors: Mapping[str, np.ndarray],
                    outputs: Sequence[str]) -> dict[str, np.ndarray]:
        import tritonclient.http as httpclient

        inputs = []
        for name, array in tensors.items():
            tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        requested = [httpclient.InferRequestedOutput(name, binary_data=True) for name in outputs]
        with translated_errors(f"inference on {self._endpoint.url}"):
            result = await self._get_client().infer(
                self._endpoint.model, inputs, self._endpoint.version, outputs=requested,
                headers=trace_headers())
        return {name: result.as_numpy(name) for name in outputs}

    async def stream(self, tensors: Mapping[str, np.ndarray],
                     outputs: Sequence[str]) -> AsyncIterator[dict[str, np.ndarray]]:
        """One request's responses as they come, over Triton's ``generate_stream``
        (:mod:`builder.client.event_stream`); leaving early closes its connection."""
        import aiohttp

        what = f"stream from {self._endpoint.url}"
        shapes = self._shapes.get(outputs) or self._shapes.read(await self.metadata(), outputs,
                                                                what)
        body = request_body(tensors, what)
        if self._streams is None:
            self._streams = aiohttp.ClientSession(
                f"http{'s' if self._endpoint.ssl else ''}://{self._endpoint.address}",
                timeout=aiohttp.ClientTimeout(sock_read=self._timeout,
                                              sock_connect=self._timeout))
        with translated_errors(what):
            response = await self._streams.post(
                generate_stream_path(self._endpoint), data=body,
                headers={"Content-Type": "application/json"})
        try:
            if response.status != 200:
                raise refusal(response.status, await response.read(), what)
            reader = EventReader(shapes, what)
            while True:
                try:
                    with translated_errors(what):
                        line = await response.content.readline()
                except (ServerUnavailableError, aiohttp.ClientPayloadError) as error:
                    raise cut(what) from error
                if not line:
                    return
                for item in reader.line(line):
                    yield item
        finally:
            response.close()

    async def close(self) -> None:
        streams, self._streams = self._streams, None
        if streams is not None:
            await streams.close()
        await super().close()
