"""Operators whose rows depend on each other are refused before anything is written; the
opt-outs serve them one row at a time (issue 38).

Each row-mixing pipeline here was built and verified before this check existed, and then served
answers that depended on other users' requests (84 of 96 wrong under 16 clients for the batch
mean): ``build_pipeline_model`` wrote them without a word.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from builder import ModelOp, build_pipeline_model, pipe, vectorized
from builder.errors import ExportError, RowDependenceError
from builder.pipeline.row_independence import check_model, check_row_independence, perturb
from builder.repository.model_config import read_config
from builder.runtime.model_batching import BatchingRunner
from tests.support.tiny_models import Centered

ROW = np.arange(1, 5, dtype=np.float32)


class PerRow(Centered):
    def forward(self, x):
        h = self.linear(x)
        return h - h.mean(1, keepdim=True)


@vectorized
def by_batch_max(v):
    return v / v.max()


@vectorized(batch=False)
def by_batch_max_one_row_at_a_time(v):
    return v / v.max()


@vectorized
def by_row_max(v):
    return v / v.max(axis=1, keepdims=True)


class RankAgainstBatch:
    """A ``call_batch`` that ranks each row among the rows of its batch."""

    def __call__(self, v):
        return self.call_batch([(v,)])[0]

    def call_batch(self, rows):
        totals = [float(np.sum(v)) for (v,) in rows]
        return [int(sum(t < total for t in totals)) for total in totals]


def _single(op, row=ROW):
    return pipe.input("x").map("x", "y", op).output("y").with_example(row)


def test_a_model_with_a_batch_mean_is_refused_naming_it_before_anything_is_written(tmp_path):
    op = ModelOp(Centered(), example_inputs=ROW, name="centered")
    with pytest.raises(RowDependenceError, match=(
            r"model operator 'centered': output 'output_0' of a row depends on the other rows "
            r"of its batch: with 4 distinct rows in one batch, rows 0, 1, 2, 3 differ .*"
            r"op_config=\{\"max_batch_size\": 0\}")):
        build_pipeline_model(_single(op), tmp_path / "models")
    assert not (tmp_path / "models").exists()
    assert list(tmp_path.iterdir()) == []


def test_the_opt_out_serves_the_model_one_row_at_a_time(tmp_path):
    op = ModelOp(Centered(), example_inputs=ROW, name="centered",
                 op_config={"max_batch_size": 0})
    build_pipeline_model(_single(op), tmp_path / "models")
    config = read_config(tmp_path / "models" / "centered")
    assert config.max_batch_size == 0
    assert not config.HasField("dynamic_batching")
    assert [list(t.dims) for t in config.input] == [[-1, 4]]
    assert [list(t.dims) for t in config.output] == [[-1, 3]]


def test_a_model_whose_rows_are_independent_passes():
    check_model(ModelOp(PerRow(), example_inputs=ROW, name="per_row"))


def test_a_vectorized_batch_maximum_is_refused_and_batch_false_builds(tmp_path):
    with pytest.raises(RowDependenceError, match=(
            r"vectorized operator 'by_batch_max' \(map x -> y\): a row's result depends on the "
            r"other rows of its batch: .*@vectorized\(batch=False\)")):
        check_row_independence(_single(by_batch_max))
    check_row_independence(_single(by_row_max))
    opted_out = _single(by_batch_max_one_row_at_a_time)
    build_pipeline_model(opted_out, tmp_path / "models")
    rows = [(ROW,), (ROW * 3,)]
    assert [list(r) for r in by_batch_max_one_row_at_a_time.call_batch(rows)] == [
        list(ROW / 4), list(ROW / 4)]


def test_a_call_batch_that_compares_rows_is_refused_naming_the_fix():
    with pytest.raises(RowDependenceError, match=(
            r"operator 'RankAgainstBatch' \(map x -> y\): .*drop call_batch")):
        check_row_independence(_single(RankAgainstBatch()))


class CountingBatches:
    """Sums each row, and notes how many rows each ``call_batch`` got."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def __call__(self, v):
        return self.call_batch([(v,)])[0]

    def call_batch(self, rows):
        self.batches.append(len(rows))
        return [float(np.sum(v)) for (v,) in rows]


def test_each_row_runs_alone_once_and_the_first_once_more_to_see_answers_repeat():
    """The first row's first run alone is also its answer alone: it ran three times, a whole
    stream each for a streaming operator (nine runs of a 2.4 s stream made one build 22 s)."""
    op = CountingBatches()
    check_row_independence(_single(op))
    assert op.batches == [1, 4, 1, 1, 1, 1, 1], "the examples, the batch, row 0 twice, rows 1-3"


def test_a_module_that_varies_by_itself_is_left_to_the_export_check(tmp_path):
    class Noisy(torch.nn.Module):
        def forward(self, x):
            return x + torch.rand_like(x)

    with pytest.raises(ExportError, match="differs from torch"):
        build_pipeline_model(_single(ModelOp(Noisy(), example_inputs=ROW, name="noisy")),
                             tmp_path / "models")


def test_clip_logits_per_image_is_refused_and_its_embeddings_are_not():
    """CLIP as Hugging Face's docs show it: ``logits_per_image`` compares every image with every
    text of the batch."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.CLIPConfig(
        text_config=dict(vocab_size=99, hidden_size=32, intermediate_size=37,
                         num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=16,
                         bos_token_id=0, eos_token_id=2, pad_token_id=1),
        vision_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                           num_attention_heads=2, image_size=32, patch_size=8),
        projection_dim=16)
    clip = transformers.CLIPModel(config)
    examples = (np.arange(3, 10, dtype=np.int64), np.random.default_rng(0).random(
        (3, 32, 32), dtype=np.float32))
    op = ModelOp(clip, example_inputs=examples, name="clip")
    assert op.output_names[:4] == ("logits_per_image", "logits_per_text", "text_embeds",
                                   "image_embeds")
    with pytest.raises(RowDependenceError, match=(
            r"'clip': output 'logits_per_image' of a row depends on the other rows of its "
            r"batch: .*shape \[4\] against \[1\]")):
        check_model(op)
    check_model(ModelOp(clip, example_inputs=examples, name="clip_embeds",
                        output_names=["text_embeds", "image_embeds"]))


def test_a_model_called_one_row_at_a_time_gets_each_row_alone():
    calls = []

    class Target:
        model_name, max_batch_size, input_names, output_names = "m", 0, ("x",), ("y",)

    class Op:
        name, served = "m", Target()

    def call(target, inputs):
        calls.append(inputs["x"].shape)
        return [inputs["x"] * 2]

    rows = [(np.ones((1, 4), np.float32),), (np.ones((1, 4), np.float32),)]
    results = BatchingRunner(call).infer(Op(), rows)
    assert calls == [(1, 4), (1, 4)]
    assert [r[0].tolist() for r in results] == [[[2.0] * 4]] * 2


def test_perturbed_values_keep_their_type_shape_and_vocabulary():
    ids = np.array([5, 6, 7, 8], dtype=np.int64)
    moved = perturb(ids, 1)
    assert moved.dtype == ids.dtype and sorted(moved) == sorted(ids)
    assert perturb("hello", 1) == "elloh"
    floats = perturb(ROW, 2)
    assert floats.dtype == np.float32 and np.isclose(floats.max(), ROW.max() * 2)
    assert perturb(b"\x89PNG", 1) == b"\x89PNG"
    assert isinstance(perturb(torch.ones(3), 1), torch.Tensor)
