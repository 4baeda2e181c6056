"""Whether a served pipeline result is the in-process one: the contract every check enforces.

Exact for strings, bytes, ints and bools; floats (Python's and NumPy's scalars, float arrays)
within a tolerance (served models run in onnxruntime, the in-process ones in torch); the same
structure and Python types throughout.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from builder.errors import TritonBuilderError

TOLERANCE = 1e-4
"""How far a served number may be from the in-process one (absolute and relative): the
server's batches and its ONNX Runtime may round otherwise than ``pipe(...)``."""


class ResultMismatch(TritonBuilderError, AssertionError):
    """A served result differs from the in-process one; the message says where."""


def check_same(served: Any, reference: Any, tolerance: float = TOLERANCE,
               where: str = "result") -> None:
    """Raise :class:`ResultMismatch` unless ``served`` equals ``reference`` (see module doc)."""
    if isinstance(reference, (list, tuple)):
        _expect(type(served) is type(reference), where, served, reference)
        _expect(len(served) == len(reference), where, served, reference)
        for i, (a, b) in enumerate(zip(served, reference)):
            check_same(a, b, tolerance, f"{where}[{i}]")
    elif isinstance(reference, np.ndarray):
        _expect(isinstance(served, np.ndarray) and served.shape == reference.shape
                and served.dtype == reference.dtype, where, served, reference)
        if reference.dtype.kind in "fc":
            same = np.allclose(served, reference, rtol=tolerance, atol=tolerance)
        else:
            same = np.array_equal(served, reference)
        _expect(same, where, served, reference)
    elif isinstance(reference, (float, np.floating)):  # NumPy's float scalars too
        _expect(type(served) is type(reference)
                and abs(served - reference) <= tolerance * max(1.0, abs(reference)),
                where, served, reference)
    else:
        _expect(type(served) is type(reference) and served == reference, where, served,
                reference)


def _expect(condition: bool, where: str, served: Any, reference: Any) -> None:
    if not condition:
        raise ResultMismatch(f"{where}: served {_show(served)}, in process {_show(reference)}")


def _show(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)} {np.array2string(value, threshold=8)}"
    text = repr(value)
    return f"{type(value).__name__} {text[:120]}{'…' if len(text) > 120 else ''}"
