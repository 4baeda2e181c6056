"""Operators that refuse their input: the caller's mistake, told apart from the operator's
failures, in process exactly as served."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

from builder import (
    InputError,
    OperatorError,
    PipelineError,
    RejectedInputError,
    pipe,
    rejects,
    vectorized,
)
from builder.pipeline.serialization import dumps


class NotAnImage(Exception):
    pass


@rejects(NotAnImage, ValueError)
def decode(data):
    if data == b"bug":
        raise ZeroDivisionError("a bug in the decoder")
    if not data.startswith(b"IMG"):
        raise NotAnImage(f"cannot identify image file {io.BytesIO(data)!r}")
    return int(data[3:])


def check(n):
    if n < 0:
        raise InputError(f"{n} is negative")
    return n * 2


PIPELINE = (pipe.input("image").map("image", "n", decode).map("n", "doubled", check)
            .output("doubled").with_example(b"IMG3"))


def test_a_declared_exception_is_the_callers_mistake_naming_operator_and_column():
    with pytest.raises(RejectedInputError) as raised:
        PIPELINE(b"GIF89a")
    error = raised.value
    assert isinstance(error, InputError) and isinstance(error, OperatorError)
    assert isinstance(error.__cause__, NotAnImage)  # the original, for whoever wants it
    assert error.operator == "'decode' (map image -> n)" and error.columns == ("image",)
    assert str(error) == ("operator 'decode' (map image -> n) rejected its input 'image': "
                          "cannot identify image file <_io.BytesIO> (NotAnImage)")
    assert "0x" not in str(error)  # an object's address tells a client nothing


def test_input_error_raised_by_an_operator_is_a_rejection_too():
    with pytest.raises(RejectedInputError, match=r"^operator 'check' \(map n -> doubled\) "
                                                 r"rejected its input 'n': -1 is negative$"):
        PIPELINE(b"IMG-1")


def test_any_other_exception_stays_a_failure_of_the_operator():
    with pytest.raises(OperatorError) as raised:
        PIPELINE(b"bug")
    assert not isinstance(raised.value, InputError)
    assert str(raised.value) == ("operator 'decode' (map image -> n) failed: "
                                 "ZeroDivisionError: a bug in the decoder")


def test_a_rejected_call_fails_alone_in_a_batch():
    results = PIPELINE.batch([b"IMG1", b"nope", b"IMG2", b"IMG-5"], return_exceptions=True)
    assert results[0] == 2 and results[2] == 4
    assert all(isinstance(r, RejectedInputError) for r in (results[1], results[3]))


def test_rejections_of_batched_operators():
    """``@rejects`` on a vectorized function and on an operator class with ``call_batch``: a
    batch that fails is re-run row by row, and only the bad row is refused."""
    @rejects(ValueError)
    @vectorized
    def root(x):
        if (x < 0).any():
            raise ValueError("negative")
        return np.sqrt(x)

    @rejects(KeyError)
    class Lookup:
        table = {"a": 1.0, "b": 4.0}

        def __call__(self, key):
            return self.call_batch([(key,)])[0]

        def call_batch(self, rows):
            return [np.float64(self.table[key]) for (key,) in rows]

    pipeline = (pipe.input("key").map("key", "x", Lookup()).map("x", "y", root).output("y")
                .with_example("a"))
    results = pipeline.batch(["a", "zzz", "b"], return_exceptions=True)
    assert results[0] == 1.0 and results[2] == 2.0
    assert isinstance(results[1], RejectedInputError) and "'zzz'" in str(results[1])


def test_the_declaration_travels_with_the_pickled_pipeline():
    """Served, the pipeline is the pickled one: its operators must still know what they
    reject (``decode`` here is pickled by value, as user code is)."""
    payload, _ = dumps(PIPELINE)
    loaded = pickle.loads(payload)
    with pytest.raises(RejectedInputError):
        loaded(b"GIF89a")


@pytest.mark.parametrize("bad", [(), ("ValueError",), (int,), (BaseException,)])
def test_rejects_takes_exception_classes_only(bad):
    with pytest.raises(PipelineError, match="rejects takes exception classes"):
        rejects(*bad)


def test_rejects_decorates_operators_only():
    with pytest.raises(PipelineError, match="rejects decorates an operator"):
        rejects(ValueError)(42)
