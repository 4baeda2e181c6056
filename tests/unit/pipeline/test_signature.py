"""Typed signatures: dtype mapping, inference, declared types, and value <-> tensor round trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from builder.errors import SignatureError
from builder.pipeline.signature import (
    Array,
    List,
    TensorSpec,
    as_spec,
    infer_spec,
    merge_tensor_specs,
    numpy_dtype,
    triton_dtype,
)


@pytest.mark.parametrize(
    ("dtype", "triton"),
    [(np.float32, "TYPE_FP32"), (np.float64, "TYPE_FP64"), (np.float16, "TYPE_FP16"),
     (np.int64, "TYPE_INT64"), (np.int8, "TYPE_INT8"), (np.uint8, "TYPE_UINT8"),
     (np.bool_, "TYPE_BOOL"), (np.object_, "TYPE_STRING"), ("<U3", "TYPE_STRING"),
     ("S4", "TYPE_STRING")],
)
def test_numpy_and_triton_dtypes_map_both_ways(dtype, triton):
    assert triton_dtype(dtype) == triton
    if triton != "TYPE_STRING":
        assert numpy_dtype(triton) == np.dtype(dtype)


def test_unmappable_dtypes_are_refused():
    with pytest.raises(SignatureError, match="complex64"):
        triton_dtype(np.complex64)
    with pytest.raises(SignatureError, match="TYPE_BYTES"):
        numpy_dtype("TYPE_BYTES")


@pytest.mark.parametrize(
    ("value", "dtype", "dims", "kind", "pytype"),
    [
        ("hello", "TYPE_STRING", (), "scalar", "str"),
        (b"\x00\xff", "TYPE_STRING", (), "scalar", "bytes"),
        (3, "TYPE_INT64", (), "scalar", "int"),
        (2.5, "TYPE_FP64", (), "scalar", "float"),
        (True, "TYPE_BOOL", (), "scalar", "bool"),
        (np.float32(1.5), "TYPE_FP32", (), "scalar", "numpy"),
        (np.zeros((2, 3), np.float32), "TYPE_FP32", (2, 3), "array", "numpy"),
        (np.array(["a", "bc"]), "TYPE_STRING", (2,), "array", "str"),
        (["x", "y", "z"], "TYPE_STRING", (3,), "list", "str"),
        ((1, 2), "TYPE_INT64", (2,), "tuple", "int"),
        (torch.ones(4, dtype=torch.int32), "TYPE_INT32", (4,), "tensor", "numpy"),
    ],
)
def test_types_are_inferred_from_example_values(value, dtype, dims, kind, pytype):
    spec = infer_spec(value)
    assert (spec.dtype, spec.dims, spec.kind, spec.pytype) == (dtype, dims, kind, pytype)


@pytest.mark.parametrize(
    "value",
    ["héllo ✓", b"\x00bytes\x00", 7, -1.25, False, np.int16(-3), np.arange(6).reshape(2, 3),
     np.array([["a", "é"], ["", "z"]]), ["α", "b"], (True, False), torch.arange(3.0)],
)
def test_values_survive_the_tensor_round_trip(value):
    spec = infer_spec(value)
    batch = spec.encode_batch([value, value])
    assert batch.shape == (2, *spec.served_dims)
    assert batch.dtype == numpy_dtype(spec.dtype)
    decoded = spec.decode_batch(batch)
    for got in decoded:
        assert type(got) is type(value)
        if isinstance(value, (np.ndarray, torch.Tensor)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(value))
        else:
            assert got == value


def test_scalars_are_served_as_dims_one_and_ragged_columns_with_a_varying_first_dim():
    assert infer_spec("a").served_dims == (1,)
    ragged = TensorSpec("TYPE_STRING", (), "scalar", "str", ragged=True)
    assert ragged.served_dims == (-1,)
    encoded = ragged.encode_batch([["a", "b"]])
    assert encoded.shape == (1, 2)
    assert ragged.decode_batch(encoded) == [["a", "b"]]
    assert ragged.encode_call([]).shape == (0,)


def test_calls_of_different_shapes_cannot_share_a_request_tensor():
    ragged = TensorSpec("TYPE_INT64", (), "scalar", "int", ragged=True)
    with pytest.raises(SignatureError, match="separate requests"):
        ragged.encode_batch([[1, 2], [3]])


def test_declared_types():
    assert as_spec(str) == TensorSpec("TYPE_STRING", (), "scalar", "str")
    assert as_spec(np.float32) == TensorSpec("TYPE_FP32", (), "scalar", "numpy")
    assert Array(np.uint8, (32, -1)).dims == (32, -1)
    assert List(str, 5) == TensorSpec("TYPE_STRING", (5,), "list", "str")
    with pytest.raises(SignatureError, match="column 'x'.*dict"):
        as_spec(dict, "x")


def test_encoding_checks_values_against_the_spec():
    spec = Array(np.float32, (3,))
    with pytest.raises(SignatureError, match=r"shape \[4\]"):
        spec.encode_value(np.zeros(4, np.float32))
    with pytest.raises(SignatureError, match="got str"):
        infer_spec(1).encode_value("1")
    with pytest.raises(SignatureError, match="dtype float64"):
        Array(np.int32, (2,)).encode_value(np.zeros(2))


def test_examples_that_differ_in_size_make_a_varying_dim():
    merged = merge_tensor_specs(infer_spec(np.zeros((2, 3))), infer_spec(np.zeros((2, 5))), "x")
    assert merged.dims == (2, -1)
    with pytest.raises(SignatureError, match="column 'x' is str in one example and int"):
        merge_tensor_specs(infer_spec("a"), infer_spec(1), "x")


@pytest.mark.parametrize(
    ("value", "message"),
    [({"a": 1}, "type dict cannot be a Triton tensor"),
     ([], "empty list"),
     ([1, "a"], "scalars of one type"),
     (None, "NoneType")],
)
def test_uninferable_values_are_explained(value, message):
    with pytest.raises(SignatureError, match=message) as error:
        infer_spec(value, "col")
    assert "column 'col'" in str(error.value)


def test_text_that_is_not_utf8_is_refused_naming_the_problem():
    from builder.pipeline.signature import TensorSpec

    spec = TensorSpec("TYPE_STRING", (), "scalar", "str")
    with pytest.raises(SignatureError, match="cannot be sent as UTF-8 text"):
        spec.encode_batch(["lone \ud800"])
    with pytest.raises(SignatureError, match="is not UTF-8 text .* at byte 3"):
        spec.decode_batch(np.array([[b"caf\xe9"]], dtype=object))
