"""A served pipeline's signature, carried in its model config, and the coding of calls with it.

A client must turn the tensors of a served pipeline back into exactly what ``pipe(...)``
returns in process: a ``str`` (not a bytes array of shape [1]), a list of labels, a float. The
tensors alone cannot say which (``TYPE_STRING [3]`` may be a list of str, a tuple of bytes or an
array of text), so the pipeline's
:class:`~builder.pipeline.signature.PipelineSignature` travels with the served model as the
config parameter :data:`SIGNATURE_PARAMETER`, a JSON document. The client reads it from the
server, never from local code: it works for any deployed pipeline, whatever version of the
pipeline's code the caller has.

The document (written by :func:`signature_parameter`)::

    {"version": 1,
     "inputs":  {"<column>": {"dtype": "TYPE_STRING", "dims": [], "kind": "scalar",
                              "pytype": "str", "ragged": false}, ...},
     "outputs": {"<column>": {...}, ...}}

Columns are in pipeline order, each is the tensor of the same name, and one element of the
batch dimension is one pipeline call (see :mod:`builder.pipeline.signature`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from builder.client.coercion import InputError
from builder.client.served_model import ServedModel
from builder.errors import SignatureError
from builder.pipeline.signature import PipelineSignature, TensorSpec

SIGNATURE_PARAMETER = "pipeline_signature"
"""The model config parameter holding the pipeline's signature as JSON."""

FORMAT_VERSION = 1


class NotAPipelineError(ValueError):
    """The served model carries no pipeline signature (or an unreadable one)."""


def signature_parameter(signature: PipelineSignature) -> dict[str, str]:
    """The config parameters that let clients rebuild ``signature``: give them to the config."""
    document = {
        "version": FORMAT_VERSION,
        "inputs": {name: _spec_json(spec) for name, spec in signature.inputs.items()},
        "outputs": {name: _spec_json(spec) for name, spec in signature.outputs.items()},
    }
    return {SIGNATURE_PARAMETER: json.dumps(document, separators=(",", ":"))}


def read_signature(served: ServedModel) -> PipelineSignature:
    """The signature a served pipeline model carries, checked against its tensors."""
    text = served.parameters.get(SIGNATURE_PARAMETER)
    if text is None:
        raise NotAPipelineError(
            f"model {served.name!r} has no {SIGNATURE_PARAMETER!r} config parameter: it is not "
            "a pipeline built by build_pipeline_model; call it with TritonRemoteModel instead")
    try:
        document = json.loads(text)
        if document.get("version") != FORMAT_VERSION:
            raise ValueError(f"format version {document.get('version')!r}, this client reads "
                             f"{FORMAT_VERSION}")
        signature = PipelineSignature(
            inputs={name: _spec(entry) for name, entry in document["inputs"].items()},
            outputs={name: _spec(entry) for name, entry in document["outputs"].items()},
        )
    except (ValueError, KeyError, TypeError, SignatureError) as error:
        raise NotAPipelineError(f"model {served.name!r}: unreadable {SIGNATURE_PARAMETER!r} "
                                f"parameter: {error}") from None
    _check_served(served, signature)
    return signature


@dataclass(frozen=True)
class PipelineCodec:
    """One pipeline call ↔ the tensors of one request (a batch of one call)."""

    model: str
    signature: PipelineSignature

    def encode(self, values: Sequence[Any]) -> dict[str, np.ndarray]:
        """The input values of one call, in pipeline order → tensors ``[1, *served_dims]``."""
        columns = list(self.signature.inputs)
        if len(values) != len(columns):
            raise InputError(f"the pipeline {self.model!r} takes {len(columns)} inputs "
                             f"({', '.join(columns)}), got {len(values)}")
        tensors = {}
        for (name, spec), value in zip(self.signature.inputs.items(), values):
            try:
                tensors[name] = spec.encode_batch([value])
            except SignatureError as error:
                raise InputError(f"input {name!r} of pipeline {self.model!r}: {error}") from None
        return tensors

    def decode(self, outputs: Mapping[str, np.ndarray]) -> Any:
        """Output tensors of one call → what ``pipe(...)`` returns: the value, or a tuple."""
        values = tuple(spec.decode_batch(outputs[name])[0]
                       for name, spec in self.signature.outputs.items())
        return values[0] if len(values) == 1 else values


def _spec_json(spec: TensorSpec) -> dict[str, Any]:
    entry = asdict(spec)
    entry["dims"] = list(spec.dims)
    return entry


def _spec(entry: Mapping[str, Any]) -> TensorSpec:
    return TensorSpec(dtype=entry["dtype"], dims=tuple(entry["dims"]), kind=entry["kind"],
                      pytype=entry["pytype"], ragged=bool(entry["ragged"]))


def _check_served(served: ServedModel, signature: PipelineSignature) -> None:
    """The signature must describe the tensors the model really serves (same names, types)."""
    for what, specs, tensors in (("inputs", signature.inputs, served.inputs),
                                 ("outputs", signature.outputs, served.outputs)):
        declared = {name: (spec.dtype, spec.served_dims) for name, spec in specs.items()}
        actual = {t.name: (_config_dtype(t.datatype), t.dims) for t in tensors}
        if declared != actual or not served.batching:
            raise NotAPipelineError(
                f"model {served.name!r}: its {SIGNATURE_PARAMETER!r} parameter describes "
                f"{what} {declared} but the model serves {actual}"
                f"{'' if served.batching else ' without batching'}: rebuild the repository")


def _config_dtype(datatype: str) -> str:
    """Wire datatype (``FP32``, ``BYTES``) → config datatype (``TYPE_FP32``, ``TYPE_STRING``)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
