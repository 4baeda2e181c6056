"""Turning the Python values a caller passes into the tensors a served model expects.

Everything is checked here, before a byte is sent: a wrong input name, rank, size or kind of
value would otherwise come back from the server as a terse error about a tensor the caller
never named, or worse, be silently reinterpreted (floats truncated into integers, a vector
taken as a batch). Each error names the input and what the model expects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.utils import triton_to_np_dtype

from builder.client.served_model import ServedModel, ServedTensor
from builder.errors import InputError


@dataclass(frozen=True)
class Request:
    """The tensors to send, and whether the caller gave one sample (so the batch dimension the
    client added must be taken off the outputs again)."""

    tensors: dict[str, np.ndarray]
    single: bool


def bind(spec: ServedModel, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Match positional arguments (in the model's input order) and keywords to input names."""
    names = [tensor.name for tensor in spec.inputs]
    if len(args) > len(names):
        raise InputError(f"model {spec.name!r} takes {len(names)} inputs ({', '.join(names)}), "
                         f"got {len(args)} positional values")
    values = dict(zip(names, args))
    for name, value in kwargs.items():
        if name not in names:
            raise InputError(f"model {spec.name!r} has no input {name!r}; its inputs are "
                             f"{', '.join(names)}")
        if name in values:
            raise InputError(f"input {name!r} of model {spec.name!r} given twice")
        values[name] = value
    missing = [t.name for t in spec.inputs if t.name not in values and not t.optional]
    if missing:
        raise InputError(f"model {spec.name!r} needs input(s) {', '.join(missing)}: " + "; ".join(
            f"{t.name}: {t.describe(spec.batching)}" for t in spec.inputs if t.name in missing))
    return values


def prepare(spec: ServedModel, values: Mapping[str, Any]) -> Request:
    """Convert bound values to tensors; add the batch dimension to single samples.

    With a batching model (``max_batch_size > 0``) a value of rank ``len(dims)`` is one sample
    and gets a batch dimension of 1; a value of rank ``len(dims) + 1`` is already a batch. All
    inputs of one call must agree.
    """
    tensors: dict[str, np.ndarray] = {}
    singles: dict[str, bool] = {}
    for name, value in values.items():
        tensor_spec = spec.input(name)
        assert tensor_spec is not None, "bind() lets only known names through"
        array = to_array(value, tensor_spec, where=f"input {name!r} of model {spec.name!r}")
        tensors[name], singles[name] = _fit_shape(array, tensor_spec, spec)
    if len(set(singles.values())) > 1:
        given = ", ".join(f"{n} {'one sample' if s else 'a batch'}" for n, s in singles.items())
        raise InputError(f"model {spec.name!r}: give every input as one sample or every input as "
                         f"a batch, not a mix ({given})")
    sizes = {name: t.shape[0] for name, t in tensors.items() if spec.batching}
    if len(set(sizes.values())) > 1:
        raise InputError(f"model {spec.name!r}: inputs have different batch sizes {sizes}")
    return Request(tensors=tensors, single=any(singles.values()))


def to_array(value: Any, spec: ServedTensor, where: str) -> np.ndarray:
    """``value`` as an array of the spec's datatype, refusing lossy or meaningless casts."""
    if spec.datatype == "BYTES":
        return _to_bytes_array(value, where)
    target = np.dtype(triton_to_np_dtype(spec.datatype))
    try:
        array = np.asarray(value)
    except ValueError as error:  # ragged nested lists
        raise InputError(f"{where} must be a rectangular {spec.datatype} array: {error}") from None
    kind = array.dtype.kind
    if kind in "USOV" or (kind == "c"):
        raise InputError(f"{where} expects numbers ({spec.datatype}), got {_kind_name(array)}")
    if target.kind == "b" and kind != "b":
        raise InputError(f"{where} expects booleans (BOOL), got {_kind_name(array)}")
    if target.kind in "iu":
        if kind == "f":
            raise InputError(f"{where} expects integers ({spec.datatype}), got floats; round "
                             "them explicitly if that is meant")
        converted = array.astype(target)
        if not np.array_equal(converted, array):
            info = np.iinfo(target)
            raise InputError(f"{where} expects {spec.datatype} in [{info.min}, {info.max}], got "
                             "values outside that range")
        return converted
    return array.astype(target, copy=False)


def _to_bytes_array(value: Any, where: str) -> np.ndarray:
    """str becomes utf-8 bytes; bytes stay; anything else is not a string."""
    if isinstance(value, np.ndarray) and value.dtype.kind == "S":
        return value.astype(object)
    try:
        array = np.array(value, dtype=object)
    except ValueError as error:
        raise InputError(f"{where} must be a rectangular array of strings: {error}") from None
    flat = array.reshape(-1)
    for i, item in enumerate(flat):
        if isinstance(item, str):
            try:
                flat[i] = item.encode("utf-8")
            except UnicodeEncodeError as error:
                raise InputError(f"{where}: {item[:40]!r} cannot be sent as UTF-8 text "
                                 f"({error.reason} at position {error.start})") from None
        elif isinstance(item, (bytes, np.bytes_)):
            flat[i] = bytes(item)
        else:
            raise InputError(f"{where} expects str or bytes (BYTES), got "
                             f"{type(item).__name__} {item!r:.40}")
    return flat.reshape(array.shape)


def _fit_shape(
    array: np.ndarray, tensor: ServedTensor, spec: ServedModel
) -> tuple[np.ndarray, bool]:
    where = f"input {tensor.name!r} of model {spec.name!r}"
    expected = tensor.describe(spec.batching)
    rank = len(tensor.dims)
    single = spec.batching and array.ndim == rank
    if single:
        array = array[np.newaxis]
    elif array.ndim != rank + spec.batching:
        one = f"rank {rank} (one sample) or {rank + 1} (a batch)" if spec.batching else str(rank)
        raise InputError(f"{where} expects {expected}: rank {one}, got shape {array.shape}")
    sample_shape = array.shape[1:] if spec.batching else array.shape
    if any(d >= 0 and d != got for d, got in zip(tensor.dims, sample_shape)):
        raise InputError(f"{where} expects {expected}, got shape "
                         f"{sample_shape if single else array.shape}")
    if spec.batching and not 1 <= array.shape[0] <= spec.max_batch_size:
        raise InputError(f"{where}: batch of {array.shape[0]}, the model takes 1 to "
                         f"{spec.max_batch_size}")
    return array, single


def _kind_name(array: np.ndarray) -> str:
    if array.dtype.kind in "US" or (array.dtype.kind == "O" and array.size and
                                    isinstance(array.reshape(-1)[0], (str, bytes))):
        return "strings"
    return f"{array.dtype} values"
