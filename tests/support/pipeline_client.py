"""Calling a served pipeline over gRPC with plain ``tritonclient``, and comparing results.

The tests encode calls with the pipeline's own
:class:`~builder.pipeline.signature.PipelineSignature` (the typed tensors any client would send)
and decode the response tensors back into Python values, so they can be compared with
``pipe(...)`` run in process.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Any

import tritonclient.grpc as grpcclient

from builder.pipeline.signature import PipelineSignature


def wire_dtype(triton: str) -> str:
    """``TYPE_FP32`` → ``FP32``; strings travel as ``BYTES``."""
    name = triton.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def make_inputs(signature: PipelineSignature, calls: Sequence[tuple]) -> list:
    inputs = []
    for position, (name, spec) in enumerate(signature.inputs.items()):
        array = spec.encode_batch([call[position] for call in calls])
        tensor = grpcclient.InferInput(name, list(array.shape), wire_dtype(spec.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def decode(signature: PipelineSignature, result: Any) -> list[Any]:
    """A response → one result per call, shaped like ``pipe(...)``'s return value."""
    columns = [spec.decode_batch(result.as_numpy(name))
               for name, spec in signature.outputs.items()]
    return [values[0] if len(values) == 1 else tuple(values) for values in zip(*columns,
                                                                              strict=True)]


def infer(client: grpcclient.InferenceServerClient, model: str, signature: PipelineSignature,
          calls: Sequence[tuple]) -> list[Any]:
    """One request holding ``calls`` along the batch dimension."""
    return decode(signature, client.infer(model, make_inputs(signature, calls)))


def infer_concurrently(client: grpcclient.InferenceServerClient, model: str,
                       signature: PipelineSignature, calls: Sequence[tuple]) -> list[Any]:
    """One request per call, all in flight at once (so Triton can batch them dynamically)."""
    done: queue.Queue = queue.Queue()
    for index, call in enumerate(calls):
        client.async_infer(model, make_inputs(signature, [call]),
                           callback=lambda result, error, index=index: done.put(
                               (index, result, error)))
    results: list[Any] = [None] * len(calls)
    for _ in calls:
        index, result, error = done.get(timeout=120)
        if error is not None:
            raise error
        results[index] = decode(signature, result)[0]
    return results
