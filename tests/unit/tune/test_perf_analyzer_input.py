"""perf_analyzer's ``--input-data`` written from a pipeline's own examples: read back as
perf_analyzer reads it, each entry is exactly the tensor the signature encodes for its example
(text as strings, PNG bytes as length-prefixed wire bytes in base64, numbers flattened)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from tritonclient.utils import deserialize_bytes_tensor

from builder import pipe
from builder.errors import InputError
from builder.pipeline.signature import numpy_dtype
from builder.tune.perf_analyzer import write_input_data


def mixed(v, n, h, tags):
    return v * n + h.astype(np.float32).sum() + len(tags)


MIXED = (pipe.input("v", "n", "h", "tags").map(("v", "n", "h", "tags"), "y", mixed).output("y")
         .with_example(np.arange(6, dtype=np.float32).reshape(2, 3) / 3, 2,
                       np.array([0.5, -1.25], np.float16), [b"\xff\x00raw", b"ok"])
         .with_example(np.full((2, 3), -1.5, np.float32), -7,
                       np.array([3, 4], np.float16), [b"plain", b"text"]))
"""Numbers of several types and a list of bytes: one example's bytes are not UTF-8 and hold a
NUL (perf_analyzer would cut the string there), the other's are plain text."""


def read_back(tensor: dict, dtype: str) -> np.ndarray:
    """One input of one entry as perf_analyzer turns it into a tensor (without the batch axis)."""
    shape = tensor["shape"]
    content = tensor["content"]
    if isinstance(content, dict):
        raw = base64.b64decode(content["b64"])
        if dtype == "TYPE_STRING":
            return deserialize_bytes_tensor(raw).reshape(shape)
        return np.frombuffer(raw, numpy_dtype(dtype).newbyteorder("<")).reshape(shape)
    if dtype == "TYPE_STRING":
        array = np.empty(len(content), dtype=object)
        array[:] = [s.encode("utf-8") for s in content]
        return array.reshape(shape)
    if dtype in ("TYPE_FP32", "TYPE_FP64"):  # perf_analyzer reads floats only from JSON floats
        assert all(isinstance(x, float) for x in content), content
    return np.array(content, dtype=numpy_dtype(dtype)).reshape(shape)


def check_round_trip(pipeline, tmp_path) -> list[dict]:
    signature = pipeline.signature()
    path = write_input_data(signature, pipeline.examples, tmp_path / "data.json")
    document = json.loads(path.read_text())
    assert list(document) == ["data"]
    entries = document["data"]
    assert len(entries) == len(pipeline.examples)
    for entry, example in zip(entries, pipeline.examples, strict=True):
        assert list(entry) == list(signature.inputs)
        for (name, spec), value in zip(signature.inputs.items(), example, strict=True):
            expected = spec.encode_batch([value])[0]
            got = read_back(entry[name], spec.dtype)
            assert got.shape == expected.shape, name
            assert got.dtype == expected.dtype, name
            assert got.tolist() == expected.tolist(), name
    return entries


def test_text_is_sent_as_strings(tmp_path):
    from pipelines.text_embedding import pipeline

    entries = check_round_trip(pipeline, tmp_path)
    assert entries[0] == {"text": {"content": ["hello world"], "shape": [1]}}


def test_png_bytes_are_sent_as_base64_wire_bytes(tmp_path):
    from pipelines.image_classification import example_image, pipeline

    (entry,) = check_round_trip(pipeline.with_example(example_image(1)), tmp_path)[:1]
    raw = base64.b64decode(entry["image"]["content"]["b64"])
    png = example_image(0)
    assert raw == len(png).to_bytes(4, "little") + png  # the 4-byte length, then the bytes


def test_numbers_and_lists_of_bytes(tmp_path):
    entries = check_round_trip(MIXED, tmp_path)
    assert entries[0]["v"]["shape"] == [2, 3]
    assert entries[0]["n"] == {"content": [2], "shape": [1]}
    assert "b64" in entries[0]["h"]["content"]  # perf_analyzer reads no FP16 from JSON numbers
    assert "b64" in entries[0]["tags"]["content"]
    assert entries[1]["tags"] == {"content": ["plain", "text"], "shape": [2]}


def test_a_pipeline_without_examples_is_refused(tmp_path):
    with pytest.raises(InputError, match="no examples"):
        write_input_data(MIXED.signature(), (), tmp_path / "data.json")
