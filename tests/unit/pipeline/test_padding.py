"""Rows of different lengths padded to the batch's longest, in one model call (issue 38).

Before, a served batch of texts of different token lengths made one model call per length; and
nothing checked that padding would not change a row's answer.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from builder import ModelOp
from builder.errors import PipelineError, RowDependenceError
from builder.pipeline.row_independence import check_model
from builder.runtime.model_batching import BatchingRunner

transformers = pytest.importorskip("transformers")

PER_TEXT = {"input_ids": [0], "attention_mask": [0], "last_hidden_state": [0]}
PADS = {"input_ids": 0, "attention_mask": 0}


def bert():
    torch.manual_seed(0)
    return transformers.BertModel(transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=37, max_position_embeddings=32))


def text(length: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    ids = np.random.default_rng(seed).integers(5, 50, length).astype(np.int64)
    return ids, np.ones(length, dtype=np.int64)


class Served:
    """What BLS would answer: the module run on the merged batch, each call recorded."""

    def __init__(self, op: ModelOp) -> None:
        self.op, self.shapes = op, []

    def __call__(self, target, inputs):
        self.shapes.append(tuple(inputs["input_ids"].shape))
        with torch.no_grad():
            result = self.op.module(*(torch.from_numpy(inputs[n]) for n in self.op.input_names))
        return [result[name].numpy() for name in self.op.output_names]


def served_op(**options) -> ModelOp:
    from builder.pipeline.operators import BlsTarget

    op = ModelOp(bert(), example_inputs=text(6), name="bert", dynamic_axes=PER_TEXT, **options)
    op.served = BlsTarget("bert", "onnx", op.input_names, op.output_names, 64)
    return op


def test_rows_of_similar_lengths_share_one_call_and_answer_as_alone():
    op = served_op(pad_values=PADS)
    check_model(op)  # the build's check: padded rows answer as alone
    rows = [op.prepare(*text(n, seed=n)) for n in (6, 7, 3, 7, 6)]
    served = Served(op)
    answers = BatchingRunner(served).infer(op, rows)
    # rows within a quarter of the longest share its call, padded to it; the short one not
    assert served.shapes == [(4, 7), (1, 3)]
    for row, answer in zip(rows, answers):
        with torch.no_grad():
            alone = op.module(*(torch.from_numpy(a) for a in row))
        assert answer[0].shape == alone.last_hidden_state.shape
        np.testing.assert_allclose(answer[0], alone.last_hidden_state.numpy(), atol=1e-5)
        np.testing.assert_allclose(answer[1], alone.pooler_output.numpy(), atol=1e-5)


def test_without_pad_values_each_length_is_its_own_call():
    op = served_op()
    served = Served(op)
    BatchingRunner(served).infer(op, [op.prepare(*text(n)) for n in (3, 7, 3)])
    assert sorted(served.shapes) == [(1, 7), (2, 3)]


def test_padding_that_reaches_the_answers_is_refused_naming_the_operator():
    class Summed(torch.nn.Module):
        """Sums every token, padding included: no mask hides it."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(50, 4)

        def forward(self, input_ids, attention_mask):
            return (self.embed(input_ids) + attention_mask[..., None]).sum(1)

    op = ModelOp(Summed(), example_inputs=text(6), name="summed",
                 dynamic_axes={"input_ids": [0], "attention_mask": [0]},
                 pad_values={"input_ids": 1, "attention_mask": 0})
    with pytest.raises(RowDependenceError, match=(
            r"'summed': padded to the batch's longest, a row answers otherwise than alone: "
            r"output 'output_0' of row 1 .* drop pad_values")):
        check_model(op)


@pytest.mark.parametrize(("pads", "message"), [
    ({"input_ids": 0}, r"give one for each of \['input_ids', 'attention_mask'\]; "
                       r"missing \['attention_mask'\]"),
    ({"ids": 0, "input_ids": 0, "attention_mask": 0}, r"names \['ids'\], which are not inputs"),
    ({"input_ids": "0", "attention_mask": 0}, r"pad_values\['input_ids'\] must be a number"),
])
def test_pad_values_are_checked_when_the_operator_is_made(pads, message):
    with pytest.raises(PipelineError, match=message):
        ModelOp(bert(), example_inputs=text(6), name="bert", dynamic_axes=PER_TEXT,
                pad_values=pads)


def test_an_axis_a_row_does_not_have_is_named_with_how_axes_are_counted():
    """Before: accepted here, then "is [9] in this row, but example_inputs give one row as [4]"
    once the pipeline ran."""
    with pytest.raises(PipelineError, match=(
            r"'bert': dynamic_axes\['input_ids'\] names axis 1, but 'input_ids' has 1 axis "
            r"\(shape \[6\]\): axes are counted from 0 in one row as the pipeline passes it")):
        ModelOp(bert(), example_inputs=text(6), name="bert",
                dynamic_axes={"input_ids": [1], "attention_mask": [0]})
    with pytest.raises(PipelineError, match=r"unknown tensors \['ids'\]; the inputs and outputs "
                                            r"are \['input_ids', 'attention_mask', "
                                            r"'last_hidden_state', 'pooler_output'\]"):
        ModelOp(bert(), example_inputs=text(6), name="bert", dynamic_axes={"ids": [0]})
