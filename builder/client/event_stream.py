"""Streaming over HTTP: Triton's ``generate_stream``, a request's responses as server-sent events.

Triton's generate extension (``POST v2/models/<name>/generate_stream``, provisional) maps the
JSON body's keys to the model's inputs and sends each response of a decoupled model as one
``data:`` event: a JSON object of its outputs by name, with no shapes (one element comes as a
scalar, more as a flat list). So a request carries each input flattened, which the server shapes
from the model's dims, and each event is shaped back from the model metadata's output dims. The
pipeline model sends one item per response to a client that does not ask otherwise
(:data:`builder.runtime.stream_serving.COALESCE_PARAMETER`), so each event is one item.

Errors: a request refused before its stream starts is answered with its HTTP status and a JSON
error; an error once the stream has started comes as an event ``{"error": ...}`` under the 200
already sent, its status at the head of its message as on gRPC's stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from builder.client.endpoint import Endpoint
from builder.client.errors import ServerUnavailableError, classify
from builder.client.response_stream import stream_failure
from builder.errors import InputError


def _shaped_back(dims: Sequence[int]) -> bool:
    """Whether flat values regain these dims: at most one of them varies."""
    return sum(d < 0 for d in dims) <= 1


def carries(signature: Any) -> bool:
    """Whether every call of a pipeline (its :class:`PipelineSignature`) streams over HTTP:
    no input of raw bytes (JSON carries text), no input or output with more than one variable
    dimension (shapes do not travel)."""
    bytes_input = any(spec.pytype == "bytes" for spec in signature.inputs.values())
    specs = [*signature.inputs.values(), *signature.outputs.values()]
    return not bytes_input and all(_shaped_back(spec.served_dims) for spec in specs)


def generate_stream_path(endpoint: Endpoint) -> str:
    version = f"/versions/{endpoint.version}" if endpoint.version else ""
    return f"/v2/models/{endpoint.model}{version}/generate_stream"


def request_body(tensors: Mapping[str, np.ndarray], what: str) -> bytes:
    """The generate request of one call's input tensors: each flattened, text as JSON strings
    (bytes that are not UTF-8 cannot travel in JSON: refused, naming the input)."""
    body: dict[str, Any] = {}
    for name, array in tensors.items():
        if array.dtype == object or array.dtype.kind in "SU":
            values = []
            for value in array.reshape(-1):
                if isinstance(value, bytes):
                    try:
                        value = value.decode("utf-8")
                    except UnicodeDecodeError:
                        raise InputError(
                            f"{what}: input {name!r} holds bytes that are not UTF-8 text, which "
                            "HTTP's generate_stream (JSON) cannot carry: stream it over gRPC "
                            "(a grpc:// URL)") from None
                values.append(str(value))
            body[name] = values
        else:
            body[name] = array.reshape(-1).tolist()
    return json.dumps(body).encode()


@dataclass(frozen=True)
class OutputShapes:
    """Each requested output's numpy dtype and item dims (without the batch axis), from the
    model's metadata: what an event's flat values are shaped back into."""

    outputs: dict[str, tuple[Any, tuple[int, ...]]]

    @classmethod
    def of(cls, metadata: Mapping[str, Any], names: Sequence[str], what: str) -> OutputShapes:
        served = {o["name"]: o for o in metadata.get("outputs", [])}
        outputs = {}
        for name in names:
            output = served[name]
            dims = tuple(int(d) for d in output["shape"][1:])
            if not _shaped_back(dims):
                raise InputError(
                    f"{what}: output {name!r} has dims {list(dims)}, more than one of them "
                    "variable, and HTTP's generate_stream sends values without their shape: "
                    "stream it over gRPC (a grpc:// URL)")
            outputs[name] = (triton_to_np_dtype(output["datatype"]), dims)
        return cls(outputs)

    def item(self, event: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """One event's outputs as arrays of one row (the batch axis of one item)."""
        arrays = {}
        for name, (dtype, dims) in self.outputs.items():
            value = event[name]
            values = value if isinstance(value, list) else [value]
            if dtype == np.object_:
                array = np.array([v.encode("utf-8") if isinstance(v, str) else v
                                  for v in values], dtype=np.object_)
            else:
                array = np.array(values, dtype=dtype)
            arrays[name] = array.reshape((1, *dims))
        return arrays


class KnownShapes:
    """The :class:`OutputShapes` a transport has read, by the outputs asked for: the served
    model's metadata is read once, not before every stream (a round trip before each first
    item)."""

    def __init__(self) -> None:
        self._shapes: dict[tuple[str, ...], OutputShapes] = {}

    def get(self, outputs: Sequence[str]) -> OutputShapes | None:
        return self._shapes.get(tuple(outputs))

    def read(self, metadata: Mapping[str, Any], outputs: Sequence[str],
             what: str) -> OutputShapes:
        """The shapes of ``outputs`` in ``metadata``, kept for the next stream."""
        shapes = self._shapes[tuple(outputs)] = OutputShapes.of(metadata, outputs, what)
        return shapes


def refusal(status: int, body: bytes, what: str) -> Exception:
    """The client's error for a request refused before its stream started."""
    try:
        message = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace")
    error = InferenceServerException(msg=message, status=str(status))
    return classify(error, what) or error


class EventReader:
    """Server-sent events from the lines of a response body: each event's data, parsed."""

    def __init__(self, shapes: OutputShapes, what: str) -> None:
        self._shapes = shapes
        self._what = what
        self._data: list[str] = []

    def line(self, line: bytes) -> Iterator[dict[str, np.ndarray]]:
        """Feed one line; yields the item an event ends with (a blank line ends an event)."""
        text = line.decode("utf-8").rstrip("\r\n")
        if text.startswith("data:"):
            self._data.append(text[5:].lstrip(" "))
            return
        if text or not self._data:
            return  # another field (event:, id:, a comment), or no event yet
        event = json.loads("\n".join(self._data))
        self._data = []
        if "error" in event:
            raise stream_failure(InferenceServerException(msg=str(event["error"])), self._what)
        if any(name in event for name in self._shapes.outputs):
            yield self._shapes.item(event)


def cut(what: str) -> ServerUnavailableError:
    """The error of a stream whose connection ended before the server ended it."""
    return ServerUnavailableError(f"{what}: the connection ended before the stream's end")
