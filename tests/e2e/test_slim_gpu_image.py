"""The slim GPU route end to end, on this machine: no NGC image, no GPU.

The text-embedding example (its encoder an ONNX model operator) is built with ``--cuda 12.6
--slim`` by the command line, from a clean state as on a fresh machine: an empty
``TRITON_BUILDER_CACHE`` and an empty pip cache of this run's own, so every CUDA wheel
(onnxruntime-gpu, cuBLAS, cuDNN, cuFFT, cuRAND, the runtime: about 1.7 GB) comes from the
package index; the second clean build reads the same files from that pip cache (hash-checked
against the index's, as any download), so a run downloads them once. Both builds date
their files ``SOURCE_DATE_EPOCH`` = :data:`BUILD_DATE` (an input like any other), so that no
payload cached by another build of the example (at the default date) is found by its tag; the
engine's own layer cache ignores file dates, so on a machine where such a build left its layers
the second build's check for cached layers fails (CI's machines are fresh). The build verifies
the image against the in-process pipeline over gRPC and HTTP; with no GPU here the operator's
``KIND_GPU`` config is swapped for ``KIND_CPU`` in the verification container (onnxruntime-gpu
runs on the CPU too) and the build says that placement was not exercised. What a GPU adds —
the CUDA provider on a device — is the GPU tier's (``tests/gpu``).

What this module does check without a GPU: the bill of materials names the CUDA wheels with
their hashes; the image is what the NVIDIA container runtime reads; the check a ``KIND_GPU``
ONNX instance runs before its session finds every CUDA library in the image's environment and
names what is missing (the driver's ``libcuda.so.1`` here, or a library hidden from it); the
deployment manifests request GPUs; and a second clean build (another process, cache, umask,
hash seed, the first build's images removed) gives the same image ID.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from builder.base.gpu_slim import SLIM_SERVER_CUDA
from builder.environment.lock import read_lock
from tests.support.engine_images import image_ids, remove_images_made
from tests.support.paths import REPO_ROOT
from tests.unit.cli.test_commands import cli

pytestmark = [pytest.mark.slow, pytest.mark.alongside]

PIPELINE = f"{REPO_ROOT / 'pipelines' / 'text_embedding.py'}:pipeline"
REFERENCE = "triton-builder-test/slim-gpu-text-embedding:12.6"
CUDA_WHEELS = ("cuda-toolkit", "nvidia-cublas-cu12", "nvidia-cuda-runtime-cu12",
               "nvidia-cudnn-cu12", "nvidia-cufft-cu12", "nvidia-curand-cu12", "onnxruntime-gpu")
ENVIRONMENT = "/models/pipeline/environment"
SITE = f"{ENVIRONMENT}/lib/python3.11/site-packages"
BUILD_DATE = "1764028800"
"""2025-11-25T00:00:00Z."""


def _build(workdir: Path, *extra: str, umask: int, seed: str,
           pip_cache: Path) -> tuple[str, float, dict]:
    """One ``triton-builder image --cuda 12.6 --slim`` as on a fresh machine: its log, seconds
    and what its environment cache says of the environment it made."""
    (workdir / "cache").mkdir(parents=True)
    environment = {key: value for key, value in os.environ.items()  # after base os: found
                   if not key.startswith("TRITON_BUILDER_OS_IMAGE")}
    environment.update(TRITON_BUILDER_CACHE=str(workdir / "cache"), PIP_CACHE_DIR=str(pip_cache),
                       PYTHONHASHSEED=seed, SOURCE_DATE_EPOCH=BUILD_DATE)
    environment.pop("PIP_NO_CACHE_DIR", None)
    program = Path(sys.executable).parent / "triton-builder"
    started = time.monotonic()
    result = subprocess.run([str(program), "image", PIPELINE, "-t", REFERENCE, "--cuda", "12.6",
                             "--slim", *extra], cwd=workdir, env=environment,
                            capture_output=True, text=True,
                            preexec_fn=lambda: os.umask(umask), timeout=1800)
    seconds = time.monotonic() - started
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    (made,) = (workdir / "cache" / "environments").glob("*/environment.json")
    return result.stdout + result.stderr, seconds, json.loads(made.read_text())


@pytest.fixture(scope="module")
def slim_build(docker_client, slim_base_image, os_image, tmp_path_factory):
    before = image_ids(docker_client)
    pip_cache = tmp_path_factory.mktemp("pip-cache")
    log, seconds, environment = _build(tmp_path_factory.mktemp("machine-0"),
                                       umask=0o022, seed="1", pip_cache=pip_cache)
    steps = ", ".join(f"{step} {s:.1f} s" for step, s in environment["steps"].items())
    print(f"\nslim GPU build from a clean state: {seconds:.0f} s; its environment: {steps}; "
          f"{environment['downloaded_bytes'] / 1e9:.2f} GB of wheels from the package index")
    yield {"log": log, "id": docker_client.images.get(REFERENCE).id, "seconds": seconds,
           "pip_cache": pip_cache,
           "environment": environment, "clean": lambda: remove_images_made(
               docker_client, before, (REFERENCE,))}
    remove_images_made(docker_client, before, (REFERENCE,))


def test_the_example_is_built_from_a_clean_state_and_verified_against_the_pipeline(
        slim_build, docker_client):
    log, environment = slim_build["log"], slim_build["environment"]
    assert environment["steps"]["download"] > 0 and environment["downloaded_bytes"] > 1e9
    assert environment["archive"] == "environment.tar"  # it ships unpacked: no gzip
    assert "onnxruntime-gpu for CUDA 12.6 (slim): onnxruntime-gpu[cuda,cudnn]==" in log
    assert "GPU placement was not exercised" in log and "text_encoder (KIND_GPU)" in log
    assert "(verified)" in log and "docker run --rm --gpus=all" in log
    labels = docker_client.images.get(REFERENCE).labels
    assert (labels["ai.triton-builder.cuda"], labels["ai.triton-builder.release"]) == (
        "12.6", "slim")
    assert labels["ai.triton-builder.triton-version"] == "2.51.0"


def test_the_sbom_lists_the_cuda_wheels_with_the_hashes_of_the_lock(slim_build, docker_client):
    document = json.loads(cli("inspect", REFERENCE, "--sbom").stdout)
    components = {c.get("purl", ""): c for c in document["components"]}
    locked = read_lock(docker_client.containers.run(
        REFERENCE, ["cat", "/models/pipeline/environment.lock.txt"], remove=True,
        entrypoint=[]).decode())
    names = {package.name for package in locked}
    assert set(CUDA_WHEELS) <= names, sorted(names)
    assert "onnxruntime" not in names  # the GPU build only: both install one package
    for package in locked:
        if package.name in CUDA_WHEELS or package.name.startswith("nvidia-"):
            component = components[f"pkg:pypi/{package.name}@{package.version}"]
            assert [f"sha256:{h['content']}" for h in component["hashes"]] == list(
                package.hashes) and package.hashes
    versions = {package.name: package.version for package in locked}
    assert versions["cuda-toolkit"].startswith("12.6.")
    assert versions["nvidia-cuda-runtime-cu12"].startswith("12.6.")
    assert versions["nvidia-cublas-cu12"].startswith("12.6.")
    triton = next(c for c in document["components"] if c.get("bom-ref") == "triton")
    assert {p["value"] for p in triton["properties"]} >= {"slim", "12.6", "nvidia-pytriton==0.7.0"}


def test_the_image_is_what_the_nvidia_container_runtime_reads_with_nothing_of_ngc(
        slim_build, docker_client):
    config = docker_client.images.get(REFERENCE).attrs["Config"]
    variables = dict(item.split("=", 1) for item in config["Env"])
    assert variables["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert variables["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert variables["NVIDIA_REQUIRE_CUDA"] == "cuda>=12.0"
    assert config["User"] == "1000:1000"
    found = docker_client.containers.run(REFERENCE, [
        "sh", "-c", "ls /opt/tritonserver/lib | grep libcudart; ls /usr/local/cuda 2>&1; "
                    "python3 -c 'import onnxruntime' 2>&1 | tail -1"],
        remove=True, entrypoint=[]).decode()
    assert f".so.{SLIM_SERVER_CUDA}." in found  # the server's own CUDA runtime, the wheel's
    assert "No such file or directory" in found  # no CUDA toolkit
    assert "No module named 'onnxruntime'" in found  # the system Python has none: the env has


@pytest.mark.parametrize(("hidden", "driver", "named"), [
    (None, False, None),
    (None, True, "the NVIDIA driver's libcuda.so.1 cannot be loaded"),
    (f"{SITE}/nvidia/cudnn/lib", False, "libcudnn.so.9: cannot open shared object file"),
    (f"{SITE}/nvidia/cublas/lib", False, "libcublasLt.so.12: cannot open shared object file"),
])
def test_the_backends_cuda_provider_check_run_in_the_image_names_what_is_missing(
        slim_build, docker_client, hidden, driver, named):
    """What a ``KIND_GPU`` ONNX instance runs before its session (Triton itself refuses
    ``KIND_GPU`` on a machine without GPUs, so here the check runs on its own, in the image, in
    the environment's Python): every library is there, only the driver is not; a library
    hidden by an empty tmpfs is named."""
    probe = ("import sys; sys.path.insert(0, '/opt/tritonserver/backends/onnxruntime'); "
             f"import model; print('problem:', model.cuda_provider_problem(driver={driver}))")
    output = docker_client.containers.run(
        REFERENCE, ["-c", probe], entrypoint=[f"{ENVIRONMENT}/bin/python"], remove=True,
        read_only=True, tmpfs={"/tmp": "", **({hidden: ""} if hidden else {})}).decode()
    answer = output.strip().splitlines()[-1]
    if named is None:
        assert answer == "problem: None", output
    else:
        assert named in answer, output


def test_a_killed_onnx_stub_heals_in_place_and_the_health_check_says_so(slim_build,
                                                                        docker_client, tmp_path):
    """As every image: the supervisor reloads the ONNX operator (its stub running our backend
    on the environment's onnxruntime-gpu) after its stub is killed, and the health check
    follows. Run as verification runs it here: ``KIND_CPU`` configs mounted (no GPU)."""
    from builder.client.pipeline import Client
    from builder.verify.container import ServingContainer
    from builder.verify.placement import cpu_config_mounts
    from pipelines.text_embedding import pipeline
    from tests.e2e.test_reliability import _kill, _metric

    repository = tmp_path / "repository"
    for model in ("pipeline", "text_encoder"):
        (repository / model).mkdir(parents=True)
        (repository / model / "config.pbtxt").write_bytes(docker_client.containers.run(
            REFERENCE, ["cat", f"/models/{model}/config.pbtxt"], entrypoint=[], remove=True))
    volumes = cpu_config_mounts(repository, ["text_encoder"], tmp_path / "cpu", "/models")
    with ServingContainer(docker_client, REFERENCE, volumes=volumes, read_only=True,
                          tmpfs={"/tmp": ""}) as endpoint:
        container = docker_client.containers.get(endpoint.container_id)
        assert container.exec_run(["python3", "/opt/triton-builder/health.py"]).exit_code == 0
        _kill(container, "text_encoder")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _metric(
                container, "triton_builder_stub_restarts_total").get("text_encoder"):
            time.sleep(0.5)
        assert _metric(container, "triton_builder_stub_restarts_total")["text_encoder"] >= 1
        with Client(f"grpc://{endpoint.grpc_url}/pipeline") as client:
            answer = None
            while time.monotonic() < deadline:
                try:
                    answer = client("hello world")
                    break
                except Exception:  # noqa: BLE001 - still reloading
                    time.sleep(0.5)
            np.testing.assert_allclose(answer, pipeline("hello world"), atol=1e-4)
        assert container.exec_run(["python3", "/opt/triton-builder/health.py"]).exit_code == 0


def test_the_deployment_manifests_request_gpus(slim_build, tmp_path):
    manifest = tmp_path / "triton.yaml"
    cli("deploy", "k8s", REFERENCE, "-o", str(manifest))
    assert "nvidia.com/gpu: 1" in manifest.read_text()
    stack = cli("deploy", "swarm", REFERENCE, "--dry-run").stdout
    assert "NVIDIA-GPU" in stack


def test_a_second_clean_build_gives_the_same_image_id(slim_build, docker_client, os_image,
                                                      tmp_path):
    first = slim_build["id"]
    slim_build["clean"]()
    log, seconds, environment = _build(tmp_path / "machine-1", "--no-verify",
                                       "--no-cache", umask=0o077, seed="2",
                                       pip_cache=slim_build["pip_cache"])
    print(f"\nsecond clean build (no verification): {seconds:.0f} s")
    assert environment["steps"]["download"] > 0
    cached = [line for line in log.splitlines() if "Using cache" in line or "reused" in line]
    assert not cached, f"the second build was handed cached layers: {cached}"
    assert docker_client.images.get(REFERENCE).id == first
