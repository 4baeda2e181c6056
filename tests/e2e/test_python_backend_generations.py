"""The pipeline model on the real python backend of older releases: r22.12 and r23.05.

The same ``model.py`` serves on every release, and each release's python backend binds a
different API (:class:`builder.runtime.pipeline_model.PythonBackendApi`). No 22.12 or 23.05
server can run here (NGC images), but their python backends can: ``libtriton_python.so``,
the stub and ``triton_python_backend_utils.py`` of each branch are compiled from
``../shared/triton-sources`` through the stub's own build stage (``compile_stub(backend=True)``,
GPU off, for Python 3.11; cached by content) and loaded as the python backend of the host Triton
2.51. r23.05's is compiled on the Debian image with its own Python; r22.12's is the compile
``test_stub_build.py`` checks, on the 22.12 stand-in (glibc 2.31) against Python 3.11 built from
source, as a 22.12 bridge compiles it (one compile for both: a fresh run compiled r22.12
twice). The server around them is 2.51's, so what is checked is the python backend's API and
its messages, not a whole 22.12 server.

Python-based backends (a ``model.py`` in the backend directory, how the CPU image serves ONNX
models) came after r23.05: there the ONNX models become python models running the same
``builder/runtime/backends/onnxruntime/model.py`` (:func:`as_python_models`), as close to the
CPU image as these branches allow. The examples (image classification through BLS, as on GPU
releases) and the reliability suite's bad-request matrix must answer as in process.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builder import build_pipeline_model
from builder.bridge.stub_build import compile_stub
from builder.runtime.pipeline_model import PythonBackendApi
from builder.tritonserver.host_process import TritonServer
from builder.tritonserver.wheel import ONNXRUNTIME_BACKEND
from builder.verify.equality import check_same
from tests.e2e.test_reliability import GoodTraffic, _bad_requests
from tests.e2e.test_stub_build import SOURCES, needs_sources, r22_12_python_backend
from tests.support import pb_utils_standin
from tests.support.example_inputs import EXAMPLES, TEXTS
from tests.support.model_statistics import settled_statistics
from tests.support.pipeline_client import infer, infer_concurrently

pytestmark = [pytest.mark.slow, needs_sources, pytest.mark.alongside]
BRANCHES = ["r22.12", "r23.05"]
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def compiled_python_backend(client, build_image: str, branch: str) -> Path:
    """A directory with ``branch``'s ``libtriton_python.so``, stub (for this Python) and
    ``triton_python_backend_utils.py``."""
    return compile_stub(client, branch=branch, python_version=PYTHON,
                        build_image_name=build_image, sources=SOURCES, backend=True).parent


def as_python_models(root: Path) -> list[str]:
    """Make every ONNX model of repository ``root`` a python model running our onnxruntime
    backend's ``model.py`` (the python backends before r23.07 have no Python-based backends:
    they would run ``model.onnx`` as Python). Returns the models changed."""
    changed = []
    for path in sorted(root.glob("*/config.pbtxt")):
        config = text_format.Parse(path.read_text(), mc.ModelConfig())
        if config.platform != "onnxruntime_onnx" and config.backend != "onnxruntime":
            continue
        config.platform, config.backend = "", "python"
        config.ClearField("default_model_filename")  # the stub would run it as model.py
        path.write_text(text_format.MessageToString(config))
        for version in path.parent.iterdir():
            if version.is_dir() and version.name.isdigit():
                shutil.copyfile(ONNXRUNTIME_BACKEND, version / "model.py")
        changed.append(config.name)
    return changed


@pytest.fixture(scope="module", params=BRANCHES)
def served(request, docker_client, os_image, tmp_path_factory):
    """The three examples on the host Triton with ``branch``'s python backend: text embedding
    as ``pipeline`` (the bad-request matrix's model), the others under their own names."""
    branch = request.param
    started = time.monotonic()
    if branch == "r22.12":
        backend = r22_12_python_backend(
            docker_client, request.getfixturevalue("glibc_2_31_release_image"),
            request.getfixturevalue("python_source_image")).parent
    else:
        backend = compiled_python_backend(docker_client, os_image, branch)
    compiled = time.monotonic() - started
    roots = []
    for name in EXAMPLES:
        root = tmp_path_factory.mktemp(f"{branch}-{name}") / "models"
        build_pipeline_model(EXAMPLES[name][0], root,
                             name="pipeline" if name == "text_embedding" else name,
                             dynamic_batching={"max_queue_delay_microseconds": 20000},
                             in_process=name != "image_classification")
        assert as_python_models(root), f"{name} has no ONNX model"
        roots.append(root)
    extra = tuple(f"--model-repository={root}" for root in roots[1:])
    with TritonServer(roots[0], extra_args=extra, python_backend=backend) as server:
        print(f"{branch}: python backend compiled or cached in {compiled:.0f}s, server ready "
              f"after {time.monotonic() - started:.0f}s")
        yield branch, server


def _model(name: str) -> str:
    return "pipeline" if name == "text_embedding" else name


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_examples_serve_equal_to_in_process(served, name):
    """One call per request, five per request, and all at once (batched dynamically)."""
    _, server = served
    pipeline, inputs = EXAMPLES[name]
    expected = [pipeline(value) for value in inputs]
    signature = pipeline.signature()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for value, reference in zip(inputs[:8], expected, strict=False):
            (answer,) = infer(client, _model(name), signature, [(value,)])
            check_same(answer, reference, where=f"{name}({value!r:.40})")
        for start in range(0, len(inputs), 5):
            answers = infer(client, _model(name), signature,
                            [(value,) for value in inputs[start:start + 5]])
            check_same(answers, expected[start:start + 5], where=name)
        answers = infer_concurrently(client, _model(name), signature,
                                     [(value,) for value in inputs])
        check_same(answers, expected, where=name)


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_each_bad_request_gets_its_status_while_good_ones_succeed(served, scheme):
    """The reliability suite's matrix. Before r23.09 ``TritonError`` has no codes: what the
    pipeline model itself refuses ("bad request: …") reaches the client as a server error
    there, as the stand-in generation of that branch predicts; the server refuses the rest
    before the model sees them, with the matrix's status."""
    branch, server = served
    codes = PythonBackendApi.of(pb_utils_standin.generation(branch)).error_codes
    module = grpcclient if scheme == "grpc" else httpclient
    address = server.grpc_url if scheme == "grpc" else server.http_url
    internal = "StatusCode.INTERNAL" if scheme == "grpc" else "500"
    seen = {}
    with GoodTraffic(f"{scheme}://{address}/pipeline", list(TEXTS[:8])) as good, \
            module.InferenceServerClient(address) as client:
        for name, (model, inputs, grpc_status, http_status) in _bad_requests(module).items():
            with pytest.raises(Exception) as refused:
                client.infer(model, inputs)
            expected = grpc_status if scheme == "grpc" else http_status
            if "bad request:" in str(refused.value) and not codes:
                expected = internal
            assert refused.value.status() == expected, f"{name}: {refused.value}"
            seen[name] = refused.value.status()
        deadline = time.monotonic() + 30
        while good.answers < 50 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not good.failures, good.failures[:5]
    assert good.answers >= 50
    assert (seen["invalid UTF-8"] == internal) == (not codes)
    print(f"{branch} {scheme}: {seen}; {good.answers} good answers, none failed")


def test_bad_requests_in_a_dynamic_batch_fail_alone(served):
    """The measurement that found the bug on r22.12: 8 invalid UTF-8 requests among 64 in
    flight at once made 55 of the 56 good ones fail (the whole batch)."""
    branch, server = served
    pipeline, _ = EXAMPLES["text_embedding"]
    texts = [TEXTS[i % len(TEXTS)].encode() if i % 8 else b"caf\xe9" for i in range(64)]
    results: list = [None] * len(texts)
    done = threading.Semaphore(0)

    def keep(index):
        def callback(result, error):
            results[index] = error if error is not None else result
            done.release()
        return callback

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        before = client.get_inference_statistics("pipeline").model_stats[0]
        for index, text in enumerate(texts):
            tensor = grpcclient.InferInput("text", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[text]], dtype=object))
            client.async_infer("pipeline", [tensor], callback=keep(index))
        for _ in texts:
            assert done.acquire(timeout=120)
        good = sum(text != b"caf\xe9" for text in texts)
        after = settled_statistics(client, "pipeline", before.inference_count + good)
    executions = after.execution_count - before.execution_count
    failed_good = [i for i, text in enumerate(texts)
                   if text != b"caf\xe9" and isinstance(results[i], Exception)]
    assert not failed_good, f"{len(failed_good)} good requests failed: {results[failed_good[0]]}"
    for index, text in enumerate(texts):
        if text == b"caf\xe9":
            assert "bad request: input 'text'" in str(results[index]), results[index]
        else:
            check_same(results[index].as_numpy("vec")[0], pipeline(text.decode()),
                       where=text.decode())
    assert executions < len(texts), "no dynamic batch was formed"
    print(f"{branch}: 8 bad among 64 in flight, in {executions} executions, every good one "
          f"answered")


def test_per_operator_metrics_are_served_where_the_branch_has_custom_metrics(served):
    """r23.05 binds ``MetricFamily`` (the pipeline model's counters reach the server's metrics
    endpoint); r22.12 has none, and the model serves untimed."""
    branch, server = served
    metrics = PythonBackendApi.of(pb_utils_standin.generation(branch)).custom_metrics
    pipeline, inputs = EXAMPLES["text_embedding"]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        infer(client, "pipeline", pipeline.signature(), [(inputs[0],)])
    deadline = time.monotonic() + 10
    while True:  # sent every second by the model's own thread
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as page:
            text = page.read().decode()
        found = 'triton_builder_operator_rows{model="pipeline"' in text
        if found or not metrics or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert found == metrics, f"{branch}: per-operator metrics {'missing' if metrics else 'found'}"
