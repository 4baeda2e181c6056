"""What a served model accepts and returns, as its server describes it.

The client reads it from the server (model metadata and config, once) instead of from local
code: the served model is the truth, whatever built it. Both protocols describe a model in the
KServe v2 JSON shapes, give or take int64 numbers written as strings by protobuf's JSON printer;
this module irons that out so nothing downstream knows which protocol was used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ServedTensor:
    """One input or output: its Triton datatype (``FP32``, ``BYTES``…) and its ``dims`` without
    the batch dimension (-1 where any size goes)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False

    def describe(self, batching: bool) -> str:
        """``FP32 [batch, 4]``: how errors show what a tensor should look like."""
        dims = ", ".join("any" if d < 0 else str(d) for d in self.dims)
        dims = f"batch, {dims}" if batching and dims else "batch" if batching else dims
        return f"{self.datatype} [{dims}]"


@dataclass(frozen=True)
class ServedModel:
    """A served model's signature and the few config facts a client needs."""

    name: str
    version: str
    max_batch_size: int
    inputs: tuple[ServedTensor, ...]
    outputs: tuple[ServedTensor, ...]
    parameters: Mapping[str, str] = field(default_factory=dict)

    @property
    def batching(self) -> bool:
        """With ``max_batch_size > 0`` every tensor has a leading batch dimension not in dims."""
        return self.max_batch_size > 0

    def input(self, name: str) -> ServedTensor | None:
        return next((spec for spec in self.inputs if spec.name == name), None)


def served_model(metadata: Mapping[str, Any], config: Mapping[str, Any]) -> ServedModel:
    """Build a :class:`ServedModel` from the JSON forms of model metadata and model config.

    Datatypes come from the metadata (the wire names ``FP32``/``BYTES`` the requests use);
    dims, optionality and parameters from the config, which has them without the batch
    dimension.
    """
    config = config.get("config", config)  # gRPC wraps it in a ModelConfigResponse
    max_batch_size = int(config.get("max_batch_size", 0))
    datatypes = {t["name"]: t["datatype"] for t in [*metadata.get("inputs", ()),
                                                    *metadata.get("outputs", ())]}
    config_tensors = {t["name"]: t for t in [*config.get("input", ()), *config.get("output", ())]}

    def tensor(entry: Mapping[str, Any]) -> ServedTensor:
        name = entry["name"]
        configured = config_tensors.get(name)
        if configured is not None:
            dims = tuple(int(d) for d in configured.get("dims", ()))
        else:  # not in the config (auto-completed models): strip the batch dim from metadata
            shape = tuple(int(d) for d in entry.get("shape", ()))
            dims = shape[1:] if max_batch_size > 0 else shape
        return ServedTensor(name=name, datatype=datatypes[name], dims=dims,
                          optional=bool(configured and configured.get("optional", False)))

    parameters = {key: value.get("string_value", "")
                  for key, value in config.get("parameters", {}).items()}
    versions = metadata.get("versions") or [""]
    return ServedModel(
        name=metadata["name"], version=str(versions[-1]), max_batch_size=max_batch_size,
        inputs=tuple(tensor(t) for t in metadata.get("inputs", ())),
        outputs=tuple(tensor(t) for t in metadata.get("outputs", ())),
        parameters=parameters,
    )
