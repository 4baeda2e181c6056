"""``triton-builder`` as users run it: the installed console script, in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import InferenceServerClient

from builder.tritonserver.host_process import free_ports
from pipelines import text_embedding
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
PIPELINE = "pipelines/text_embedding.py:pipeline"


def cli(*args: str, env: dict | None = None, check: bool = True,
        timeout: float = 600) -> subprocess.CompletedProcess:
    program = shutil.which("triton-builder", path=str(Path(sys.executable).parent)) or (
        shutil.which("triton-builder"))
    assert program, "the triton-builder console script is not installed"
    result = subprocess.run([program, *args], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, **(env or {})}, timeout=timeout)
    if check:
        assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stderr}"
    return result


def test_help_lists_every_command_with_examples():
    result = cli("--help")
    for command in ("build", "image", "push", "serve", "infer", "inspect", "doctor", "base"):
        assert command in result.stdout
    assert "Example: triton-builder image" in cli("image", "--help").stdout
    # help text is printed as written: rich took "[default: ...]" for markup and dropped it
    assert "[default: triton-builder/debian-" in cli("base", "os", "--help").stdout


@pytest.mark.parametrize("reference, message", [
    ("pipelines/text_embedding.py", "is not 'file.py:attr' or 'module:attr'"),
    ("pipelines/nothing_here.py:pipeline", "no such pipeline file: pipelines/nothing_here.py"),
    ("pipelines/text_embedding.py:nope", "pipelines.text_embedding has no attribute 'nope'"),
    ("pipelines/text_embedding.py:Tokenizer", "is a type, not a finished pipeline"),
])
def test_bad_pipeline_reference_is_a_usage_error(reference, message, tmp_path):
    result = cli("build", reference, "--model-root", str(tmp_path / "models"), check=False)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "models").exists()


def test_doctor_reports_a_missing_engine_clearly():
    port = free_ports(1)[0]
    result = cli("doctor", env={"DOCKER_HOST": f"tcp://127.0.0.1:{port}"}, check=False)
    assert result.returncode == 3
    assert "fail docker engine: no Docker engine answers" in result.stderr
    assert "start dockerd" in result.stderr


def test_docker_host_at_a_missing_socket_fails_at_once_naming_it(tmp_path):
    """No second dockerd, no 60 s wait: the error names DOCKER_HOST (and took
    ``elapsed`` seconds, printed for the record, not asserted)."""
    from builder.engine.daemon import running_dockerd

    before = running_dockerd()
    socket = tmp_path / "nothing-here.sock"
    started = time.monotonic()
    result = cli("inspect", "any:1", env={"DOCKER_HOST": f"unix://{socket}"}, check=False)
    print(f"elapsed {time.monotonic() - started:.2f}s")
    assert result.returncode == 3
    assert f"DOCKER_HOST=unix://{socket}" in result.stderr and "does not exist" in result.stderr
    assert running_dockerd() == before, "a dockerd was started although DOCKER_HOST names one"


@pytest.mark.parametrize("options, message", [
    (["-t", "Not A Name"], "not a valid image reference"),
    (["-t", "tb-i14/ok:1", "-t", "bad tag!"], "not a valid image reference"),
    (["-t", "tb-i14/ok:1", "--env", "envs/no-such-spec.txt"],
     "'envs/no-such-spec.txt' does not exist"),
    (["-t", "tb-i14/ok:1", "--parallelism", "0"], "'--parallelism'"),
    (["-t", "tb-i14/ok:1", "--platform", "linux/amd64", "--platform", "linux/s390x"],
     "unknown platform 'linux/s390x': images are built for linux/amd64, linux/arm64"),
    (["-t", "tb-i14/ok:1", "--platform", "linux/amd64", "--no-verify-platform", "linux/arm/v7"],
     "unknown platform 'linux/arm/v7'"),
])
def test_bad_image_options_are_usage_errors_before_any_step(options, message, docker_client):
    result = cli("image", PIPELINE, *options, check=False)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    for step in ("> base image", "> model repository", "> python environment"):
        assert step not in result.stderr


def test_bad_input_syntax_is_a_usage_error():
    result = cli("infer", "grpc://127.0.0.1:1/pipeline", "-i", "no-equals-sign", check=False)
    assert result.returncode == 2
    assert "expected name=value" in result.stderr


def test_build_writes_the_repository(tmp_path):
    result = cli("build", PIPELINE, "--model-root", str(tmp_path / "models"))
    root = Path(result.stdout.strip())
    assert (root / "pipeline" / "config.pbtxt").exists()
    assert (root / "text_encoder" / "1" / "model.onnx").exists()
    assert "model 'text_encoder': onnx" in result.stderr


def test_build_takes_the_request_limit_in_mib(tmp_path):
    from builder.repository.model_config import read_config

    cli("build", PIPELINE, "--model-root", str(tmp_path / "models"), "--max-request-mb", "2.5")
    config = read_config(tmp_path / "models" / "pipeline")
    assert config.parameters["max_request_bytes"].string_value == str(5 * 1024 * 1024 // 2)


def test_build_for_a_cuda_release_places_the_model_on_the_gpus(tmp_path):
    from tritonclient.grpc import model_config_pb2 as mc

    from builder.repository.model_config import read_config

    root = Path(cli("build", PIPELINE, "--model-root", str(tmp_path / "models"),
                    "--cuda", "12.4").stdout.strip())
    assert read_config(root / "text_encoder").instance_group[0].kind == (
        mc.ModelInstanceGroup.KIND_GPU)
    assert read_config(root / "pipeline").instance_group[0].kind == (
        mc.ModelInstanceGroup.KIND_CPU)
    bad = cli("build", PIPELINE, "--model-root", str(tmp_path / "other"), "--cuda", "10.2",
              check=False)
    assert bad.returncode == 2 and "no nvcr.io/nvidia/tritonserver release" in bad.stderr


@pytest.mark.slow
def test_image_serve_infer_inspect_push(docker_client, cpu_base_image, registry):
    reference = f"{registry.host}/cli/text-embedding:1"
    options = ("--tag", reference, "--parallelism", "2")
    assert cli("image", PIPELINE, *options).stdout.strip() == reference
    first = docker_client.images.get(reference).id
    again = cli("image", PIPELINE, *options)  # a new process: nothing to build
    assert again.stdout.strip() == reference and f"up to date {reference}" in again.stderr
    assert docker_client.images.get(reference).id == first
    http, grpc, metrics = free_ports(3)
    container = cli("serve", reference, "--detach", "--http-port", str(http), "--grpc-port",
                    str(grpc), "--metrics-port", str(metrics)).stdout.strip()
    try:
        for url in (f"grpc://127.0.0.1:{grpc}/pipeline", f"http://127.0.0.1:{http}/pipeline"):
            served = json.loads(cli("infer", url, "-i", "text=hello from the cli").stdout)
            np.testing.assert_allclose(served, text_embedding.pipeline("hello from the cli"),
                                       atol=1e-4)
        raw = json.loads(cli("infer", f"grpc://127.0.0.1:{grpc}/text_encoder",
                             "-i", f"ids={[[1, 2] + [0] * 14]}",
                             "-i", f"mask={[[1.0, 1.0] + [0.0] * 14]}").stdout)
        assert np.asarray(raw["output_0"]).shape == (1, 16, 32)
        config = InferenceServerClient(f"127.0.0.1:{grpc}").get_model_config("pipeline").config
        assert [group.count for group in config.instance_group] == [2]
    finally:
        docker_client.containers.get(container).remove(force=True)

    labels = json.loads(cli("inspect", reference).stdout)
    pipeline = labels["ai.triton-builder.signature"]["pipelines"]["pipeline"]
    assert pipeline["inputs"]["text"]["dtype"] == "TYPE_STRING"
    assert pipeline["outputs"]["vec"]["dims"] == [32]
    assert labels["ai.triton-builder.triton-version"] == "2.51.0"

    pinned = cli("push", reference).stdout.strip()
    assert pinned.startswith(f"{registry.host}/cli/text-embedding@sha256:")
    docker_client.images.remove(reference, force=True)


def test_deploy_k8s_writes_validated_manifests(tmp_path):
    import yaml

    target = tmp_path / "triton.yaml"
    result = cli("deploy", "k8s", "registry.example:5000/embed:2", "--cpu", "-o", str(target))
    assert "validated 3 manifest(s) against Kubernetes 1.29" in result.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(target.read_text())]
    assert kinds == ["Deployment", "Service", "HorizontalPodAutoscaler"]
    kserve = cli("deploy", "k8s", "registry.example:5000/embed:2", "--gpu", "--kserve")
    (service,) = list(yaml.safe_load_all(kserve.stdout))
    predictor = service["spec"]["predictor"]["containers"][0]
    assert service["kind"] == "InferenceService"
    assert predictor["resources"]["limits"]["nvidia.com/gpu"] == 1
    bad = cli("deploy", "k8s", "registry.example:5000/embed:2", "--name", "Bad_Name",
              check=False)
    assert bad.returncode == 2 and "DNS label" in bad.stderr


def test_deploy_swarm_dry_run_prints_the_stack_and_refuses_bad_options():
    import yaml

    result = cli("deploy", "swarm", "registry.example:5000/embed:2", "--replicas", "3",
                 "--update-delay", "1", "--dry-run")
    stack = yaml.safe_load(result.stdout)
    assert stack["services"]["triton"]["deploy"]["replicas"] == 3
    assert stack["services"]["triton"]["deploy"]["update_config"]["delay"] == "1s"
    bad = cli("deploy", "swarm", "registry.example:5000/embed:2", "--replicas", "0",
              "--dry-run", check=False)
    assert bad.returncode == 2 and "replicas must be a positive integer" in bad.stderr


def test_deploy_swarm_on_an_engine_outside_a_swarm_says_what_to_run(docker_client):
    if (docker_client.info().get("Swarm") or {}).get("LocalNodeState") == "active":
        pytest.skip("this engine is in a swarm now")
    result = cli("deploy", "swarm", "registry.example:5000/embed:2", check=False)
    assert result.returncode == 1 and "docker swarm init" in result.stderr


def test_no_bridge_is_refused_before_any_step_with_the_alternatives(docker_client):
    result = cli("image", PIPELINE, "-t", "tb-i11/no-bridge:1", "--cuda", "11.8", "--no-bridge",
                 check=False)
    assert result.returncode == 2, result.stderr
    assert "the bridge is turned off" in result.stderr
    assert "through the bridge on" in result.stderr.replace("\n", " ")
    for step in ("> base image", "> model repository", "> python environment"):
        assert step not in result.stderr


MISSING_ENGINE = "/tmp/[red]no-engine-here[/red].sock"
"""A socket path that rich would read as markup, for the commands that need an engine."""

ERROR_PATHS = {
    "build: no such file": (
        ["build", "pipelines/[red]none[/red].py:pipeline"], {}, 2,
        "no such pipeline file: pipelines/[red]none[/red].py"),
    "image: no engine": (["image", PIPELINE, "-t", "tb-cli/x:1"], "engine", 3, MISSING_ENGINE),
    "push: no engine": (["push", "localhost:5000/tb-cli/x:1"], "engine", 3, MISSING_ENGINE),
    "serve: no engine": (["serve", "tb-cli/x:1"], "engine", 3, MISSING_ENGINE),
    "infer: nothing listening": (["infer", "http://[::1]:1/pipeline", "-i", "text=x"], {}, 1,
                                 "http://[::1]:1/v2/models/pipeline: ConnectionRefusedError: "
                                 "[Errno 111] Connection refused"),
    "infer: bad URL": (["infer", "grpc://127.0.0.1:1/[bold]pipeline[/bold]", "-i", "text=x"],
                       {}, 2, "'grpc://127.0.0.1:1/[bold]pipeline[/bold]'"),
    "infer: bad input": (["infer", "grpc://127.0.0.1:1/pipeline", "-i", "[red]x"], {}, 2,
                         "--input '[red]x': expected name=value"),
    "inspect: no engine": (["inspect", "tb-cli/x:1"], "engine", 3, MISSING_ENGINE),
    "doctor: bad CUDA version": (["doctor", "--cuda", "[red]9"], {}, 2, "'[red]9'"),
    "base os: no engine": (["base", "os"], "engine", 3, MISSING_ENGINE),
    "base cpu: no engine": (["base", "cpu"], "engine", 3, MISSING_ENGINE),
    "deploy swarm: no engine": (["deploy", "swarm", "tb-cli/x:1"], "engine", 3, MISSING_ENGINE),
    "deploy swarm: bad option": (
        ["deploy", "swarm", "tb-cli/x:1", "--dry-run", "--publish", "[red]x"], {}, 2,
        "not '[red]x'"),
    "deploy k8s: bad name": (["deploy", "k8s", "tb-cli/x:1", "--cpu", "--name", "[red]bad"],
                             {}, 2, "'[red]bad'"),
    "usage: unknown option": (["build", "--[red]x"], {}, 2, "No such option: --[red]x"),
    "usage: missing argument": (["image"], {}, 2, "Missing argument"),
}


@pytest.mark.parametrize("case", sorted(ERROR_PATHS))
def test_every_command_prints_its_error_literally_on_one_line(case):
    """Issue 33: rich read ``[batch, 8]`` in a message as markup and printed nothing of it;
    ``infer`` with nothing listening printed a 79-line traceback. Every command's error is the
    last line of standard error, begins with ``error``, holds its cause as written, and the
    exit code is the documented one."""
    arguments, environment, code, literal = ERROR_PATHS[case]
    if environment == "engine":
        environment = {"DOCKER_HOST": f"unix://{MISSING_ENGINE}"}
    result = cli(*arguments, env=environment, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in lines if line.startswith("error")]
    assert errors == lines[-1:], result.stderr
    assert literal in errors[0], result.stderr


def test_a_pipeline_refused_for_its_batch_axis_says_so_literally(tmp_path):
    """The message names the shapes in brackets: printed as they are, one line, exit 2."""
    from tests.support.readme import first_image_file

    filename, code = first_image_file()
    batched = code.replace('example_inputs=tokenize("hello")',
                           'example_inputs=[a[None] for a in tokenize("hello")]')
    assert batched != code
    (tmp_path / filename).write_text(batched)
    result = cli("build", f"{tmp_path / filename}:pipeline", "--model-root",
                 str(tmp_path / "models"), check=False)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error building the repository: ")
    assert ("input 'ids' is [8] in this row, but example_inputs give one row as [1, 8]"
            in last), result.stderr
    assert not (tmp_path / "models").exists()
