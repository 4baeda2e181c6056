"""Calls of a served pipeline coded with the signature its model carries.

The signature document (:mod:`builder.pipeline.signature_document`) is read from the server —
never from local code — checked against the tensors the model really serves, and then turns one
call's values into request tensors and the response back into what ``pipe(...)`` returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from builder.client.served_model import ServedModel
from builder.errors import InputError, SignatureError, TritonBuilderError
from builder.pipeline.signature import PipelineSignature, whole_answer
from builder.pipeline.signature_document import SIGNATURE_PARAMETER, parse_signature


class NotAPipelineError(TritonBuilderError, ValueError):
    """The served model carries no pipeline signature (or an unreadable one)."""


def read_signature(served: ServedModel) -> PipelineSignature:
    """The signature a served pipeline model carries, checked against its tensors."""
    text = served.parameters.get(SIGNATURE_PARAMETER)
    if text is None:
        raise NotAPipelineError(
            f"model {served.name!r} has no {SIGNATURE_PARAMETER!r} config parameter: it is not "
            "a pipeline built by build_pipeline_model; call it with TritonRemoteModel instead")
    try:
        signature = parse_signature(text)
    except SignatureError as error:
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


    def encode_stream(self, values: Sequence[Any]) -> dict[str, np.ndarray]:
        """:meth:`encode` for a call whose items are to be streamed; a pipeline that does not
        stream refuses before anything is sent."""
        if not self.signature.streamed:
            raise InputError(f"the pipeline {self.model!r} does not stream: call it for its "
                             "one answer")
        return self.encode(values)

    def decode_rows(self, outputs: Mapping[str, np.ndarray]) -> list[Any]:
        """Output tensors holding several rows (a streamed response may carry several items)
        → each row as :meth:`decode` gives one."""
        columns = [spec.decode_batch(outputs[name]) for name, spec in
                   self.signature.outputs.items()]
        if len(columns) == 1:
            return list(columns[0])
        return [tuple(row) for row in zip(*columns, strict=True)]

    def whole(self, items: Sequence[Any]) -> Any:
        """A streaming pipeline's items (each as :meth:`decode` gives it) → what ``pipe(...)``
        returns: each output's items gathered as the pipeline says (their list, or joined)."""
        how = self.signature.whole
        if len(self.signature.outputs) == 1:
            return whole_answer(how, items)
        columns = zip(*items, strict=True) if items else ([] for _ in self.signature.outputs)
        return tuple(whole_answer(how, list(column)) for column in columns)


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
