"""The serving benchmark's hand-written ``model.py`` answers as the pipeline does.

It is the baseline the pipeline model's overhead is split against (``BENCHMARKS.md``), so it
must do the pipeline's whole work. Run here through :mod:`tests.support.pb_utils_standin` (only
Triton's plumbing is the stand-in; the ONNX model is the exported one, run by onnxruntime);
the benchmark itself serves it from a real tritonserver and checks every answer.
"""

from __future__ import annotations

import importlib
import json
import sys

import numpy as np
import pytest
from google.protobuf import json_format

from benchmarks import bench_serving
from builder import build_pipeline_model
from builder.repository.model_config import read_config
from tests.support import pb_utils_standin as pb


@pytest.mark.parametrize("key", ["text", "image"])
def test_handwritten_model_answers_as_the_pipeline(key, tmp_path, monkeypatch):
    workload = bench_serving.WORKLOADS[key](6)
    built = build_pipeline_model(workload.pipeline, tmp_path / "models",
                                 parallelism=workload.parallelism)
    onnx_path = built.model_root / workload.model / "1" / "model.onnx"
    bench_serving._add_handwritten(built.model_root, built.pipeline_model, workload, onnx_path)
    directory = built.model_root / bench_serving.HANDWRITTEN_MODEL
    config = read_config(directory)
    assert [t.name for t in config.input] == list(workload.pipeline.inputs)
    assert config.instance_group[0].count == workload.parallelism

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    monkeypatch.syspath_prepend(str(directory / "1"))
    model = importlib.import_module("model").TritonPythonModel()
    monkeypatch.delitem(sys.modules, "model")
    model.initialize({"model_config": json.dumps(json_format.MessageToDict(
        config, preserving_proto_field_name=True))})

    requests = [pb.Request({workload.input_name: np.array(
        [[item.encode() if isinstance(item, str) else item]], dtype=np.object_)})
        for item in workload.items]
    responses = model.execute(requests)
    assert len(responses) == len(requests)
    for item, response in zip(workload.items, responses, strict=True):
        got = {t.name(): t.as_numpy()[0] for t in response.output_tensors}
        want = workload.pipeline(item)
        want = want if isinstance(want, tuple) else (want,)
        for name, value in zip(workload.pipeline.outputs, want, strict=True):
            if isinstance(value, np.ndarray):
                np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5)
            else:
                assert [v.decode() for v in got[name]] == list(value)
