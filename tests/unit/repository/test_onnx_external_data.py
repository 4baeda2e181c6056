"""ONNX models past protobuf's 2 GiB (issue 65, item 1): the weights in one data file beside
the graph, checked and run from the path; a real 2.46 GB operator exported through the build's
exporter."""

from __future__ import annotations

import resource

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from builder import ModelOp
from builder.repository.export import export_model
from builder.repository.onnx_external_data import ALIGN_FROM, ALIGNMENT, gather_external_data
from tests.support.large_models import ROWS, WIDTH, EmbeddingEncoder


def _two_tensor_model(path, big_rows: int = 512):
    """y = x @ W + b (W: 1,024 x ``big_rows``), saved with one file per tensor, as torch's
    TorchScript-based exporter writes a model past 2 GiB."""
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(WIDTH, big_rows)).astype(np.float32)
    bias = rng.normal(size=(big_rows,)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
        "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", big_rows])],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=False,
                    size_threshold=0)
    return weight, bias


def test_tensors_in_files_of_their_own_are_gathered_into_one_aligned_data_file(tmp_path):
    path = tmp_path / "model.onnx"
    weight, bias = _two_tensor_model(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["W", "b", "model.onnx"]
    assert weight.nbytes >= ALIGN_FROM

    data = gather_external_data(path)

    assert data == tmp_path / "model.onnx.data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]
    graph = onnx.load(str(path), load_external_data=False)
    places = {t.name: {e.key: e.value for e in t.external_data} for t in graph.graph.initializer}
    assert {p["location"] for p in places.values()} == {"model.onnx.data"}
    assert int(places["W"]["offset"]) % ALIGNMENT == 0
    onnx.checker.check_model(str(path))
    x = np.random.default_rng(1).normal(size=(3, WIDTH)).astype(np.float32)
    (y,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, x @ weight + bias, rtol=1e-4, atol=1e-3)
    assert gather_external_data(path) == data, "gathered once, left as it is after"


def test_a_model_with_its_tensors_inside_is_left_as_it_is(tmp_path):
    path = tmp_path / "model.onnx"
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])])
    onnx.save_model(helper.make_model(graph), str(path))
    before = path.read_bytes()
    assert gather_external_data(path) is None
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["model.onnx"]


def test_external_data_outside_the_model_directory_is_refused(tmp_path):
    (tmp_path / "version").mkdir()
    path = tmp_path / "version" / "model.onnx"
    _two_tensor_model(path)
    graph = onnx.load(str(path), load_external_data=False)
    for entry in graph.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../W"
    (tmp_path / "version" / "W").rename(tmp_path / "W")
    path.write_bytes(graph.SerializeToString())
    with pytest.raises(ValueError, match=r"tensor 'W' names external data '\.\./W'"):
        gather_external_data(path)


def test_an_operator_past_two_gib_exports_to_onnx_with_its_weights_beside_the_graph(tmp_path):
    """Before: ``format onnx failed: ValueError: This protobuf of onnx model is too large
    (>2GiB)`` (the checker given the loaded model), and with only ``onnx`` in
    ``format_priority`` no model at all."""
    torch.manual_seed(0)
    with torch.no_grad():
        module = EmbeddingEncoder().eval()
    weights = sum(p.numel() * p.element_size() for p in module.parameters())
    assert weights > 2**31
    op = ModelOp(module, torch.randint(0, ROWS, (8,)), name="big_encoder", input_names=["ids"])

    exported = export_model(op, tmp_path / "1", ["onnx"])

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"peak RSS of the export: {peak / 1e9:.2f} GB for {weights / 1e9:.2f} GB of weights")
    assert exported.format == "onnx", exported.attempts
    files = {p.name: p.stat().st_size for p in (tmp_path / "1").iterdir()}
    assert sorted(files) == ["model.onnx", "model.onnx.data"]
    assert files["model.onnx"] < 1024 * 1024 and files["model.onnx.data"] >= ROWS * WIDTH * 4
    ids = torch.randint(0, ROWS, (4, 8))
    session = ort.InferenceSession(str(tmp_path / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"ids": ids.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(got, module(ids).numpy(), rtol=1e-4, atol=1e-5)
