"""What "served equal to in process" means: exact for text and integers, floats within a
tolerance, Python and NumPy types kept."""

from __future__ import annotations

import numpy as np
import pytest

from builder.verify.equality import ResultMismatch, check_same


def test_numpy_float_scalars_are_compared_within_the_tolerance():
    """A model operator's per-row scalar reaches the pipeline as a NumPy float: onnxruntime's
    may differ from torch's in the last bits, as an array's elements may."""
    check_same(np.float32(0.1234567), np.float32(0.1234568))
    with pytest.raises(ResultMismatch, match="result: served float64"):
        check_same(np.float64(0.5), np.float32(0.5))
    with pytest.raises(ResultMismatch):
        check_same(np.float32(0.5), np.float32(0.6))


def test_structure_types_and_exact_values():
    check_same(("a", 1, [1.0, 2.0]), ("a", 1, [1.0, 2.0 + 1e-7]))
    check_same(np.array([1, 2]), np.array([1, 2]))
    for served, reference in (("a", "b"), (1, 2), ([1.0], (1.0,)), (np.int64(1), 1),
                              (np.array([1.0], np.float64), np.array([1.0], np.float32))):
        with pytest.raises(ResultMismatch):
            check_same(served, reference)
