"""Ready means warm: the image's readiness is held until its pipeline has answered its examples
through Triton's HTTP front end (issue 66; :mod:`builder.runtime.supervisor.ready_gate`, the
gate's files from :mod:`builder.image.ready_gate_model`).

The real case runs the supervisor as the image does (``python3 supervisor.py --lock-admin-apis
tritonserver ...`` from the files the image carries) over the host's Triton 2.51 and a pipeline
repository the builder wrote, and watches ``/v2/health/ready`` from outside.
"""

from __future__ import annotations

import compileall
import json
import re
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from builder import build_pipeline_model, pipe
from builder.errors import BuildError
from builder.image.ready_gate_model import ready_gate_files
from builder.image.serving_dockerfile import runtime_scripts
from builder.repository.model_config import loads_config
from builder.runtime import drain, warm_up
from builder.runtime.supervisor import ADMIN_KEY_HEADER, ADMIN_KEY_VARIABLE
from builder.runtime.supervisor.ready_gate import (
    CLOSED_VERSION,
    GATE_MODEL,
    OPEN_CONFIG,
    READY_GATE_VARIABLE,
    ROUNDS,
    WARM_MODELS,
    gated_command,
    request_body,
    why_not_gated,
)
from builder.tritonserver.host_process import _server_environment, free_ports
from builder.tritonserver.wheel import triton_distribution
from tests.support.tiny_models import affine_op

ADMIN_KEY = "the-operators-own-key-0123456789"
EXPLICIT = ["tritonserver", "--model-repository=/models", "--model-control-mode=explicit",
            "--load-model=*"]


def _pipeline(examples=("a", "bb", "ccc")):
    op = affine_op(example_inputs=torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    built = (pipe.input("text").map("text", "v", lambda t: [float(len(t))] * 4)
             .map("v", "y", op).output("y"))
    for example in examples:
        built = built.with_example(example)
    return built


def test_the_gate_is_an_ensemble_over_the_pipeline_whose_closed_version_does_not_exist(
        tmp_path):
    root = tmp_path / "models"
    build_pipeline_model(_pipeline(), root)
    files = ready_gate_files(root)
    closed = loads_config(files[f"{GATE_MODEL}/config.pbtxt"])
    opened = json_format.Parse(files[OPEN_CONFIG], mc.ModelConfig())
    assert list(closed.version_policy.specific.versions) == [CLOSED_VERSION]
    assert not opened.HasField("version_policy"), "the open gate loads version 1"
    assert f"{GATE_MODEL}/1/README" in files and CLOSED_VERSION != 1
    pipeline = loads_config((root / "pipeline" / "config.pbtxt").read_text())
    assert opened.platform == "ensemble"
    assert [(t.name, t.data_type, list(t.dims)) for t in opened.input] == [
        (t.name, t.data_type, list(t.dims)) for t in pipeline.input]
    (step,) = opened.ensemble_scheduling.step
    assert step.model_name == "pipeline" and dict(step.output_map) == {"y": "y"}
    assert json.loads(files[WARM_MODELS]) == {"models": ["pipeline"]}


def test_a_pipeline_without_samples_or_that_streams_has_no_gate_and_a_clash_is_refused(
        tmp_path):
    def count(text):
        yield from range(len(text))

    build_pipeline_model(pipe.input("t").stream("t", "i", count).output("i").with_example("ab"),
                         tmp_path / "streams")
    assert ready_gate_files(tmp_path / "streams") == {}
    build_pipeline_model(pipe.input("t", schema={"t": str}).map("t", "n", len)
                         .output("n", schema={"n": int}), tmp_path / "none")
    assert ready_gate_files(tmp_path / "none") == {}
    (tmp_path / "none" / GATE_MODEL).mkdir()
    (tmp_path / "none" / GATE_MODEL / "config.pbtxt").write_text('backend: "python"')
    with pytest.raises(BuildError, match=GATE_MODEL):
        ready_gate_files(tmp_path / "none")


def test_a_sample_becomes_an_http_request_with_binary_tensors(tmp_path):
    (tmp_path / "warmup").mkdir()
    row = struct.pack("<I", 5) + b"hello"
    (tmp_path / "warmup" / "example_0_input0").write_bytes(row)
    config = {"max_batch_size": 8}
    sample = {"name": "example_0", "batch_size": 2, "inputs": {
        "text": {"data_type": "TYPE_STRING", "dims": ["1"], "input_data_file": "example_0_input0"},
        "mask": {"data_type": "TYPE_FP32", "dims": ["3"], "zero_data": True}}}
    name, (body, header_size) = request_body(config, sample, tmp_path)
    header = json.loads(body[:header_size])
    assert name == "example_0"
    assert header["parameters"][warm_up.REQUEST_PARAMETER] is True
    assert [(i["name"], i["datatype"], i["shape"], i["parameters"]["binary_data_size"])
            for i in header["inputs"]] == [("mask", "FP32", [2, 3], 24),
                                           ("text", "BYTES", [2, 1], 2 * len(row))]
    assert body[header_size:] == bytes(24) + row * 2


def test_the_gate_holds_only_where_its_load_can_open_it():
    assert why_not_gated(EXPLICIT) is None
    assert "explicit" in why_not_gated(["tritonserver", "--model-repository=/models"])
    assert "strict-readiness" in why_not_gated([*EXPLICIT, "--strict-readiness=false"])
    assert "exit-on-error" in why_not_gated([*EXPLICIT, "--exit-on-error=true"])
    assert gated_command(EXPLICIT, "/gate")[-2:] == ["--model-repository=/gate",
                                                     "--exit-on-error=false"]


def test_a_warm_up_batch_is_told_from_the_clients():
    marked = {warm_up.REQUEST_PARAMETER: True}
    assert warm_up.marked([marked, marked])
    assert not warm_up.marked([marked, {}]) and not warm_up.marked([])


def _image_files(tmp_path: Path, repository: Path) -> tuple[Path, Path]:
    """The supervisor's files and the gate's, as the image carries them."""
    runtime = tmp_path / "runtime"
    for name, text in runtime_scripts().items():
        (runtime / name).parent.mkdir(parents=True, exist_ok=True)
        (runtime / name).write_text(text)
    gate = tmp_path / "gate"
    for name, text in ready_gate_files(repository).items():
        (gate / name).parent.mkdir(parents=True, exist_ok=True)
        (gate / name).write_text(text)
    return runtime / "supervisor.py", gate


def _supervise(tmp_path: Path, repository: Path
               ) -> tuple[subprocess.Popen, tuple[int, int], list[str]]:
    """The supervised server, its HTTP and metrics ports, and its log as it comes. The
    repository's Python is compiled first, as the stub would cache it: in the image nothing
    writes there (uid 1000, files of root), but this test runs as root, and a ``__pycache__``
    the stub wrote while loading would make Triton reload the pipeline when the gate's load
    polls it (a changed directory)."""
    compileall.compile_dir(str(repository), quiet=1)
    supervisor, gate = _image_files(tmp_path, repository)
    distribution = triton_distribution()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    backends = distribution.backend_directory(tmp_path / "backends", version, None)
    http, grpc, metrics = free_ports(3)
    command = [str(distribution.tritonserver), f"--model-repository={repository}",
               f"--backend-directory={backends}", f"--http-port={http}",
               f"--grpc-port={grpc}", f"--metrics-port={metrics}",
               "--model-control-mode=explicit", "--load-model=*"]
    environment = _server_environment(distribution, {
        READY_GATE_VARIABLE: str(gate), "TRITON_BUILDER_METRICS_PORT": "0",
        ADMIN_KEY_VARIABLE: ADMIN_KEY,
        "TRITON_BUILDER_HEALED_STUBS": str(tmp_path / "healed"),
        drain.STATE_DIR_VARIABLE: str(tmp_path / "drain")}, (backends / "python",))
    running = subprocess.Popen([sys.executable, str(supervisor), "--lock-admin-apis", *command],
                               env=environment, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(running.stdout), daemon=True).start()
    return running, (http, metrics), lines


def _get(url: str) -> tuple[int | None, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return None, b""


def _settled_count(base: str, wanted: int) -> int:
    """The pipeline's inference count once it reaches ``wanted`` (the python backend reports a
    request's statistics after its response: :mod:`tests.support.model_statistics`)."""
    deadline = time.monotonic() + 10
    while True:
        _, stats = _get(f"{base}/models/pipeline/stats")
        (model,) = json.loads(stats)["model_stats"]
        if model["inference_count"] >= wanted or time.monotonic() > deadline:
            return model["inference_count"]
        time.sleep(0.05)


def _operator_rows(metrics_port: int) -> dict[str, float]:
    """``triton_builder_operator_rows`` by operator, once the metrics thread has sent them."""
    time.sleep(2.5)  # the pipeline model sends its counters every second
    _, text = _get(f"http://127.0.0.1:{metrics_port}/metrics")
    rows = {}
    for line in text.decode().splitlines():
        if line.startswith("triton_builder_operator_rows{"):
            labels, value = line.rsplit(" ", 1)
            if float(value):
                rows[labels] = float(value)
    return rows


def _get_index(http_port: int) -> tuple[int | None, list]:
    """The repository index, read with the image's key: the supervisor's own, so the test
    asks as an operator would, through the key it set (TRITON_BUILDER_ADMIN_KEY)."""
    request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v2/repository/index",
                                     data=b"{}", method="POST",
                                     headers={ADMIN_KEY_HEADER: ADMIN_KEY})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, json.loads(response.read())


def _stop(running: subprocess.Popen) -> None:
    running.terminate()
    try:
        running.wait(60)
    except subprocess.TimeoutExpired:
        running.kill()
        running.wait()


@pytest.mark.slow
@pytest.mark.tritonserver
def test_readiness_opens_only_after_the_samples_went_through_the_front_end(tmp_path):
    """Real: Triton 2.51 under the image's supervisor. While the server answers HTTP, ready
    stays 400 until the pipeline has answered its examples over the front end (before the test
    sends anything, the pipeline has served Triton's samples and the gate's, ROUNDS times);
    the operator metrics count none of them; the gate ends unloaded; a request after ready is
    answered as in process."""
    repository = tmp_path / "models"
    pipeline = _pipeline()
    build_pipeline_model(pipeline, repository)
    running, (http, metrics), lines = _supervise(tmp_path, repository)
    base = f"http://127.0.0.1:{http}/v2"
    try:
        seen_closed = False
        deadline = time.monotonic() + 180
        while True:
            assert time.monotonic() < deadline, "".join(lines)
            assert running.poll() is None, "".join(lines)
            live, _ = _get(f"{base}/health/live")
            ready, _ = _get(f"{base}/health/ready")
            if ready == 200:
                break
            seen_closed = seen_closed or live == 200
            time.sleep(0.01)
        samples = 3  # Triton's model_warmup of the pipeline, then the gate's ROUNDS of them
        assert _settled_count(base, samples + ROUNDS * samples) == samples + ROUNDS * samples, \
            "".join(lines)
        assert seen_closed, "the server listened while not ready"
        # readiness opens with the gate's load; the supervisor unloads it, then says so
        said = rf"ready: {ROUNDS * samples} warm-up requests"
        while not any(re.search(said, line) for line in lines):
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
        assert _operator_rows(metrics) == {}, "the warm-up's requests are not the clients'"
        body = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1],
                                       "data": ["dddd"]}]}).encode()
        request = urllib.request.Request(f"{base}/models/pipeline/infer", data=body,
                                         method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            (output,) = json.loads(response.read())["outputs"]
        assert np.allclose(output["data"], np.asarray(pipeline("dddd"), dtype=float).ravel())
        assert set(_operator_rows(metrics).values()) == {1.0}, "a client's request is counted"
        _, index = _get_index(http)
        assert {"name": GATE_MODEL, "state": "UNAVAILABLE", "reason": "unloaded"} in [
            {key: entry.get(key) for key in ("name", "state", "reason")} for entry in index]
    finally:
        _stop(running)


@pytest.mark.slow
@pytest.mark.tritonserver
def test_a_model_that_fails_to_load_still_fails_the_start_naming_it(tmp_path):
    """The gate's server runs with --exit-on-error=false; any other model that failed to load
    stops it all the same: the supervisor exits 1 naming the model, never ready."""
    repository = tmp_path / "models"
    build_pipeline_model(_pipeline(), repository)
    broken = repository / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text('backend: "no_such_backend"\nmax_batch_size: 0\n'
                                         'input [{ name: "x" data_type: TYPE_FP32 dims: [1] }]\n'
                                         'output [{ name: "y" data_type: TYPE_FP32 dims: [1] }]\n')
    running, _, lines = _supervise(tmp_path, repository)
    try:
        assert running.wait(180) == 1, "".join(lines)
    finally:
        _stop(running)
    log = "".join(lines)
    assert "cannot start: model 'broken' failed to load" in log, log
