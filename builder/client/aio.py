"""The asyncio clients: :class:`AsyncTritonRemoteModel` and (for pipelines) ``AsyncClient``.

For services that already run an event loop (a web server fanning requests out to Triton), a
blocking client would stall the loop or need a thread per request. These behave as
:mod:`builder.client.remote_model` and :mod:`builder.client.pipeline` do (same checks before
sending, same
results, same retries) over ``tritonclient.grpc.aio`` and ``tritonclient.http.aio``, and
``batch`` keeps a bounded number of requests in flight on the loop itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import numpy as np

from builder.client.aio_transport import open_async_transport
from builder.client.codec import PipelineCodec, read_signature
from builder.client.coercion import Request, bind, prepare
from builder.client.errors import RemoteModelError
from builder.client.fanout import amap_bounded
from builder.client.lifecycle import AsyncClosing, PipelineClientBase, RemoteModelBase
from builder.client.pipeline import batch_calls
from builder.client.remote_model import call_arguments, unbatch
from builder.client.retry import acall_with_retry
from builder.client.served_model import ServedModel, served_model

T = TypeVar("T")
R = TypeVar("R")


class AsyncTritonRemoteModel(RemoteModelBase, AsyncClosing):
    """:class:`builder.client.remote_model.TritonRemoteModel` for asyncio: ``await model(...)``.

    >>> async with AsyncTritonRemoteModel("http://127.0.0.1:8000/linear") as linear:
    ...     (await linear([1.0, 2.0, 3.0, 4.0]))["OUTPUT"]

    Use it from one event loop. Nothing is connected until the first call.
    """

    open_transport = staticmethod(open_async_transport)
    new_lock = asyncio.Lock

    async def spec(self) -> ServedModel:
        """The model's inputs, outputs and batching, read from the server on first use."""
        if self._spec is None:
            async with self._lock:
                if self._spec is None:
                    metadata = await acall_with_retry(self._transport.metadata, self.retry_policy)
                    config = await acall_with_retry(self._transport.config, self.retry_policy)
                    self._spec = served_model(metadata, config)
        return self._spec

    async def __call__(self, *args: Any, **kwargs: Any) -> dict[str, np.ndarray]:
        """Run the model; see :meth:`builder.client.remote_model.TritonRemoteModel.__call__`."""
        return await self.send(await self.prepare(*args, **kwargs))

    async def infer(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Like calling the model, with inputs in a mapping."""
        return await self(**inputs)

    async def prepare(self, *args: Any, **kwargs: Any) -> Request:
        """Check and convert the inputs of one call, without sending them."""
        spec = await self.spec()
        return prepare(spec, bind(spec, args, kwargs))

    async def send(self, request: Request) -> dict[str, np.ndarray]:
        """Send a prepared request (retrying while the server is unavailable)."""
        names = [output.name for output in (await self.spec()).outputs]
        outputs = await acall_with_retry(lambda: self._transport.infer(request.tensors, names),
                                         self.retry_policy)
        return unbatch(outputs) if request.single else outputs

    async def stream(self, request: Request) -> AsyncGenerator[dict[str, np.ndarray], None]:
        """Send a prepared request to a decoupled model; yield each response's outputs as it
        comes, with their batch axis (see ``TritonRemoteModel.stream``). Leaving the iteration
        early cancels the request on the server."""
        names = [output.name for output in (await self.spec()).outputs]
        stream = self._transport.stream(request.tensors, names)
        try:
            async for outputs in stream:
                yield outputs
        finally:
            await stream.aclose()

    async def batch(self, items: Iterable[Any]) -> list[dict[str, np.ndarray]]:
        """One call per item, up to ``max_in_flight`` at a time; see ``TritonRemoteModel.batch``."""
        spec = await self.spec()
        requests = [prepare(spec, bind(spec, args, kwargs))
                    for args, kwargs in (call_arguments(item, len(spec.inputs))
                                         for item in items)]
        return await self.fan_out(self.send, requests)

    async def fan_out(self, call: Callable[[T], Awaitable[R]], items: Iterable[T]) -> list[R]:
        """``await call(item)`` for each item, ``max_in_flight`` at a time, results in order."""
        return await amap_bounded(call, items, self.max_in_flight)

    async def close(self) -> None:
        """Close the connections."""
        await self._transport.close()


class AsyncClient(PipelineClientBase, AsyncClosing):
    """:class:`builder.client.Client` for asyncio: ``await client(*values)`` returns what
    ``pipe(*values)`` returns.

    >>> async with AsyncClient("grpc://127.0.0.1:8001/text_embedding") as embed:
    ...     vec = await embed("hello world")
    """

    model_class = AsyncTritonRemoteModel
    model: AsyncTritonRemoteModel

    async def codec(self) -> PipelineCodec:
        """The pipeline's signature, read from the served model on first use."""
        if self._codec is None:
            spec = await self.model.spec()
            self._codec = PipelineCodec(spec.name, read_signature(spec))
        return self._codec

    async def __call__(self, *values: Any) -> Any:
        """One pipeline call; see :meth:`builder.client.Client.__call__`."""
        return await self._send((await self.codec()).encode(values))

    async def stream(self, *values: Any) -> AsyncIterator[Any]:
        """One call of a streaming pipeline, each item as it arrives; see
        :meth:`builder.client.Client.stream`."""
        async for item in self._stream((await self.codec()).encode_stream(values)):
            yield item

    async def batch(self, calls: Iterable[Any], *, return_exceptions: bool = False) -> list[Any]:
        """Many calls, ``max_in_flight`` at a time; see :meth:`builder.client.Client.batch`."""
        codec = await self.codec()
        requests = [codec.encode(values)
                    for values in batch_calls(calls, len(codec.signature.inputs))]

        async def send(tensors: dict) -> Any:
            try:
                return await self._send(tensors)
            except RemoteModelError as error:
                if return_exceptions:
                    return error
                raise

        return await self.model.fan_out(send, requests)

    async def close(self) -> None:
        """Close the connections."""
        await self.model.close()

    async def _send(self, tensors: dict) -> Any:
        """One encoded call's answer: a streaming pipeline's items collected."""
        spec = await self.model.spec()
        codec = await self.codec()
        if codec.signature.streamed:
            return codec.whole([item async for item in self._stream(tensors)])
        return codec.decode(await self.model.send(prepare(spec, tensors)))

    async def _stream(self, tensors: dict) -> AsyncIterator[Any]:
        codec = await self.codec()
        stream = self.model.stream(prepare(await self.model.spec(), tensors))
        try:
            async for outputs in stream:
                for item in codec.decode_rows(outputs):
                    yield item
        finally:
            await stream.aclose()
