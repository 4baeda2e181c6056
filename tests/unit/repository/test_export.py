"""Export of model operators: formats, numerical checks, fall-through and its reasons."""

from __future__ import annotations

import pickle

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from builder import ExportError, ModelOp, PipelineError
from builder.repository.export import export_model, onnx_io
from tests.support.tiny_models import Affine, Doubler, Noisy, TwoHeads, Unscriptable, affine_op


def test_onnx_export_has_a_dynamic_batch_axis_and_matches_torch(tmp_path):
    op = affine_op()
    exported = export_model(op, tmp_path / "1", ["onnx"])
    assert exported.format == "onnx" and exported.platform == "onnxruntime_onnx"
    assert [(t.name, t.dtype, t.dims) for t in exported.inputs] == [("x", "TYPE_FP32", (4,))]
    assert [(t.name, t.dtype, t.dims) for t in exported.outputs] == [
        ("output_0", "TYPE_FP32", (3,))]
    session = ort.InferenceSession(str(tmp_path / "1" / "model.onnx"))
    batch = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    (got,) = session.run(None, {"x": batch})
    with torch.no_grad():
        want = op.module(torch.from_numpy(batch)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_onnx_export_with_several_inputs_outputs_and_a_varying_axis(tmp_path):
    torch.manual_seed(0)
    op = ModelOp(TwoHeads(), (torch.zeros(4), torch.zeros(3, dtype=torch.int64)),
                 name="two", output_names=["scores", "id_sum"], dynamic_axes={"ids": [0]})
    exported = export_model(op, tmp_path / "1", ["onnx"])
    assert [(t.name, t.dtype, t.dims) for t in exported.inputs] == [
        ("features", "TYPE_FP32", (4,)), ("ids", "TYPE_INT64", (-1,))]
    assert [(t.name, t.dtype, t.dims) for t in exported.outputs] == [
        ("scores", "TYPE_FP32", (2,)), ("id_sum", "TYPE_INT64", ())]
    model = onnx.load(str(tmp_path / "1" / "model.onnx"))
    assert onnx_io(model) == (exported.inputs, exported.outputs)


def test_torchscript_export_follows_the_pytorch_backend_naming(tmp_path):
    exported = export_model(affine_op(), tmp_path / "1", ["torchscript"])
    assert exported.platform == "pytorch_libtorch"
    assert [t.name for t in exported.inputs] == ["x__0"]
    assert [t.name for t in exported.outputs] == ["output_0__0"]
    loaded = torch.jit.load(str(tmp_path / "1" / "model.pt"))
    assert loaded(torch.zeros(3, 4)).shape == (3, 3)


def test_python_export_pickles_the_module_beside_the_runtime(tmp_path):
    exported = export_model(affine_op(), tmp_path / "1", ["python"])
    assert exported.backend == "python"
    files = sorted(p.name for p in (tmp_path / "1").iterdir())
    assert files == ["model.py", "module.pickle"]
    module = pickle.loads((tmp_path / "1" / "module.pickle").read_bytes())
    assert isinstance(module, torch.nn.Module)
    assert "TritonPythonModel" in (tmp_path / "1" / "model.py").read_text()


def test_an_export_failure_falls_through_with_its_reason(tmp_path):
    op = ModelOp(Doubler(), torch.zeros(8), name="doubler")
    exported = export_model(op, tmp_path / "1", ["onnx", "python"])
    assert exported.format == "python"
    first, second = exported.attempts
    assert (first.format, first.ok) == ("onnx", False)
    assert "fft_fft" in first.reason and "\n" not in first.reason
    assert (second.format, second.ok) == ("python", True)
    assert not (tmp_path / "1" / "model.onnx").exists()  # the failed format's files are gone


def test_a_numerical_mismatch_falls_through_and_without_fallback_fails(tmp_path):
    op = ModelOp(Noisy(), torch.zeros(3), name="noisy")
    with pytest.raises(ExportError) as error:
        export_model(op, tmp_path / "1", ["onnx", "torchscript"])
    message = str(error.value)
    assert message.startswith("model operator 'noisy' could not be exported in any of")
    assert "onnx: output 'output_0' differs from torch by up to" in message
    assert "torchscript: output 'output_0' differs from torch" in message
    assert "add a fallback format such as 'python'" in message


def test_tensorrt_is_skipped_with_a_reason_where_it_is_missing(tmp_path):
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        exported = export_model(affine_op(), tmp_path / "1", ["tensorrt", "onnx"])
        assert exported.format == "onnx"
        assert exported.attempts[0].format == "tensorrt"
        assert "TensorRT is not installed" in exported.attempts[0].reason
    else:
        pytest.skip("TensorRT is installed here; this checks the fall-through without it")


def test_modules_must_return_tensors():
    with pytest.raises(PipelineError, match="'unscriptable': the module must return tensors .* "
                                            "got str for output 'note'"):
        ModelOp(Unscriptable(), torch.zeros(3), name="unscriptable")


def test_unknown_formats_are_refused(tmp_path):
    with pytest.raises(ExportError, match=r"unknown formats \['tflite'\]"):
        export_model(affine_op(), tmp_path / "1", ["tflite"])


def test_model_op_runs_pre_module_post_in_process():
    op = affine_op()
    value = op([1.0, 2.0, 3.0, 4.0])
    with torch.no_grad():
        want = torch.tanh(op.module.linear(torch.tensor([[1.0, 2.0, 3.0, 4.0]])))[0].numpy()
    np.testing.assert_allclose(value, want, rtol=1e-6)
    assert value.dtype == np.float32


def test_model_op_checks_what_pre_returns():
    op = affine_op(pre=lambda v: np.zeros((1, 5), np.float32))
    with pytest.raises(PipelineError, match=r"input 'x' has shape \[1, 5\], the model takes "
                                            r"\[batch, 4\]"):
        op([0.0])
    op = affine_op(pre=lambda v: (np.zeros((1, 4)), np.zeros((1, 4))))
    with pytest.raises(PipelineError, match="pre returned 2 inputs, the model takes 1"):
        op([0.0])


def test_model_op_casts_inputs_to_the_exported_dtypes():
    op = affine_op(pre=lambda v: np.asarray(v, dtype=np.float64)[None])
    assert op.prepare([1, 2, 3, 4])[0].dtype == np.float32


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"op_config": {"instances": 2}}, r"unknown op_config keys \['instances'\]"),
        ({"op_config": {"instance_count": 0}}, "instance_count'] must be a positive int"),
        ({"op_config": {"device_ids": "0"}}, "device_ids'] must be a list of GPU indices"),
        ({"op_config": {"format_priority": "onnx"}}, "must be a non-empty list of formats"),
        ({"op_config": {"dynamic_batching": {"delay": 1}}}, "dynamic_batching'] must be"),
        ({"name": "bad name"}, "not a valid Triton model name"),
        ({"dynamic_axes": {"y": [1]}}, r"dynamic_axes names unknown tensors \[.y.\]"),
        ({"example_inputs": torch.tensor(1.0)}, "with pre=, example_inputs are the module's "
                                                 "inputs with their leading batch axis"),
    ],
)
def test_model_op_options_are_validated(kwargs, message):
    with pytest.raises(PipelineError, match=message):
        affine_op(**kwargs)


def test_model_op_needs_a_torch_module():
    with pytest.raises(PipelineError, match="needs a torch.nn.Module, got function"):
        ModelOp(lambda x: x, torch.zeros(2))


def test_default_names_come_from_the_module_class():
    assert ModelOp(Affine(), torch.zeros(4)).name == "affine"
    assert ModelOp(TwoHeads(), (torch.zeros(4), torch.zeros(2, dtype=torch.int64))
                   ).name == "two_heads"
