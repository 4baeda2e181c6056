"""The batch-axis rule of model operators: examples describe one row, the builder adds the axis.

Issue 33's first pipeline (the README's "Your first image") gave the module the 8 tokens of one
text as a batch of 8 and wrote configs without ``dims``; a feature vector per row failed in
PyTorch's words; a batched example without ``pre=`` was refused, but in words rich swallowed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tritonclient.grpc import model_config_pb2 as mc

from builder import ModelOp, PipelineError, build_pipeline_model, pipe
from builder.repository.model_config import read_config
from tests.support.readme import load_first_image


@pytest.fixture
def first(tmp_path):
    """The README's first pipeline, imported from the file a reader would write."""
    return load_first_image(tmp_path)


def _reference(module, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return module(torch.from_numpy(ids[None]), torch.from_numpy(mask[None]))[0].numpy()


@pytest.mark.parametrize("examples", ["numpy", "torch"])
def test_the_readme_pipeline_embeds_one_text_as_one_row(first, examples):
    encoder = first.encoder
    if examples == "torch":
        ids, mask = first.tokenize("hello")
        encoder = ModelOp(first.Encoder().eval(),
                          example_inputs=(torch.from_numpy(ids), torch.from_numpy(mask)))
    pipeline = (pipe.input("text").map("text", ("ids", "mask"), first.tokenize)
                .map(("ids", "mask"), "vec", encoder).output("vec").with_example("hello world"))
    vec = pipeline("hello world")
    assert vec.shape == (16,) and vec.dtype == np.float32
    np.testing.assert_allclose(vec, _reference(encoder.module, *first.tokenize("hello world")),
                               rtol=1e-6)
    assert pipeline.signature().describe() == (
        "inputs:\n  text: str\noutputs:\n  vec: ndarray TYPE_FP32 [16]")


def test_the_readme_pipeline_writes_the_rows_dims(first, tmp_path):
    build_pipeline_model(first.pipeline, tmp_path / "models")
    config = read_config(tmp_path / "models" / "encoder")
    assert [(t.name, list(t.dims)) for t in config.input] == [("ids", [8]), ("mask", [8])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("output_0", [16])]
    assert not any(t.HasField("reshape") for t in (*config.input, *config.output))


def test_a_batched_example_without_pre_is_refused_naming_the_shapes_and_the_fix(first, tmp_path):
    ids, mask = first.tokenize("hello")
    batched = ModelOp(first.Encoder().eval(), example_inputs=(ids[None], mask[None]))
    pipeline = (pipe.input("text").map("text", ("ids", "mask"), first.tokenize)
                .map(("ids", "mask"), "vec", batched).output("vec").with_example("hello world"))
    with pytest.raises(PipelineError) as error:
        build_pipeline_model(pipeline, tmp_path / "models")
    message = str(error.value)
    assert "model operator 'encoder': input 'ids' is [8] in this row, but example_inputs " \
           "give one row as [1, 8]" in message
    assert "example_inputs seem to hold a batch axis" in message and "pre=" in message
    assert not (tmp_path / "models").exists()


def features(x: float) -> torch.Tensor:
    return torch.tensor([x, 2 * x, 3 * x])


def test_one_feature_vector_per_row_into_a_linear_layer(tmp_path):
    torch.manual_seed(0)
    linear = torch.nn.Linear(3, 8).eval()
    pipeline = (pipe.input("x").map("x", "f", features)
                .map("f", "y", ModelOp(linear, example_inputs=features(0.5)))
                .output("y").with_example(0.25))
    y = pipeline(0.25)
    with torch.no_grad():
        np.testing.assert_allclose(y, linear(features(0.25)[None])[0].numpy(), rtol=1e-6)
    build_pipeline_model(pipeline, tmp_path / "models")
    config = read_config(tmp_path / "models" / "linear")
    assert [list(t.dims) for t in (*config.input, *config.output)] == [[3], [8]]


def test_a_module_that_cannot_take_one_row_is_refused_naming_shapes_and_fix():
    with pytest.raises(PipelineError) as error:
        ModelOp(torch.nn.Linear(4, 8), example_inputs=features(0.5), name="scorer")
    message = str(error.value)
    assert message.startswith("model operator 'scorer': the module fails on one row of "
                              "example_inputs with the batch axis the builder adds "
                              "(input [1, 3] float32)")
    assert "mat1 and mat2 shapes cannot be multiplied" in message
    assert "give pre= (and post=)" in message and "\n" not in message


class Total(torch.nn.Module):
    def forward(self, x):
        return x.sum()


def test_a_module_that_drops_the_batch_axis_is_refused():
    with pytest.raises(PipelineError, match=r"'total': on a batch of 1 \(inputs x \[1, 3\] "
                                            r"float32\) the module returns output 0 of shape "
                                            r"\[\] \(a scalar\)"):
        ModelOp(Total(), example_inputs=features(0.5))


class Halves(torch.nn.Module):
    def forward(self, x):
        return x / 2, (x > 0).to(torch.int64)


def test_per_row_scalars_are_served_with_triton_reshape(tmp_path):
    op = ModelOp(Halves(), example_inputs=np.float32(0.5), output_names=["half", "positive"])
    pipeline = (pipe.input("x").map("x", ("h", "p"), op).output("h", "p").with_example(3.0))
    half, positive = pipeline(3.0)
    assert (half.shape, float(half), positive.shape, int(positive)) == ((), 1.5, (), 1)
    build_pipeline_model(pipeline, tmp_path / "models", in_process=False)
    config = read_config(tmp_path / "models" / "halves")
    for tensor in (*config.input, *config.output):
        assert list(tensor.dims) == [1] and tensor.HasField("reshape")
        assert list(tensor.reshape.shape) == []
    assert [mc.DataType.Name(t.data_type) for t in config.output] == ["TYPE_FP32", "TYPE_INT64"]


def test_dynamic_axes_index_the_axes_of_one_row(tmp_path):
    class Mean(torch.nn.Module):
        def forward(self, tokens):
            return tokens.float().mean(1, keepdim=True)

    op = ModelOp(Mean(), example_inputs=np.arange(5), dynamic_axes={"tokens": [0]})
    pipeline = (pipe.input("n").map("n", "t", np.arange).map("t", "m", op).output("m")
                .with_example(5).with_example(7))
    np.testing.assert_allclose(pipeline(7), [3.0])
    build_pipeline_model(pipeline, tmp_path / "models")
    config = read_config(tmp_path / "models" / "mean")
    assert list(config.input[0].dims) == [-1] and list(config.output[0].dims) == [1]


def test_a_row_of_another_shape_than_the_example_is_refused():
    op = ModelOp(torch.nn.Linear(3, 2), example_inputs=features(0.5), name="lin")
    with pytest.raises(PipelineError, match=r"input 'input' is \[4\] in this row, but "
                                            r"example_inputs give one row as \[3\]: give "
                                            r"example_inputs of the shape the pipeline passes"):
        op(np.zeros(4, np.float32))


def test_with_pre_the_examples_hold_the_batch_axis_pre_makes():
    torch.manual_seed(0)
    linear = torch.nn.Linear(3, 2).eval()
    op = ModelOp(linear, example_inputs=torch.zeros(1, 3), pre=lambda v: np.float32(v)[None],
                 post=lambda y: y[0], name="lin")
    assert op.input_dims == ((3,),) and not op.adds_batch_axis
    with torch.no_grad():
        np.testing.assert_allclose(op([1, 2, 3]), linear(torch.tensor([[1.0, 2, 3]]))[0],
                                   rtol=1e-6)
    with pytest.raises(PipelineError, match="with pre=, example_inputs are the module's inputs "
                                            "with their leading batch axis"):
        ModelOp(linear, example_inputs=torch.tensor(1.0), pre=lambda v: v)
