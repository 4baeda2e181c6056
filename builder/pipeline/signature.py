"""Typed signatures: the Triton dtype and shape of a pipeline's inputs and outputs.

Why: the served pipeline model must expose real named, typed tensors (``TYPE_STRING`` for text and
bytes, numeric types otherwise) so that any Triton client can call it, and a served result must be
comparable with the in-process one. A :class:`TensorSpec` therefore records not only the Triton
dtype and dims of a column but also the Python *kind* of its values (``str``, ``int``, a list of
``str``, a NumPy array, ...). The same spec turns a Python value into the tensor a request carries
and turns that tensor back into the same Python value, in the server's runtime and in clients.

Shapes follow Triton with ``max_batch_size > 0``: ``dims`` exclude the batch dimension, and each
element along the batch dimension is one pipeline call. A scalar is served with ``dims [1]``. A
*ragged* column (one produced after a ``flat_map`` or ``filter``) holds a list of rows per call and
is served with a variable leading dimension: ``dims [-1, *item_dims]``.

This module is captured by value into ``pipe.pickle``: it imports nothing but NumPy at the top.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from builder.errors import SignatureError

TRITON_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
"""Triton data types (``model_config.proto``) and the NumPy types tritonclient uses for them."""

_NUMPY_TO_TRITON = {np.dtype(v): k for k, v in TRITON_TO_NUMPY.items()}

KINDS = ("scalar", "list", "tuple", "array", "tensor")
"""How a value looks in Python: a scalar, a list or tuple of scalars, an array, a torch tensor."""

PYTYPES = ("str", "bytes", "int", "float", "bool", "numpy")
"""The element type: Python ``str``/``bytes``/``int``/``float``/``bool``, or a NumPy dtype."""

_PYTHON_SCALARS = {"bool": ("TYPE_BOOL", bool), "int": ("TYPE_INT64", int),
                   "float": ("TYPE_FP64", float), "str": ("TYPE_STRING", str),
                   "bytes": ("TYPE_STRING", bytes)}


def triton_dtype(dtype: Any) -> str:
    """The Triton type of a NumPy dtype (``float32`` → ``TYPE_FP32``, text → ``TYPE_STRING``)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "USO":
        return "TYPE_STRING"
    try:
        return _NUMPY_TO_TRITON[dtype]
    except KeyError:
        raise SignatureError(f"NumPy dtype {dtype} has no Triton data type") from None


def numpy_dtype(triton: str) -> np.dtype:
    """The NumPy dtype tensors of a Triton type use (``TYPE_STRING`` → ``object``)."""
    try:
        return np.dtype(TRITON_TO_NUMPY[triton])
    except KeyError:
        raise SignatureError(f"unknown Triton data type {triton!r}") from None


@dataclass(frozen=True)
class TensorSpec:
    """The type of one column: Triton ``dtype``, value ``dims`` and Python ``kind``/``pytype``.

    ``dims`` is the shape of one value (``()`` for a scalar, ``(n,)`` for a list, the array shape
    otherwise; ``-1`` where it varies). ``ragged`` marks a column holding a list of rows per call.
    """

    dtype: str
    dims: tuple[int, ...] = ()
    kind: str = "array"
    pytype: str = "numpy"
    ragged: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))
        numpy_dtype(self.dtype)
        if self.kind not in KINDS:
            raise SignatureError(f"unknown value kind {self.kind!r}; expected one of {KINDS}")
        if self.pytype not in PYTYPES:
            raise SignatureError(f"unknown element type {self.pytype!r}; expected one of {PYTYPES}")
        if (self.dtype == "TYPE_STRING") != (self.pytype in ("str", "bytes")):
            raise SignatureError(f"element type {self.pytype} cannot be {self.dtype}")
        if self.kind == "scalar" and self.dims:
            raise SignatureError("a scalar has dims ()")
        if self.kind in ("list", "tuple") and len(self.dims) != 1:
            raise SignatureError(f"a {self.kind} has one dimension, not {self.dims}")
        if self.kind == "tensor" and self.pytype != "numpy":
            raise SignatureError("a torch tensor holds numbers")
        if any(d < -1 for d in self.dims):
            raise SignatureError(f"invalid dims {list(self.dims)}: sizes are -1 (varying) or more")

    # -- the served tensor -------------------------------------------------------------------
    @property
    def served_dims(self) -> tuple[int, ...]:
        """``dims`` in the model config: ``[1]`` for a scalar, ``[-1, ...]`` for a ragged column."""
        if self.ragged:
            return (-1, *self.dims)
        return self.dims or (1,)

    def describe(self) -> str:
        """A short readable type for messages: ``list[str] [3]``, ``ndarray TYPE_FP32 [8]``."""
        what = {
            "scalar": self.pytype if self.pytype != "numpy" else f"numpy {self.dtype}",
            "list": f"list[{self.pytype}]",
            "tuple": f"tuple[{self.pytype}]",
            "array": f"ndarray {self.dtype}",
            "tensor": f"tensor {self.dtype}",
        }[self.kind]
        text = f"{what} {list(self.dims)}" if self.dims else what
        return f"rows of {text}" if self.ragged else text

    def item(self) -> TensorSpec:
        """The spec of one row of a ragged column."""
        return replace(self, ragged=False)

    # -- Python value <-> array --------------------------------------------------------------
    def encode_value(self, value: Any) -> np.ndarray:
        """One value → an array of shape ``dims`` (checked) and the served dtype."""
        dtype = numpy_dtype(self.dtype)
        if self.kind == "scalar":
            _check_pytype(value, self.pytype, self)
            array = np.asarray(_to_wire(value, self.pytype), dtype=dtype)
        elif self.kind in ("list", "tuple"):
            if not isinstance(value, (list, tuple)):
                raise SignatureError(f"expected {self.describe()}, got {type(value).__name__}")
            for element in value:
                _check_pytype(element, self.pytype, self)
            if self.dtype == "TYPE_STRING":
                array = np.empty(len(value), dtype=object)
                array[:] = [_to_wire(v, self.pytype) for v in value]
            else:
                array = np.asarray(list(value), dtype=dtype)
        else:
            array = _array_of(value, self.kind)
            if self.dtype == "TYPE_STRING":
                if array.dtype.kind not in "USO":
                    raise SignatureError(f"expected {self.describe()}, got dtype {array.dtype}")
                flat = [_to_wire(v, self.pytype) for v in array.reshape(-1).tolist()]
                wire = np.empty(len(flat), dtype=object)
                wire[:] = flat
                array = wire.reshape(array.shape)
            elif array.dtype != dtype:
                if not np.can_cast(array.dtype, dtype, casting="same_kind"):
                    raise SignatureError(f"expected {self.describe()}, got dtype {array.dtype}")
                array = array.astype(dtype)
        self._check_shape(array.shape)
        return array

    def decode_value(self, array: np.ndarray) -> Any:
        """An array of shape ``dims`` (or ``[1]`` for a scalar) → the Python value it encodes."""
        array = np.asarray(array)
        if self.kind == "scalar":
            if array.size != 1:
                raise SignatureError(f"expected one {self.describe()}, got shape {array.shape}")
            return _from_wire(array.reshape(()).item() if self.pytype != "numpy"
                              else array.reshape(())[()], self.pytype)
        self._check_shape(array.shape)
        if self.kind in ("list", "tuple"):
            values = [_from_wire(v, self.pytype) for v in array.tolist()]
            return values if self.kind == "list" else tuple(values)
        if self.dtype == "TYPE_STRING":
            values = [_from_wire(v, self.pytype) for v in array.reshape(-1).tolist()]
            if self.pytype == "str":
                return np.array(values, dtype=str).reshape(array.shape)
            decoded = np.empty(len(values), dtype=object)
            decoded[:] = values
            return decoded.reshape(array.shape)
        array = np.ascontiguousarray(array, dtype=numpy_dtype(self.dtype))
        if self.kind == "tensor":
            import torch

            return torch.from_numpy(array.copy())
        return array

    # -- one call (a value, or the rows of a ragged column) ----------------------------------
    def encode_call(self, value: Any) -> np.ndarray:
        """What one call contributes along the batch dimension: shape ``served_dims``."""
        if not self.ragged:
            return self.encode_value(value).reshape(self.dims or (1,))
        rows = list(value)
        item_dims = self.dims
        encoded = [self.encode_value(row) for row in rows]
        if not encoded:
            shape = tuple(0 if d == -1 else d for d in item_dims)
            return np.empty((0, *shape), dtype=numpy_dtype(self.dtype))
        _check_same_shapes([e.shape for e in encoded], "the rows of one call")
        return np.stack(encoded)

    def decode_call(self, array: np.ndarray) -> Any:
        """Inverse of :meth:`encode_call`."""
        if not self.ragged:
            return self.decode_value(array)
        return [self.decode_value(row) for row in np.asarray(array)]

    # -- a batch of calls --------------------------------------------------------------------
    def encode_batch(self, values: Sequence[Any]) -> np.ndarray:
        """The values of several calls → one tensor ``[len(values), *served_dims]``.

        Calls whose values differ in shape (variable dims, ragged row counts) cannot share one
        tensor; send them in separate requests.
        """
        if len(values) == 1:  # one call per request, the usual case: nothing to stack
            return np.ascontiguousarray(self.encode_call(values[0])[None])
        encoded = [self.encode_call(v) for v in values]
        _check_same_shapes([e.shape for e in encoded], "the calls of one request")
        if not encoded:
            shape = tuple(0 if d == -1 else d for d in self.served_dims)
            return np.empty((0, *shape), dtype=numpy_dtype(self.dtype))
        return np.stack(encoded)

    def decode_batch(self, array: np.ndarray) -> list[Any]:
        """A tensor ``[batch, *served_dims]`` → one Python value per call."""
        array = np.asarray(array)
        if array.ndim != len(self.served_dims) + 1:
            raise SignatureError(
                f"expected a tensor of rank {len(self.served_dims) + 1} "
                f"([batch, {', '.join(map(str, self.served_dims))}]), got shape {array.shape}"
            )
        if self.kind == "scalar" and not self.ragged:  # every request's input: one pass
            if array.shape[1] != 1:
                raise SignatureError(
                    f"expected one {self.describe()}, got shape {array.shape[1:]}")
            flat = array.reshape(-1)
            if self.pytype == "numpy":
                return list(flat)
            return [_from_wire(value, self.pytype) for value in flat.tolist()]
        return [self.decode_call(element) for element in array]

    def _check_shape(self, shape: tuple[int, ...]) -> None:
        if len(shape) != len(self.dims) or any(
            d != -1 and d != s for d, s in zip(self.dims, shape, strict=True)
        ):
            raise SignatureError(
                f"expected {self.describe()}, got a value of shape {list(shape)}"
            )


# -- declaring and inferring ---------------------------------------------------------------
def Array(dtype: Any, dims: Iterable[int]) -> TensorSpec:  # noqa: N802 - reads like a type
    """Declare a NumPy array column: ``Array(np.uint8, (32, 64))``; ``-1`` marks a varying dim."""
    triton = triton_dtype(dtype)
    pytype = "numpy"
    if triton == "TYPE_STRING":
        pytype = "bytes" if np.dtype(dtype).kind == "S" else "str"
    return TensorSpec(triton, tuple(dims), "array", pytype)


def List(element: type, length: int = -1) -> TensorSpec:  # noqa: N802 - reads like a type
    """Declare a list column: ``List(str, 5)``; ``length=-1`` when it varies."""
    pytype, triton = _scalar_type(element)
    return TensorSpec(triton, (length,), "list", pytype)


def as_spec(declared: Any, column: str = "?") -> TensorSpec:
    """Normalise a declared type: a :class:`TensorSpec`, ``str``/``bytes``/``int``/``float``/
    ``bool``, or a NumPy scalar type (``np.float32``) for a scalar of that dtype."""
    if isinstance(declared, TensorSpec):
        return declared
    try:
        pytype, triton = _scalar_type(declared)
    except SignatureError as error:
        raise SignatureError(f"column {column!r}: {error}") from None
    return TensorSpec(triton, (), "scalar", pytype)


def infer_spec(value: Any, column: str = "?") -> TensorSpec:
    """The spec of an example value, so users need not declare what one call shows."""
    try:
        return _infer(value)
    except SignatureError as error:
        raise SignatureError(f"column {column!r}: {error}") from None


def merge_tensor_specs(first: TensorSpec, second: TensorSpec, column: str = "?") -> TensorSpec:
    """One spec covering two examples: dims that differ become ``-1``."""
    same = (first.kind, first.pytype, first.dtype, first.ragged)
    if same != (second.kind, second.pytype, second.dtype, second.ragged):
        raise SignatureError(
            f"column {column!r} is {first.describe()} in one example and "
            f"{second.describe()} in another"
        )
    if len(first.dims) != len(second.dims):
        raise SignatureError(
            f"column {column!r} has {len(first.dims)} dimensions in one example and "
            f"{len(second.dims)} in another"
        )
    dims = tuple(a if a == b else -1 for a, b in zip(first.dims, second.dims, strict=True))
    return replace(first, dims=dims)


def fits(spec: TensorSpec, value: Any) -> bool:
    """Whether ``value`` can be encoded with ``spec`` (used to check declared types on examples)."""
    try:
        spec.encode_call(value)
    except SignatureError:
        return False
    return True


def _infer(value: Any) -> TensorSpec:
    if isinstance(value, (bool, np.bool_)) and not isinstance(value, np.ndarray):
        if isinstance(value, np.bool_):
            return TensorSpec("TYPE_BOOL", (), "scalar", "numpy")
        return TensorSpec("TYPE_BOOL", (), "scalar", "bool")
    for pytype, (triton, python_type) in _PYTHON_SCALARS.items():
        if type(value) is python_type or (pytype == "str" and isinstance(value, str)):
            return TensorSpec(triton, (), "scalar", pytype)
    if isinstance(value, (bytes, bytearray)):
        return TensorSpec("TYPE_STRING", (), "scalar", "bytes")
    if isinstance(value, np.generic):
        return TensorSpec(triton_dtype(value.dtype), (), "scalar", "numpy")
    if isinstance(value, np.ndarray):
        return Array(value.dtype, value.shape)
    if _is_torch_tensor(value):
        array = value.detach().cpu().numpy()
        return TensorSpec(triton_dtype(array.dtype), array.shape, "tensor", "numpy")
    if isinstance(value, (list, tuple)):
        kind = "list" if isinstance(value, list) else "tuple"
        if not value:
            raise SignatureError(f"an empty {kind} does not show its element type; declare it")
        elements = {_infer(v) for v in value}
        if len(elements) != 1 or next(iter(elements)).kind != "scalar":
            raise SignatureError(
                f"a {kind} must hold scalars of one type to be a tensor, got "
                f"{sorted({e.describe() for e in elements})}; use a NumPy array or declare it"
            )
        element = next(iter(elements))
        return TensorSpec(element.dtype, (len(value),), kind, element.pytype)
    raise SignatureError(
        f"a value of type {type(value).__name__} cannot be a Triton tensor; return str, bytes, "
        "numbers, lists of them or NumPy arrays"
    )


def _scalar_type(declared: Any) -> tuple[str, str]:
    if declared in (str, bytes, int, float, bool):
        pytype = declared.__name__
        return pytype, _PYTHON_SCALARS[pytype][0]
    if isinstance(declared, type) and not issubclass(declared, np.generic):
        raise SignatureError(f"cannot use {declared.__name__} as a column type")
    try:
        dtype = np.dtype(declared)
    except TypeError:
        raise SignatureError(f"cannot use {declared!r} as a column type") from None
    triton = triton_dtype(dtype)
    if triton == "TYPE_STRING":
        return ("bytes" if dtype.kind == "S" else "str"), triton
    return "numpy", triton


def _is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _array_of(value: Any, kind: str) -> np.ndarray:
    if kind == "tensor" and _is_torch_tensor(value):
        return value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value
    raise SignatureError(f"expected a {'torch tensor' if kind == 'tensor' else 'NumPy array'}, "
                         f"got {type(value).__name__}")


_PYTYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "str": lambda v: isinstance(v, str),
    "bytes": lambda v: isinstance(v, (bytes, bytearray)),
    "bool": lambda v: isinstance(v, (bool, np.bool_)),
    "int": lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)),
    "float": lambda v: isinstance(v, (float, np.floating)),
    "numpy": lambda v: isinstance(v, (np.generic, int, float, bool)) and not isinstance(v, str),
}
"""Whether a value is of a spec's ``pytype``: one check per value (outputs are checked as the
served pipeline encodes them, for every row)."""


def _check_pytype(value: Any, pytype: str, spec: TensorSpec) -> None:
    if not _PYTYPE_CHECKS[pytype](value):
        raise SignatureError(f"expected {spec.describe()}, got {type(value).__name__}")


def _to_wire(value: Any, pytype: str) -> Any:
    if pytype == "str":
        try:
            return str(value).encode("utf-8")
        except UnicodeEncodeError as error:
            raise SignatureError(
                f"{str(value)[:40]!r} cannot be sent as UTF-8 text ({error.reason} at "
                f"position {error.start})") from None
    if pytype == "bytes":
        return bytes(value)
    return value


def _from_wire(value: Any, pytype: str) -> Any:
    if pytype == "str":
        try:
            return value.decode("utf-8") if isinstance(value, bytes) else str(value)
        except UnicodeDecodeError as error:
            raise SignatureError(
                f"{value[:40]!r} is not UTF-8 text ({error.reason} at byte {error.start})"
            ) from None
    if pytype == "bytes":
        return value if isinstance(value, bytes) else str(value).encode("utf-8")
    if pytype == "int":
        return int(value)
    if pytype == "float":
        return float(value)
    if pytype == "bool":
        return bool(value)
    return value


def _check_same_shapes(shapes: list[tuple[int, ...]], what: str) -> None:
    if len(set(shapes)) > 1:
        raise SignatureError(
            f"{what} have different shapes {sorted(set(shapes))}; values of different shapes "
            "cannot share one tensor, send them in separate requests"
        )


def describe_specs(specs: Mapping[str, TensorSpec]) -> str:
    """``name: type`` lines, for reports."""
    return "\n".join(f"{name}: {spec.describe()}" for name, spec in specs.items())


WHOLE_ANSWERS = ("list", "join")
"""How a streaming pipeline answered whole (``pipe(x)``, a client's call) gathers each streamed
output's items: their ``list``, or (``join``) texts or bytes joined into one."""


def whole_answer(how: str, items: Sequence[Any]) -> Any:
    """A streamed output's items gathered as :data:`WHOLE_ANSWERS` ``how`` says."""
    if how == "join":
        return (b"" if items and isinstance(items[0], bytes) else "").join(items)
    return list(items)


@dataclass(frozen=True)
class PipelineSignature:
    """The typed, named tensors of a served pipeline: one spec per input and output column."""

    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    streamed: tuple[str, ...] = ()
    """The outputs sent item by item, one response each (a streaming pipeline); each spec is
    one item's."""
    whole: str = "list"
    """How a call answered whole gathers the items of each streamed output
    (:func:`whole_answer`)."""

    def describe(self) -> str:
        return (f"inputs:\n{_indent(describe_specs(self.inputs))}\n"
                f"outputs:\n{_indent(describe_specs(self.outputs))}")


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())
