"""Calling a served pipeline exactly like the in-process one: :class:`Client`.

``Client(url)(*values)`` takes the values ``pipe(*values)`` takes and returns what it returns —
the one output's value, or a tuple of them; ``str`` as ``str``, lists as lists, floats as
floats — by reading the pipeline's signature from the served model (see
:mod:`builder.client.codec`). Swapping ``pipe`` for ``Client(url)`` changes where the pipeline
runs, not what the caller sees.

For any Triton model, pipeline or not, :class:`TritonRemoteModel` (re-exported here) takes and
returns arrays by tensor name.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from builder.client.codec import PipelineCodec, read_signature
from builder.client.coercion import prepare
from builder.client.errors import RemoteModelError
from builder.client.lifecycle import Closing, PipelineClientBase
from builder.client.remote_model import TritonRemoteModel

__all__ = ["Client", "TritonRemoteModel", "batch_calls"]


class Client(PipelineClientBase, Closing):
    """A pipeline served by Triton, called like the pipeline.

    >>> with Client("grpc://127.0.0.1:8001/text_embedding") as embed:
    ...     vec = embed("hello world")               # == pipeline("hello world")
    ...     vecs = embed.batch(["a", "b", "c"])      # == pipeline.batch([...])

    Arguments as for :class:`TritonRemoteModel`. Nothing is connected until the first call.
    """

    model_class = TritonRemoteModel
    model: TritonRemoteModel

    @property
    def codec(self) -> PipelineCodec:
        """The pipeline's signature, read from the served model on first use."""
        if self._codec is None:  # two threads may both read it: the same codec, no harm
            spec = self.model.spec
            self._codec = PipelineCodec(spec.name, read_signature(spec))
        return self._codec

    def __call__(self, *values: Any) -> Any:
        """Run one pipeline call on the server; returns what ``pipe(*values)`` returns.

        Values that do not fit the pipeline's inputs raise
        :class:`builder.client.coercion.InputError` before anything is sent; a call the pipeline
        fails on raises :class:`builder.client.errors.RemoteModelError` with its message.
        """
        return self._send(self.codec.encode(values))

    def stream(self, *values: Any) -> Iterator[Any]:
        """Run one call of a streaming pipeline on the server (over gRPC) and yield each item
        as it arrives: what ``pipe.stream(*values)`` yields. Closing the iterator early (a
        ``break``) cancels the call on the server, which stops within one step. An error
        mid-stream is raised where it comes, after the items before it."""
        yield from self._stream(self.codec.encode_stream(values))

    def batch(self, calls: Iterable[Any], *, return_exceptions: bool = False) -> list[Any]:
        """Run many calls, up to ``max_in_flight`` requests at once; results in order.

        As ``Pipeline.batch``: each call is a tuple of input values, a one-input pipeline also
        takes plain values. Every call is checked before the first is sent. With
        ``return_exceptions`` a call the server failed gives its error in place of a result.
        """
        codec = self.codec
        requests = [codec.encode(values)
                    for values in batch_calls(calls, len(codec.signature.inputs))]

        def send(tensors: dict) -> Any:
            try:
                return self._send(tensors)
            except RemoteModelError as error:
                if return_exceptions:
                    return error
                raise

        return self.model.fan_out(send, requests)

    def close(self) -> None:
        """Close the connections."""
        self.model.close()

    def _send(self, tensors: dict) -> Any:
        """One encoded call's answer: a streaming pipeline's items collected."""
        if self.codec.signature.streamed:
            return self.codec.whole(list(self._stream(tensors)))
        # prepare() checks the encoded tensors against the served config once more
        return self.codec.decode(self.model.send(prepare(self.model.spec, tensors)))

    def _stream(self, tensors: dict) -> Iterator[Any]:
        stream = self.model.stream(prepare(self.model.spec, tensors))
        try:
            for outputs in stream:
                yield from self.codec.decode_rows(outputs)
        finally:
            stream.close()


def batch_calls(calls: Iterable[Any], input_count: int) -> list[tuple[Any, ...]]:
    """Each call of a batch as a tuple of input values (plain values for one input)."""
    if input_count == 1:
        return [call if isinstance(call, tuple) else (call,) for call in calls]
    result = []
    for call in calls:
        if not isinstance(call, Sequence) or isinstance(call, (str, bytes)):
            raise TypeError(f"the pipeline takes {input_count} inputs: give each call as a "
                            f"tuple of values, not {type(call).__name__}")
        result.append(tuple(call))
    return result
