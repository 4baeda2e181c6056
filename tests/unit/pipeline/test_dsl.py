"""The pipeline DSL: DAG validation, row-stream semantics, batching and per-call failures."""

from __future__ import annotations

import numpy as np
import pytest

from builder import OperatorError, Pipeline, PipelineError, SignatureError, pipe, vectorized
from builder.pipeline.dag import Node
from builder.pipeline.signature import List


def test_map_runs_in_process_with_several_inputs_and_outputs():
    p = (pipe.input("a", "b")
         .map(("a", "b"), ("total", "product"), lambda a, b: (a + b, a * b))
         .map("total", "half", lambda t: t / 2)
         .output("half", "product"))
    assert p(3, 4) == (3.5, 12)


def test_a_column_produced_once_is_read_by_many_operators():
    calls = []

    def tokens(text):
        calls.append(text)
        return text.split()

    p = (pipe.input("text")
         .map("text", "words", tokens)
         .map("words", "count", len)
         .map("words", "first", lambda w: w[0])
         .map(("count", "first"), "summary", lambda c, f: f"{f}+{c - 1}")
         .output("summary", "count"))
    assert p("to be or not") == ("to+3", 4)
    assert calls == ["to be or not"]  # the shared column is computed once


def test_nodes_run_in_dependency_order_not_declaration_order():
    p = (pipe.input("x")
         .map("y", "z", lambda y: y + 1)
         .map("x", "y", lambda x: x * 10)
         .output("z"))
    assert p(2) == 21


def test_flat_map_rows_become_a_list_per_call():
    p = (pipe.input("text")
         .flat_map("text", "word", str.split)
         .map("word", "length", len)
         .output("length"))
    assert p("a bb ccc") == [1, 2, 3]
    assert p("") == []


def test_filter_keeps_rows_and_ancestors_are_broadcast_to_rows():
    p = (pipe.input("text", "prefix")
         .flat_map("text", "word", str.split)
         .filter("word", "long", "word", lambda w: len(w) > 2)
         .map(("prefix", "long"), "tagged", lambda p, w: f"{p}:{w}")
         .map("text", "upper", str.upper)
         .output("upper", "tagged"))
    assert p("a bcd ef ghij", "#") == ("A BCD EF GHIJ", ["#:bcd", "#:ghij"])


def test_filter_on_the_call_itself_gives_zero_or_one_row():
    p = pipe.input("n").filter("n", "kept", lambda n: n > 0).output("kept")
    assert p(5) == [5]
    assert p(-5) == []


def test_filter_on_other_columns_than_it_passes():
    p = (pipe.input("name", "score")
         .filter(("name", "score"), ("good_name", "good_score"), "score", lambda s: s >= 0.5)
         .output("good_name"))
    assert p("a", 0.7) == ["a"]
    assert p("b", 0.1) == []


def test_flat_map_with_several_outputs_and_nested_streams():
    p = (pipe.input("text")
         .flat_map("text", ("index", "line"), lambda t: enumerate(t.splitlines()))
         .flat_map("line", "word", str.split)
         .map(("index", "word"), "where", lambda i, w: f"{i}:{w}")
         .output("where"))
    assert p("a b\nc") == ["0:a", "0:b", "1:c"]


def test_builders_are_immutable_so_a_prefix_grows_several_pipelines():
    base = pipe.input("x").map("x", "y", lambda x: x + 1)
    doubled = base.map("y", "z", lambda y: y * 2).output("z")
    squared = base.map("y", "z", lambda y: y * y).output("z")
    assert (doubled(2), squared(2)) == (6, 9)


def test_batch_runs_calls_together_and_call_batch_sees_all_rows():
    class Scale:
        def __init__(self):
            self.batches = []

        def __call__(self, x):
            return self.call_batch([(x,)])[0]

        def call_batch(self, rows):
            self.batches.append(len(rows))
            return [x * 10 for (x,) in rows]

    scale = Scale()
    p = pipe.input("xs").flat_map("xs", "x", lambda xs: xs).map("x", "y", scale).output("y")
    assert p.batch([[1, 2], [3], []]) == [[10, 20], [30], []]
    assert scale.batches == [3]


def test_one_failing_call_does_not_fail_the_others():
    p = pipe.input("x").map("x", "y", lambda x: 10 // x).output("y")
    results = p.batch([1, 0, 5], return_exceptions=True)
    assert results[0] == 10 and results[2] == 2
    assert isinstance(results[1], OperatorError)
    assert "operator 'lambda' (map x -> y) failed: ZeroDivisionError" in str(results[1])
    assert isinstance(results[1].__cause__, ZeroDivisionError)


def test_a_failing_batched_call_is_retried_row_by_row_to_find_the_culprit():
    seen = []

    class Fragile:
        def __call__(self, x):
            return self.call_batch([(x,)])[0]

        def call_batch(self, rows):
            seen.append([x for (x,) in rows])
            if any(x < 0 for (x,) in rows):
                raise ValueError("negative")
            return [x + 1 for (x,) in rows]

    p = pipe.input("x").map("x", "y", Fragile(), name="fragile").output("y")
    results = p.batch([1, -1, 2], return_exceptions=True)
    assert results[0] == 2 and results[2] == 3
    assert "operator 'fragile'" in str(results[1]) and "negative" in str(results[1])
    assert seen == [[1, -1, 2], [1], [-1], [2]]


def test_in_process_errors_name_the_operator():
    p = pipe.input("x").map("x", "y", int, name="parse").output("y")
    with pytest.raises(OperatorError, match=r"operator 'parse' \(map x -> y\) failed: ValueError"):
        p("abc")
    with pytest.raises(PipelineError, match="takes 1 inputs"):
        p(1, 2)


def test_wrong_number_of_results_is_reported_with_the_columns():
    p = pipe.input("x").map("x", ("a", "b"), lambda x: (x, x, x)).output("a")
    with pytest.raises(OperatorError, match=r"returned 3 values for 2 output columns \(a, b\)"):
        p(1)
    p = pipe.input("x").flat_map("x", "y", lambda x: 5).output("y")
    with pytest.raises(OperatorError, match="returns an iterable of rows, got int"):
        p(1)


# -- validation: one clear error naming the operator and the column -------------------------
def test_unknown_column_is_named_with_its_operator():
    with pytest.raises(PipelineError) as error:
        pipe.input("text").map("txt", "vec", str.upper).output("vec")
    assert str(error.value) == (
        "operator 'str.upper' (map txt -> vec) reads column 'txt', which is neither a "
        "pipeline input (text) nor produced by any operator"
    )


def test_unproduced_output_column():
    with pytest.raises(PipelineError, match="pipeline output 'vec' is neither a pipeline input"):
        pipe.input("text").map("text", "tokens", str.split).output("vec")


def test_duplicate_output_names_both_operators():
    with pytest.raises(PipelineError) as error:
        (pipe.input("text")
         .map("text", "vec", str.upper, name="first")
         .map("text", "vec", str.lower, name="second")
         .output("vec"))
    assert "duplicate output: column 'vec' is produced by operator 'first'" in str(error.value)
    assert "and by operator 'second'" in str(error.value)


def test_duplicate_output_of_an_input_column_and_within_one_operator():
    with pytest.raises(PipelineError, match="produces column 'text', which is a pipeline input"):
        pipe.input("text").map("text", "text", str.upper).output("text")
    with pytest.raises(PipelineError, match="produces column 'a' twice"):
        pipe.input("x").map("x", ("a", "a"), lambda x: (x, x)).output("a")
    with pytest.raises(PipelineError, match="duplicate pipeline output column 'a'"):
        pipe.input("x").map("x", "a", abs).output("a", "a")


def test_cycle_is_reported_with_the_operators_and_columns_on_it():
    with pytest.raises(PipelineError) as error:
        (pipe.input("x")
         .map(("x", "c"), "b", max, name="f")
         .map("b", "c", abs, name="g")
         .output("c"))
    message = str(error.value)
    assert message.startswith("cycle: ")
    assert "operator 'f' (map x, c -> b) needs column 'c' from operator 'g' (map b -> c)" in (
        message)
    assert "operator 'g' (map b -> c) needs column 'b' from operator 'f'" in message


def test_columns_from_unrelated_row_streams_cannot_be_combined():
    with pytest.raises(PipelineError) as error:
        (pipe.input("text")
         .flat_map("text", "word", str.split)
         .flat_map("text", "char", list)
         .map(("word", "char"), "pair", lambda w, c: w + c, name="pair")
         .output("pair"))
    assert "operator 'pair' (map word, char -> pair) reads columns 'word' and 'char'" in str(
        error.value)
    assert "unrelated row streams" in str(error.value)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: pipe.input(), "at least one column"),
        (lambda: pipe.input("a b"), "invalid column name 'a b'"),
        (lambda: pipe.input("x").map("x", "y", 42).output("y"), "is not callable"),
        (lambda: pipe.input("x").filter(("x",), ("a", "b"), "x", bool).output("a"),
         "counts must match"),
        (lambda: pipe.input("x").output("x", schema={"z": int}), "not pipeline output columns"),
        (lambda: pipe.input("x", "x"), "duplicate pipeline input column 'x'"),
    ],
)
def test_malformed_pipelines(build, message):
    with pytest.raises(PipelineError, match=message):
        build()


def test_pipelines_can_be_built_from_nodes_directly():
    nodes = [Node("map", ("a",), ("b",), lambda a: a * 2)]
    assert Pipeline(["a"], nodes, ["b"])(4) == 8


# -- signature ------------------------------------------------------------------------------
def test_signature_is_inferred_from_examples_and_marks_ragged_outputs():
    p = (pipe.input("text", "k")
         .flat_map("text", "word", str.split)
         .map("word", "vec", lambda w: np.full(3, len(w), np.float32))
         .map(("text", "k"), "head", lambda t, k: t[:k])
         .output("head", "vec", "word")
         .with_example("ab cde", 2)
         .with_example("x", 1))
    signature = p.signature()
    assert {c: s.describe() for c, s in signature.inputs.items()} == {"text": "str", "k": "int"}
    assert {c: s.describe() for c, s in signature.outputs.items()} == {
        "head": "str", "vec": "rows of ndarray TYPE_FP32 [3]", "word": "rows of str"}
    assert signature.outputs["vec"].served_dims == (-1, 3)


def test_declared_types_are_checked_against_the_examples():
    p = pipe.input("x", schema={"x": int}).map("x", "y", str).output("y", schema={"y": int})
    with pytest.raises(SignatureError, match="column 'y' is declared int but an example gives '3'"):
        p.with_example(3).signature()


def test_without_examples_every_type_must_be_declared():
    p = pipe.input("x").map("x", "y", str).output("y")
    with pytest.raises(SignatureError, match=r"types of 'x', 'y' are unknown.*with_example"):
        p.signature()
    declared = (pipe.input("x", schema={"x": int})
                .map("x", "y", lambda x: [str(x)] * 2)
                .output("y", schema={"y": List(str, 2)}))
    assert declared.signature().outputs["y"].served_dims == (2,)


def test_an_operator_failing_on_an_example_is_named_with_the_example():
    p = pipe.input("x").map("x", "y", lambda x: 1 / x, name="invert").output("y").with_example(0)
    with pytest.raises(OperatorError, match=r"operator 'invert' .* ZeroDivisionError.*"
                                           r"on example 1: \(0,\)"):
        p.signature()


def test_an_output_with_no_rows_in_any_example_needs_a_declared_type():
    p = pipe.input("x").filter("x", "y", bool).output("y").with_example(0)
    with pytest.raises(SignatureError, match="column 'y' has no rows in any example"):
        p.signature()
    declared = pipe.input("x").filter("x", "y", bool).output("y", schema={"y": int})
    assert declared.with_example(0).signature().outputs["y"].ragged


def test_a_generator_failing_midway_fails_only_its_call():
    def words(text):
        for word in text.split():
            if word == "bad":
                raise ValueError("bad word")
            yield word

    p = pipe.input("text").flat_map("text", "word", words).output("word")
    results = p.batch(["a b", "a bad c", "d"], return_exceptions=True)
    assert results[0] == ["a", "b"] and results[2] == ["d"]
    assert str(results[1]) == ("operator 'test_a_generator_failing_midway_fails_only_its_call."
                               "<locals>.words' (flat_map text -> word) failed: ValueError: "
                               "bad word")


def test_filters_must_return_a_truth_value():
    p = pipe.input("x").filter("x", "y", lambda x: np.array([True, False])).output("y")
    with pytest.raises(OperatorError, match="a filter operator returns true or false, got "
                                            "ndarray"):
        p(1)


def test_call_batch_must_return_one_result_per_row():
    class Short:
        def __call__(self, x):
            return x

        def call_batch(self, rows):
            return [1]

    p = pipe.input("x").map("x", "y", Short()).output("y")
    results = p.batch([1, 2], return_exceptions=True)
    assert [str(r) for r in results] == [
        "operator 'Short' (map x -> y): call_batch returned 1 results for 2 rows"] * 2


def test_a_vectorized_operator_gets_the_rows_of_a_batch_stacked_by_shape():
    seen = []

    @vectorized
    def norm_and_size(v):
        seen.append(v.shape)
        return np.linalg.norm(v, axis=1), np.full(len(v), v.shape[1])

    p = pipe.input("v").map("v", ("n", "size"), norm_and_size).output("n", "size")
    vectors = [np.ones(4), np.ones(2), np.zeros(4), 2 * np.ones(4)]
    assert p.batch(vectors) == [(2.0, 4), (np.sqrt(2), 2), (0.0, 4), (4.0, 4)]
    assert seen == [(3, 4), (1, 2)]  # one call per shape, rows in order within it
    seen.clear()
    assert p(np.ones(9)) == (3.0, 9) and seen == [(1, 9)]  # in process: a batch of one
    assert repr(norm_and_size) == "vectorized(test_a_vectorized_operator_gets_the_rows_" \
        "of_a_batch_stacked_by_shape.<locals>.norm_and_size)"


def test_a_vectorized_operator_that_drops_the_batch_axis_is_named():
    summed = vectorized(lambda v: v.sum())
    p = pipe.input("v").map("v", "s", summed, name="summed").output("s")
    results = p.batch([np.ones(2), np.ones(2)], return_exceptions=True)
    assert all("vectorized operator 'lambda' returned shape [] for a batch of 1" in str(r)
               for r in results)  # the batch failed, then each row failed on its own
    with pytest.raises(PipelineError, match="needs a function"):
        vectorized(3)
