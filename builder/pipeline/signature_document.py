"""A pipeline's signature as the JSON document its served model carries.

A client must turn the tensors of a served pipeline back into exactly what ``pipe(...)``
returns in process: a ``str`` (not a bytes array of shape [1]), a list of labels, a float. The
tensors alone cannot say which (``TYPE_STRING [3]`` may be a list of str, a tuple of bytes or an
array of text), so the pipeline's :class:`~builder.pipeline.signature.PipelineSignature` travels
with the served model as the config parameter :data:`SIGNATURE_PARAMETER`. The repository writer
puts it there (:func:`signature_parameter`), the image's labels repeat it, and clients read it
from the server (:mod:`builder.client.codec`), never from local code::

    {"version": 1,
     "inputs":  {"<column>": {"dtype": "TYPE_STRING", "dims": [], "kind": "scalar",
                              "pytype": "str", "ragged": false}, ...},
     "outputs": {"<column>": {...}, ...},
     "streamed": ["<column>", ...]}

``streamed`` (present for a streaming pipeline only) names the outputs sent one item per
response (:mod:`builder.pipeline.streaming`).

Columns are in pipeline order, each is the tensor of the same name, and one element of the
batch dimension is one pipeline call (see :mod:`builder.pipeline.signature`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from builder.errors import SignatureError
from builder.pipeline.signature import PipelineSignature, TensorSpec

SIGNATURE_PARAMETER = "pipeline_signature"
"""The model config parameter holding the pipeline's signature as JSON."""

FORMAT_VERSION = 1


def signature_parameter(signature: PipelineSignature) -> dict[str, str]:
    """The config parameters that let clients rebuild ``signature``: give them to the config."""
    document = {
        "version": FORMAT_VERSION,
        "inputs": {name: _spec_json(spec) for name, spec in signature.inputs.items()},
        "outputs": {name: _spec_json(spec) for name, spec in signature.outputs.items()},
    }
    if signature.streamed:
        document["streamed"] = list(signature.streamed)
    if signature.whole != "list":
        document["whole"] = signature.whole
    return {SIGNATURE_PARAMETER: json.dumps(document, separators=(",", ":"))}


def parse_signature(text: str) -> PipelineSignature:
    """The signature in a :data:`SIGNATURE_PARAMETER` value; :class:`SignatureError` if the
    document is not one this version reads."""
    try:
        document = json.loads(text)
        if document.get("version") != FORMAT_VERSION:
            raise SignatureError(f"format version {document.get('version')!r}, this version "
                                 f"reads {FORMAT_VERSION}")
        return PipelineSignature(
            inputs={name: _spec(entry) for name, entry in document["inputs"].items()},
            outputs={name: _spec(entry) for name, entry in document["outputs"].items()},
            streamed=tuple(document.get("streamed", ())),
            whole=document.get("whole", "list"),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        if isinstance(error, SignatureError):
            raise
        raise SignatureError(f"not a signature document: {error}") from None


def _spec_json(spec: TensorSpec) -> dict[str, Any]:
    entry = asdict(spec)
    entry["dims"] = list(spec.dims)
    return entry


def _spec(entry: Mapping[str, Any]) -> TensorSpec:
    return TensorSpec(dtype=entry["dtype"], dims=tuple(entry["dims"]), kind=entry["kind"],
                      pytype=entry["pytype"], ragged=bool(entry["ragged"]))
