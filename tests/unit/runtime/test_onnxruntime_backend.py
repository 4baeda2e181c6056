"""The Python-based onnxruntime backend, on a real ONNX Runtime session."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import onnxruntime as ort
import pytest

from builder.runtime.backends.onnxruntime import model as backend
from tests.support.sample_repository import FEATURES, expected_linear, write_sample_repository


class CountingSession:
    """A real InferenceSession that counts its ``run`` calls (a spy, not a stand-in)."""

    def __init__(self, path: str) -> None:
        self._session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        self.runs: list[dict] = []

    def run(self, output_names, feeds):
        self.runs.append({name: array.shape for name, array in feeds.items()})
        return self._session.run(output_names, feeds)


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return write_sample_repository(tmp_path_factory.mktemp("ort") / "models")


@pytest.fixture
def session(repository) -> CountingSession:
    return CountingSession(str(repository / "linear" / "1" / "model.onnx"))


def _requests(sizes):
    rng = np.random.default_rng(0)
    return [{"INPUT": rng.standard_normal((n, FEATURES)).astype(np.float32)} for n in sizes]


def test_n_requests_run_as_one_session_run(session):
    feeds = _requests([1, 3, 2, 5])
    results = backend.run_batched(session, feeds, ["OUTPUT"], batching=True)
    assert len(session.runs) == 1
    assert session.runs[0]["INPUT"] == (11, FEATURES)
    for feed, result in zip(feeds, results):
        assert result.error is None
        np.testing.assert_allclose(result.outputs["OUTPUT"], expected_linear(feed["INPUT"]),
                                   atol=1e-5)


def test_without_batching_each_request_runs_alone(session):
    feeds = _requests([2, 2, 2])
    results = backend.run_batched(session, feeds, ["OUTPUT"], batching=False)
    assert len(session.runs) == 3
    assert all(r.outputs["OUTPUT"].shape == (2, 3) for r in results)


def test_requests_of_other_shapes_run_in_their_own_group():
    """Only requests whose non-batch shapes agree can be concatenated."""

    class ShapeEcho:
        runs = 0

        def run(self, names, feeds):
            ShapeEcho.runs += 1
            return [feeds["X"] * 2]

    feeds = [{"X": np.ones((1, 4), np.float32)}, {"X": np.ones((2, 6), np.float32)},
             {"X": np.ones((3, 4), np.float32)}]
    results = backend.run_batched(ShapeEcho(), feeds, ["Y"], batching=True)
    assert ShapeEcho.runs == 2
    assert [r.outputs["Y"].shape for r in results] == [(1, 4), (2, 6), (3, 4)]


def test_a_failing_group_answers_each_of_its_requests_with_the_error(session):
    feeds = [{"INPUT": np.ones((1, FEATURES + 1), np.float32)},
             {"INPUT": np.ones((1, FEATURES), np.float32)}]
    results = backend.run_batched(session, feeds, ["OUTPUT"], batching=True)
    assert results[0].error and "onnxruntime" in results[0].error
    assert results[1].error is None


class _StandInPbUtils(types.ModuleType):
    """Stand-in for ``triton_python_backend_utils``, which exists only inside Triton's stub.

    The end-to-end tests run the same backend in a real tritonserver.
    """

    class Tensor:
        def __init__(self, name, array):
            self.name, self.array = name, array

        def as_numpy(self):
            return self.array

    class TritonError:
        def __init__(self, message):
            self.message = message

    class InferenceResponse:
        def __init__(self, output_tensors, error=None):
            self.output_tensors, self.error = output_tensors, error

    @staticmethod
    def get_input_tensor_by_name(request, name):
        return _StandInPbUtils.Tensor(name, request[name])


def test_execute_with_stand_in_pb_utils(repository, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils",
                        _StandInPbUtils("triton_python_backend_utils"))
    config = {"max_batch_size": 8, "input": [{"name": "INPUT"}], "output": [{"name": "OUTPUT"}]}
    model = backend.TritonPythonModel()
    model.initialize({"model_config": json.dumps(config), "model_repository": str(
        repository / "linear"), "model_version": "1", "model_instance_kind": "CPU"})
    runs = []
    real_run = model._session.run
    model._session.run = lambda names, feeds: runs.append(1) or real_run(names, feeds)
    requests = _requests([2, 1, 4])
    responses = model.execute(requests)
    assert len(runs) == 1
    for request, response in zip(requests, responses):
        (tensor,) = response.output_tensors
        np.testing.assert_allclose(tensor.array, expected_linear(request["INPUT"]), atol=1e-5)


def test_sessions_do_not_spin_and_share_the_cores_unless_the_config_says_so(monkeypatch):
    monkeypatch.setattr(backend.os, "cpu_count", lambda: 8)
    options = backend.session_options({}, instances=2)
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    chosen = backend.session_options({"intra_op_thread_count": {"string_value": "3"},
                                      "allow_spinning": {"string_value": "1"}}, instances=2)
    assert chosen.intra_op_num_threads == 3
    assert chosen.get_session_config_entry("session.inter_op.allow_spinning") == "1"


def test_as_a_plain_python_model_the_onnx_file_is_model_onnx():
    """On python backends without Python-based backends (r23.05 and before) this file serves
    as a python model's ``1/model.py``, and Triton fills ``default_model_filename`` with
    ``model.py``: the ONNX file is still ``model.onnx``, not this script."""
    assert backend.onnx_file({"default_model_filename": "model.py"}) == "model.onnx"
    assert backend.onnx_file({}) == "model.onnx"
    assert backend.onnx_file({"default_model_filename": "net.onnx"}) == "net.onnx"


def _linear_args(repository, kind: str, device: int = 0) -> dict:
    config = {"max_batch_size": 8, "input": [{"name": "INPUT"}], "output": [{"name": "OUTPUT"}]}
    return {"model_config": json.dumps(config), "model_repository": str(repository / "linear"),
            "model_version": "1", "model_instance_kind": kind, "model_name": "linear",
            "model_instance_device_id": str(device)}


def test_a_gpu_instance_asks_for_the_cuda_provider_on_its_own_device():
    assert backend.providers("GPU", 2) == [("CUDAExecutionProvider", {"device_id": 2}),
                                           "CPUExecutionProvider"]
    assert backend.providers("CPU", 2) == ["CPUExecutionProvider"]


def test_a_kind_gpu_instance_on_a_cpu_onnxruntime_fails_to_load_instead_of_running_on_the_cpu(
        repository):
    """This venv's onnxruntime is the CPU build (no CUDA provider): before, the backend made a
    CPU session for the KIND_GPU instance without a word."""
    assert "CUDAExecutionProvider" not in ort.get_available_providers()
    model = backend.TritonPythonModel()
    with pytest.raises(backend.CudaProviderError) as refused:
        model.initialize(_linear_args(repository, "GPU"))
    assert "model 'linear' is KIND_GPU, but ONNX Runtime's CUDA provider cannot start" in str(
        refused.value)
    assert "is not a GPU build (it has no CUDAExecutionProvider): the environment needs " \
           "onnxruntime-gpu" in str(refused.value)
    model.initialize(_linear_args(repository, "CPU"))  # the same model loads on a CPU instance


def test_a_gpu_instances_session_that_got_only_the_cpu_provider_is_refused(session):
    """A real session on the CPU provider, as ONNX Runtime leaves one whose CUDA provider failed."""
    with pytest.raises(backend.CudaProviderError, match=(
            r"model 'linear' is KIND_GPU, but its ONNX Runtime session got only "
            r"CPUExecutionProvider, not CUDAExecutionProvider: onnxruntime .* is not a GPU "
            r"build")):
        backend.require_cuda_provider(session._session, "linear")
