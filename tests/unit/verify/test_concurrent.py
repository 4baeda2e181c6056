"""The calls verification sends together: the pipeline's, and perturbed copies it answers."""

from __future__ import annotations

import numpy as np

from builder import pipe
from builder.verify.concurrent import COPIES, distinct_calls


def test_perturbed_copies_are_distinct_and_carry_their_in_process_answers():
    pipeline = (pipe.input("text", "x").map(("text", "x"), "y", lambda t, x: len(t) * x)
                .output("y").with_example("hello", np.ones(3, np.float32)))
    calls = [("hello", np.arange(3, dtype=np.float32))]
    pairs = distinct_calls(pipeline, calls, [pipeline(*calls[0])])
    assert len(pairs) == 1 + COPIES
    texts = [call[0] for call, _ in pairs]
    assert texts == ["hello", "elloh", "llohe", "lohel"]
    for call, answer in pairs:
        np.testing.assert_array_equal(answer, pipeline(*call))


def test_copies_the_pipeline_refuses_or_that_repeat_a_call_are_left_out():
    def only_small(x):
        if x > 5:
            raise ValueError("too large")
        return x * 2

    pipeline = pipe.input("x").map("x", "y", only_small).output("y").with_example(2.0)
    pairs = distinct_calls(pipeline, [(2.0,), (4.0,)], [4.0, 8.0])
    # 2.0 scaled by 1.5, 2, 2.5: 3.0, 4.0 (a call already), 5.0; 4.0's copies are refused
    assert [call for call, _ in pairs] == [(2.0,), (4.0,), (3.0,), (5.0,)]
    assert [answer for _, answer in pairs] == [4.0, 8.0, 6.0, 10.0]
