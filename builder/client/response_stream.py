"""Reading a streaming pipeline's responses as they come: gRPC's ``ModelStreamInfer``.

A streaming pipeline is served as a decoupled model (:mod:`builder.pipeline.streaming`): one
request, then one response per item and a final flag. tritonclient reads such a stream on a
thread of its own, through a callback, and allows one stream per client; here each stream gets
its own client and a queue, and is read as an iterator. Closing the iterator before the end
cancels the request on the server (``stop_stream(cancel_requests=True)``), which ends its
generation within one step.
"""

from __future__ import annotations

import queue
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from tritonclient.utils import InferenceServerException

from builder.client.endpoint import Endpoint
from builder.client.errors import RemoteModelError, classify
from builder.runtime.stream_serving import COALESCE_PARAMETER

READS_COALESCED = {COALESCE_PARAMETER: True}
"""Request parameters of the builder's gRPC streams: a response may hold several items, one
per row, which gRPC's tensors carry with their shapes."""

FINAL_PARAMETER = "triton_final_response"
"""The response parameter Triton sets on the last response of a request's stream."""
_STATUS = re.compile(r"^\[([A-Z_]+)\] ")


def stream_error(error: InferenceServerException) -> InferenceServerException:
    """A stream's error response with its status: the pipeline model writes it at the head of
    the message (``[INVALID_ARGUMENT] …``), since gRPC's stream drops the code of each
    response; what has no such head keeps the status it came with."""
    message = error.message() or ""
    match = _STATUS.match(message)
    if match is None or error.status():
        return error
    return InferenceServerException(msg=message[match.end():],
                                    status=f"StatusCode.{match.group(1)}")


def stream_failure(error: InferenceServerException, what: str) -> Exception:
    """The client's error for a stream's error response (:func:`stream_error`'s status read
    back, then :func:`~builder.client.errors.classify`)."""
    error = stream_error(error)
    return classify(error, what) or RemoteModelError(f"{what}: {error}")


def _refusal(error: InferenceServerException, responses: queue.Queue, what: str) -> Exception:
    """Why a stream could not be opened: tritonclient says only that the stream is broken and
    hands the cause (a server not there: ``UNAVAILABLE``) to the callback."""
    try:
        _, cause = responses.get(timeout=1.0)
    except queue.Empty:
        cause = None
    cause = cause if isinstance(cause, InferenceServerException) else error
    return classify(cause, what) or RemoteModelError(f"{what}: {cause}")


def grpc_stream(endpoint: Endpoint, inputs: Sequence[Any], outputs: Sequence[str],
                timeout: float, channel_args: Sequence[tuple[str, Any]] = ()
                ) -> Iterator[dict[str, np.ndarray]]:
    """Send one request (its ``InferInput`` list) on a stream of its own; yield each
    response's ``outputs`` by name.

    ``timeout`` bounds the wait for each response. An error response, or a broken stream,
    raises the error :func:`builder.client.errors.classify` gives; so does a stream that ends
    without its final response.
    """
    import tritonclient.grpc as grpcclient

    what = f"stream from {endpoint.url}"
    client = grpcclient.InferenceServerClient(endpoint.address, ssl=endpoint.ssl,
                                              channel_args=list(channel_args) or None)
    responses: queue.Queue = queue.Queue()
    finished = False
    try:
        try:
            client.start_stream(lambda result, error: responses.put((result, error)))
            client.async_stream_infer(
                endpoint.model, inputs, endpoint.version,
                outputs=[grpcclient.InferRequestedOutput(name) for name in outputs],
                enable_empty_final_response=True, parameters=READS_COALESCED)
        except InferenceServerException as error:
            raise _refusal(error, responses, what) from error
        while True:
            try:
                result, failure = responses.get(timeout=timeout)
            except queue.Empty:
                late = TimeoutError(f"no response within {timeout} s")
                raise (classify(late, what) or late) from None
            if failure is not None:
                raise stream_failure(failure, what) from failure
            response = result.get_response()
            final = response.parameters[FINAL_PARAMETER].bool_param
            if response.outputs:
                yield {name: result.as_numpy(name) for name in outputs}
            if final:
                finished = True
                return
    finally:
        try:
            client.stop_stream(cancel_requests=not finished)
        finally:
            client.close()
