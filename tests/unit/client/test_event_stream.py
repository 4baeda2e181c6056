"""HTTP streaming (Triton's generate_stream): the request body and the events read back.

The events are the bytes Triton 2.51 sends (read off a served streaming pipeline: ``data:`` lines,
a blank line after each, a scalar for one element); the end-to-end tests stream from the server.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from builder.client import RemoteInputError, RemoteModelError, ServerUnavailableError
from builder.client.endpoint import Endpoint
from builder.client.event_stream import (
    EventReader,
    OutputShapes,
    carries,
    generate_stream_path,
    refusal,
    request_body,
)
from builder.errors import InputError

METADATA = {"outputs": [
    {"name": "char", "datatype": "BYTES", "shape": [-1, 1]},
    {"name": "box", "datatype": "FP32", "shape": [-1, 2, 2]},
    {"name": "tokens", "datatype": "INT64", "shape": [-1, -1]},
]}


def _events(reader: EventReader, raw: bytes) -> list:
    return [item for line in raw.splitlines(keepends=True) for item in reader.line(line)]


def test_inputs_travel_flattened_and_text_as_json_strings():
    body = json.loads(request_body({
        "image": np.arange(6, dtype=np.uint8).reshape(1, 2, 3),
        "text": np.array([["héllo".encode()]], dtype=object),
    }, "stream"))
    assert body == {"image": [0, 1, 2, 3, 4, 5], "text": ["héllo"]}


def test_bytes_that_are_not_text_are_refused_naming_the_input_and_grpc():
    with pytest.raises(InputError, match="input 'png'.*grpc://"):
        request_body({"png": np.array([[b"\x89PNG\xff"]], dtype=object)}, "stream")


def test_each_event_is_one_item_shaped_back_from_the_models_dims():
    reader = EventReader(OutputShapes.of(METADATA, ["char", "box", "tokens"], "s"), "s")
    raw = (b'data: {"char":"4","box":[1,2,3,4],"tokens":[7,8,9],"model_name":"p",'
           b'"model_version":"1"}\n\n'
           b': a comment\n\n'
           b'data: {"char":"\xc3\xa9","box":[0,0,0,0],"tokens":5}\n\n')
    first, second = _events(reader, raw)
    assert first["char"].tolist() == [[b"4"]]
    assert first["box"].dtype == np.float32 and first["box"].shape == (1, 2, 2)
    assert first["tokens"].tolist() == [[7, 8, 9]]
    assert second["char"].tolist() == [["é".encode()]]
    assert second["tokens"].tolist() == [[5]]


def test_an_event_without_outputs_is_no_item():
    reader = EventReader(OutputShapes.of(METADATA, ["char"], "s"), "s")
    assert _events(reader, b'data: {"model_name":"p","model_version":"1"}\n\n') == []


@pytest.mark.parametrize(("message", "error"), [
    ("[INVALID_ARGUMENT] operator 'check' rejected its input", RemoteInputError),
    ("[UNAVAILABLE] the server is stopping", ServerUnavailableError),
    ("[INTERNAL] operator 'check' failed: ValueError", RemoteModelError),
])
def test_an_error_event_raises_the_error_its_status_names(message, error):
    reader = EventReader(OutputShapes.of(METADATA, ["char"], "s"), "stream from x")
    raw = b'data: {"char":"a"}\n\ndata: ' + json.dumps({"error": message}).encode() + b"\n\n"
    items = []
    with pytest.raises(error, match="stream from x: operator|stream from x: the server"):
        for line in raw.splitlines(keepends=True):
            items.extend(reader.line(line))
    assert len(items) == 1


def test_an_output_with_two_variable_dims_cannot_be_shaped_back():
    metadata = {"outputs": [{"name": "grid", "datatype": "FP32", "shape": [-1, -1, -1]}]}
    with pytest.raises(InputError, match="output 'grid'.*grpc://"):
        OutputShapes.of(metadata, ["grid"], "s")


@pytest.mark.parametrize(("status", "error"), [
    (400, RemoteInputError), (503, ServerUnavailableError), (500, RemoteModelError)])
def test_a_request_refused_before_its_stream_keeps_its_http_status(status, error):
    raised = refusal(status, b'{"error":"no"}', "stream from x")
    assert type(raised) is error and "stream from x: no" in str(raised)


def test_the_path_names_the_version_when_the_endpoint_does():
    assert generate_stream_path(Endpoint("http", "h:1", "m")) == "/v2/models/m/generate_stream"
    assert generate_stream_path(Endpoint("http", "h:1", "m", "2")) == (
        "/v2/models/m/versions/2/generate_stream")


def test_a_pipeline_streams_over_http_unless_its_calls_cannot_travel_there():
    from builder import pipe
    from builder.pipeline.signature import PipelineSignature, TensorSpec
    from pipelines.text_recognizer import streaming_pipeline

    def chars(text):
        yield from text

    assert carries(streaming_pipeline.signature())  # uint8 32 x 96 in, one char per item
    assert carries(pipe.input("t").stream("t", "c", chars).output("c")
                   .with_example("ab").signature())
    assert not carries(pipe.input("b").stream("b", "c", chars).output("c")
                       .with_example(b"\x89PNG").signature())  # raw bytes: not JSON
    text = TensorSpec("TYPE_STRING", (), "scalar", "str")
    grid = TensorSpec("TYPE_FP32", (-1, -1))
    assert not carries(PipelineSignature({"t": text}, {"g": grid}, ("g",)))
    assert carries(PipelineSignature({"t": text}, {"g": TensorSpec("TYPE_FP32", (2, -1))},
                                     ("g",)))
