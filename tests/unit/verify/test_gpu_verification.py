"""GPU-aware verification: where ``KIND_GPU`` models ran, read from Triton's own accounting.

No GPU and no NVIDIA runtime here, so the end-to-end test covers the CPU side: an image whose
repository has a ``KIND_GPU`` model (as a GPU release build writes it) is verified on the CPU
with that config swapped for a ``KIND_CPU`` one, and says the GPU placement was not exercised;
the real server's statistics and metrics then show that model ran on no GPU. The GPU side is
covered by parsing metrics in the exposition format Triton prints, with the ``gpu_uuid`` label
its GPU instances carry: that part is not measured on a GPU here.
"""

from __future__ import annotations

import urllib.request

import docker.errors
import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from builder.job import build_image_from_repository
from builder.repository.model_config import read_config, tensors, write_config
from builder.repository.model_warmup import add_samples, operator_samples, write_samples
from builder.verify.container import ContainerEndpoint, ServingContainer
from builder.verify.placement import (
    INSTANCE_EVIDENCE,
    METRICS_EVIDENCE,
    GpuPlacementError,
    check_ran_on_gpus,
    counted_since,
    cpu_config_mounts,
    gpu_inference_counts,
    gpu_models,
    loaded_instance_groups,
    placement_verdict,
    read_placement_evidence,
)
from builder.verify.verification import InferenceCheck, VerificationError, verify_image
from tests.support.sample_repository import FEATURES, expected_linear, write_sample_repository

X = np.random.default_rng(12).standard_normal((3, FEATURES)).astype(np.float32)

TRITON_GPU_METRICS = """\
# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{gpu_uuid="GPU-4ad3f0a5-6f1d-2b1c-9e8b-1f0c2a7d9e11",model="linear",version="1"} 3
nv_inference_count{model="pipeline",version="1"} 3
nv_inference_count{gpu_uuid="GPU-4ad3f0a5-6f1d-2b1c-9e8b-1f0c2a7d9e11",model="idle",version="1"} 0
"""


def test_gpu_instances_are_read_from_the_metrics_gpu_label():
    counts = gpu_inference_counts(TRITON_GPU_METRICS)
    assert counts["linear"] == {"GPU-4ad3f0a5-6f1d-2b1c-9e8b-1f0c2a7d9e11": 3.0}
    assert counts["pipeline"] == {"cpu": 3.0}
    verdict = placement_verdict(["linear"], {"linear": 3}, counts)
    assert verdict.detail == "linear ran on GPU-4ad3f0a5-6f1d-2b1c-9e8b-1f0c2a7d9e11"
    assert verdict.evidence == {"linear": METRICS_EVIDENCE}
    with pytest.raises(GpuPlacementError, match="pipeline ran 3 inferences, none on a GPU"):
        placement_verdict(["pipeline"], {"pipeline": 3}, counts)
    with pytest.raises(GpuPlacementError, match="idle served no inference"):
        placement_verdict(["idle"], {"idle": 0}, counts)


def test_a_models_warm_up_is_not_taken_for_the_verifications_inferences():
    """Triton counts a model's ``model_warmup`` in its statistics and metrics: read at ready,
    they are the baseline, and a model the verification never reached served nothing."""
    gpu = "GPU-4ad3f0a5-6f1d-2b1c-9e8b-1f0c2a7d9e11"
    at_ready = ({"linear": 65}, {"linear": {gpu: 65.0}}, {}, {})
    with pytest.raises(GpuPlacementError, match="linear served no inference"):
        placement_verdict(["linear"], *counted_since(at_ready, at_ready))
    later = ({"linear": 71}, {"linear": {gpu: 71.0}}, {}, {})
    verdict = placement_verdict(["linear"], *counted_since(later, at_ready))
    assert verdict.detail == f"linear ran on {gpu}"
    assert placement_verdict(["linear"], *counted_since(later, None)).evidence == {
        "linear": METRICS_EVIDENCE}


@pytest.mark.slow
def test_triton_runs_a_models_warm_up_before_it_is_ready_and_counts_it(tmp_path,
                                                                        triton_server):
    """Real: Triton 2.51 (host process) loads ``linear`` with the samples the builder writes
    (:mod:`builder.repository.model_warmup`), runs both (1 row, then 64) before the model is
    ready, and counts them; counted since ready, the check's 6 inferences are the only ones."""
    root = write_sample_repository(tmp_path / "models")
    config = read_config(root / "linear")
    samples = operator_samples("linear", tensors(config, "input"), [X[:1]],
                               config.max_batch_size, {"max_queue_delay_microseconds": 200_000})
    write_samples(root / "linear", samples)
    add_samples(config, samples)
    write_config(config, root / "linear")
    server = triton_server(root)
    endpoint = ContainerEndpoint(server.http_url, server.grpc_url,
                                 f"127.0.0.1:{server.metrics_port}", "host")
    at_ready = read_placement_evidence(endpoint, ["linear"])
    assert at_ready[0]["linear"] == 1 + 64, at_ready[0]
    with pytest.raises(GpuPlacementError, match="linear served no inference"):
        check_ran_on_gpus(endpoint, ["linear"], since=at_ready)
    InferenceCheck("linear", {"INPUT": X}, {"OUTPUT": expected_linear(X)}, atol=1e-5)(endpoint)
    with pytest.raises(GpuPlacementError, match="linear ran 6 inferences, none on a GPU"):
        check_ran_on_gpus(endpoint, ["linear"], since=at_ready)


@pytest.mark.slow
def test_without_gpu_uuid_the_loaded_instance_kind_is_the_evidence(tmp_path, triton_server):
    """Triton labels ``nv_inference_count`` with ``gpu_uuid`` only where its GPU metrics start:
    not on MIG slices, vGPU or WSL2. There the loaded model's own config
    (``GET /v2/models/<m>/config``) says where Triton placed its instances.

    Real: Triton 2.51 (host process, CPU) serves the sample repository; its metrics text (no
    ``gpu_uuid``, as on a MIG slice), statistics and config responses are read as verification
    reads them, and a KIND_CPU model is refused with that evidence named. Stand-in (no GPU here):
    the GPU case takes the same real responses with the model's one instance group changed to
    what Triton's core fills in for a loaded ``KIND_GPU`` group (``kind: KIND_GPU``, ``gpus``:
    every GPU the server can use; core r24.10 ``model_config_utils.cc``) and a ``memory_usage``
    entry of type GPU (core r24.10 ``tritonserver.cc``, model statistics).
    """
    server = triton_server(write_sample_repository(tmp_path / "models"))
    endpoint = ContainerEndpoint(server.http_url, server.grpc_url,
                                 f"127.0.0.1:{server.metrics_port}", "host")
    InferenceCheck("linear", {"INPUT": X}, {"OUTPUT": expected_linear(X)}, atol=1e-5)(endpoint)
    with pytest.raises(GpuPlacementError) as refused:
        check_ran_on_gpus(endpoint, ["linear"])
    assert "linear ran 6 inferences, none on a GPU" in str(refused.value)
    assert "loaded instance groups: KIND_CPU" in str(refused.value)
    statistics, metrics, groups, memory = read_placement_evidence(endpoint, ["linear"])
    assert groups == {"linear": [("KIND_CPU", ())]} and memory == {}
    assert not any(device != "cpu" for device in metrics["linear"])

    placed = {"linear": loaded_instance_groups({"instance_group": [
        {"name": "linear_0", "kind": "KIND_GPU", "count": 1, "gpus": [0]}]})}
    verdict = placement_verdict(["linear"], statistics, metrics, placed,
                                {"linear": {"0": 52428800}})
    assert verdict.evidence == {"linear": INSTANCE_EVIDENCE}
    assert "linear ran 6 inferences on instances Triton placed on GPU 0" in verdict.detail
    assert "no gpu_uuid" in verdict.detail and "50.0 MiB of GPU 0 in use" in verdict.detail


@pytest.fixture(scope="module")
def gpu_repository(tmp_path_factory):
    """The sample repository with ``linear`` placed as on a GPU release (``KIND_GPU``)."""
    root = write_sample_repository(tmp_path_factory.mktemp("gpu-verify") / "models")
    config = read_config(root / "linear")
    del config.instance_group[:]
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_GPU)
    write_config(config, root / "linear")
    assert gpu_models(root) == ["linear"]
    return root


@pytest.mark.slow
def test_without_an_nvidia_runtime_gpu_models_are_verified_on_the_cpu_and_said_so(
        docker_client, cpu_base_image, gpu_repository, tmp_path):
    check = InferenceCheck("linear", {"INPUT": X}, {"OUTPUT": expected_linear(X)}, atol=1e-5)
    log: list[str] = []
    reference = "triton-builder-test/i12-gpu-verify:1"
    result = build_image_from_repository(gpu_repository, image_name=reference, checks=[check],
                                         client=docker_client, on_log=log.append)
    try:
        placement = result.verification.gpu_placement
        assert placement.models == ("linear",) and placement.exercised is False
        assert "GPU placement was not exercised" in placement.detail
        assert any("GPU placement was not exercised" in line for line in log)

        # without the CPU configs the same image cannot load its KIND_GPU model here
        with pytest.raises(VerificationError) as refused:
            verify_image(docker_client, result.id, [check], timeout=60)
        assert "has kind KIND_GPU but no GPUs are available" in str(refused.value)

        # with them, the real server's accounting shows the model ran, and on no GPU
        mounts = cpu_config_mounts(gpu_repository, ["linear"], tmp_path, "/models")
        with ServingContainer(docker_client, result.id, gpus=False, volumes=mounts) as endpoint:
            check(endpoint)
            with urllib.request.urlopen(f"http://{endpoint.metrics_url}/metrics") as response:
                counts = gpu_inference_counts(response.read().decode())
            assert counts["linear"] == {"cpu": 2 * len(X)}  # gRPC and HTTP
            with pytest.raises(GpuPlacementError, match="linear ran 6 inferences, none on a GPU"):
                check_ran_on_gpus(endpoint, ["linear"])
    finally:
        for tag in result.tags:
            try:
                docker_client.images.remove(tag, force=True)
            except docker.errors.ImageNotFound:
                pass


def test_placement_evidence_read_at_ready_waits_for_the_metrics_endpoint_to_listen():
    """Triton starts its metrics endpoint after the HTTP one: read at ready (the baseline),
    the metrics port may still refuse. Real sockets: the HTTP endpoint answers at once, the
    metrics one begins to listen 0.3 s later."""
    import http.server
    import json
    import socket
    import threading
    import time

    class Answers(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = (TRITON_GPU_METRICS if self.path == "/metrics" else json.dumps(
                {"model_stats": [{"name": "linear", "inference_count": 65}]}
                if self.path == "/v2/models/stats" else {"instance_group": []})).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    http_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    with socket.socket() as probe:  # a free port nothing listens on yet
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    servers = [http_server]

    def listen_later():
        time.sleep(0.3)
        servers.append(http.server.ThreadingHTTPServer(("127.0.0.1", metrics_port), Answers))
        servers[-1].serve_forever()

    threading.Thread(target=http_server.serve_forever, daemon=True).start()
    threading.Thread(target=listen_later, daemon=True).start()
    try:
        endpoint = ContainerEndpoint(f"127.0.0.1:{http_server.server_port}", "unused:0",
                                     f"127.0.0.1:{metrics_port}", "host")
        statistics, metrics, _, _ = read_placement_evidence(endpoint, ["linear"], timeout=5)
        assert statistics == {"linear": 65}
        assert metrics["linear"] == {"GPU-4ad3f0a5-6f1d-2b1c-9e8b-1f0c2a7d9e11": 3.0}
    finally:
        for server in servers:  # the metrics one is among them once the read returned
            server.shutdown()
