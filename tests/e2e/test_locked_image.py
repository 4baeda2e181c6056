"""Locked by default: a client of a served image reaches inference, health and metadata only.

The attacks measured on the images before they were locked, each over HTTP and gRPC, on the
example's real image (Triton 2.51, the CPU base): load a model with an uploaded ``model.py``
(code that would run in the container), unload the pipeline, reload it with another
configuration, point the server's log or trace at a file, register a shared memory region of the
client's choosing. Each was accepted then (the uploaded code ran and wrote ``/tmp/pwned``); each
must be refused now, while inference answers as in process and a killed stub still heals (the
supervisor reloads with the key only it knows). With the operator's own key
(``TRITON_BUILDER_ADMIN_KEY``) the same APIs work for the operator.

Triton's answer to a restricted gRPC call is ``UNAVAILABLE`` ("This protocol is restricted,
expecting header ..."; ``src/grpc/grpc_server.cc`` from r23.04 to today), not
``PERMISSION_DENIED``: the test holds Triton to what it sends, and the README says so. HTTP
answers 403.

Also here: the image runs as an unprivileged user and serves under ``docker run --read-only
--tmpfs /tmp`` (Docker mounts that tmpfs ``noexec``); and the command a release without
restricted APIs gets (22.12, 23.07: no explicit model control) heals a killed stub by
restarting the server.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from builder.client.pipeline import Client
from builder.runtime.supervisor import (
    ADMIN_KEY_HEADER,
    ADMIN_KEY_VARIABLE,
    GATE_MODEL,
    GRPC_ADMIN_KEY_HEADER,
)
from builder.verify.container import ServingContainer
from builder.verify.equality import check_same
from tests.e2e.test_reliability import KILL_PIPELINE_STUB, _metric
from tests.support.example_inputs import EXAMPLES

pytestmark = pytest.mark.slow

EVIL_MODEL = (b"open('/tmp/pwned', 'w').write('uploaded code ran')\n"
              b"class TritonPythonModel:\n"
              b"    def execute(self, requests):\n"
              b"        return []\n")
EVIL_CONFIG = {"name": "evil", "backend": "python", "max_batch_size": 0,
               "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [1]}],
               "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}]}
OVERRIDE = {"name": "pipeline", "backend": "python", "max_batch_size": 1}
OPERATOR_KEY = "operator-key-0123456789abcdef"
SERVER_COMMAND_LINE = (
    "import os\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    if open(f'/proc/{pid}/comm').read().strip() == 'tritonserver':\n"
    "        print(open(f'/proc/{pid}/cmdline').read().replace('\\0', ' '))\n")
"""Prints the server's command line (run inside the container, as its user)."""


def _http(url: str, path: str, body: dict | None = None,
          headers: dict[str, str] | None = None) -> int:
    """The status of one request (POST when there is a body)."""
    request = urllib.request.Request(
        f"http://{url}{path}", data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "POST",
        headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


HTTP_ATTACKS = {
    "load with an uploaded model.py": (
        "/v2/repository/models/evil/load",
        {"parameters": {"config": json.dumps(EVIL_CONFIG),
                        "file:1/model.py": base64.b64encode(EVIL_MODEL).decode()}}),
    "unload the pipeline": ("/v2/repository/models/pipeline/unload", {}),
    "reload the pipeline with another config": (
        "/v2/repository/models/pipeline/load", {"parameters": {"config": json.dumps(OVERRIDE)}}),
    "log to a file": ("/v2/logging", {"log_file": "/tmp/attack.log"}),
    "trace to a file": ("/v2/trace/setting", {"trace_file": "/tmp/attack.trace",
                                              "trace_level": ["TIMESTAMPS"]}),
    "trace one model to a file": ("/v2/models/pipeline/trace/setting",
                                  {"trace_file": "/tmp/attack.trace"}),
    "register a shared memory region": ("/v2/systemsharedmemory/region/attack/register",
                                        {"key": "/attack", "offset": 0, "byte_size": 64}),
    "list the repository": ("/v2/repository/index", {}),
}


def _grpc_attacks(client: grpcclient.InferenceServerClient, headers: dict[str, str] | None):
    return {
        "load with an uploaded model.py": lambda: client.load_model(
            "evil", config=json.dumps(EVIL_CONFIG), files={"file:1/model.py": EVIL_MODEL},
            headers=headers),
        "unload the pipeline": lambda: client.unload_model("pipeline", headers=headers),
        "reload the pipeline with another config": lambda: client.load_model(
            "pipeline", config=json.dumps(OVERRIDE), headers=headers),
        "log to a file": lambda: client.update_log_settings({"log_file": "/tmp/attack.log"},
                                                           headers=headers),
        "trace to a file": lambda: client.update_trace_settings(
            settings={"trace_file": "/tmp/attack.trace", "trace_level": ["TIMESTAMPS"]},
            headers=headers),
        "register a shared memory region": lambda: client.register_system_shared_memory(
            "attack", "/attack", 64, headers=headers),
        "list the repository": lambda: client.get_model_repository_index(headers=headers),
    }


def _answers_as_in_process(endpoint) -> None:
    pipeline, inputs = EXAMPLES["text_embedding"]
    with Client(f"grpc://{endpoint.grpc_url}/pipeline") as served:
        for text in inputs[:4]:
            check_same(served(text), pipeline(text), where=repr(text))


def _wait_for(probe, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = probe()
        except Exception:  # noqa: BLE001 - not yet
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.mark.alongside  # its own container; its waits are bounds, not measurements
def test_every_administrative_api_is_refused_over_http_and_grpc(docker_client,
                                                                text_embedding_image):
    with ServingContainer(docker_client, text_embedding_image) as endpoint:
        container = docker_client.containers.get(endpoint.container_id)
        accepted = {what: status for what, (path, body) in HTTP_ATTACKS.items()
                    if (status := _http(endpoint.http_url, path, body)) != 403}
        assert not accepted, f"HTTP attacks not refused with 403: {accepted}"
        with grpcclient.InferenceServerClient(endpoint.grpc_url) as client:
            answers = {}
            for what, attack in _grpc_attacks(client, None).items():
                try:
                    attack()
                    answers[what] = "accepted"
                except InferenceServerException as error:
                    if error.status() != "StatusCode.UNAVAILABLE" or \
                            "This protocol is restricted" not in error.message():
                        answers[what] = f"{error.status()}: {error.message()}"
            assert not answers, f"gRPC attacks not refused as restricted: {answers}"
            assert client.is_model_ready("pipeline") and client.is_model_ready("text_encoder")
            assert not client.is_model_ready("evil")
        ran = container.exec_run(["sh", "-c", "ls /tmp/pwned /tmp/attack.log /tmp/attack.trace "
                                  "/dev/shm/attack 2>/dev/null"])
        assert ran.output == b"", f"the attacks left files: {ran.output.decode()}"
        _answers_as_in_process(endpoint)

        # healing still works: the supervisor reloads with the key only it holds
        before = _metric(container, "triton_builder_stub_restarts_total").get("pipeline", 0)
        killed = container.exec_run(["python3", "-c", KILL_PIPELINE_STUB]).output.split()
        assert killed, "no pipeline stub to kill"
        _wait_for(lambda: _metric(container, "triton_builder_stub_restarts_total").get(
            "pipeline", 0) > before, 60, "the supervisor's reload of the pipeline")
        _wait_for(lambda: _answers_as_in_process(endpoint) is None, 30,
                  "the healed pipeline's answers")

        whoami = container.exec_run(["id", "-u"]).output.decode().strip()
        assert whoami == "1000", f"the image runs as uid {whoami}"
        server = container.exec_run(["python3", "-c", SERVER_COMMAND_LINE]).output.decode()
        key = server.split(f"{ADMIN_KEY_HEADER}=")[1].split()[0]
        assert len(key) >= 32 and key not in container.logs().decode(), \
            "the generated key is printed"


@pytest.mark.alongside  # its own container; its waits are bounds, not measurements
def test_the_operators_key_opens_the_locked_apis(docker_client, text_embedding_image):
    with ServingContainer(docker_client, text_embedding_image,
                          environment={ADMIN_KEY_VARIABLE: OPERATOR_KEY}) as endpoint:
        keyed = {ADMIN_KEY_HEADER: OPERATOR_KEY}
        assert _http(endpoint.http_url, "/v2/repository/index", {}) == 403, "no key, no index"
        assert _http(endpoint.http_url, "/v2/repository/index", {}, keyed) == 200
        assert _http(endpoint.http_url, "/v2/logging", {"log_verbose_level": 0}, keyed) == 200
        assert _http(endpoint.http_url, "/v2/repository/models/text_encoder/unload", {},
                     keyed) == 200
        assert _http(endpoint.http_url, "/v2/models/text_encoder/ready") != 200
        assert _http(endpoint.http_url, "/v2/repository/models/text_encoder/load", {},
                     keyed) == 200
        with grpcclient.InferenceServerClient(endpoint.grpc_url) as client:
            headers = {GRPC_ADMIN_KEY_HEADER: OPERATOR_KEY}
            index = client.get_model_repository_index(as_json=True, headers=headers)
            assert {m["name"]: m["state"] for m in index["models"]} == {
                "pipeline": "READY", "text_encoder": "READY", GATE_MODEL: "UNAVAILABLE"}
            client.update_log_settings({"log_verbose_level": 0}, headers=headers)
            with pytest.raises(InferenceServerException, match="This protocol is restricted"):
                client.get_model_repository_index(headers={GRPC_ADMIN_KEY_HEADER: "wrong" * 4})
        _answers_as_in_process(endpoint)


@pytest.mark.alongside  # its own container; its waits are bounds, not measurements
def test_a_read_only_container_serves_the_pipeline(docker_client, text_embedding_image):
    """``docker run --read-only --tmpfs /tmp IMAGE``: nothing but ``/tmp`` (noexec, as Docker
    mounts it) and ``/dev/shm`` is writable, and the pipeline answers as in process."""
    with ServingContainer(docker_client, text_embedding_image, read_only=True,
                          tmpfs={"/tmp": ""}) as endpoint:
        container = docker_client.containers.get(endpoint.container_id)
        mounts = container.exec_run(["cat", "/proc/mounts"]).output.decode().splitlines()
        assert any(line.split()[1] == "/" and "ro" in line.split()[3].split(",")
                   for line in mounts), "the root file system is writable"
        tmp = next(line.split()[3].split(",") for line in mounts if line.split()[1] == "/tmp")
        assert "noexec" in tmp, tmp
        _answers_as_in_process(endpoint)


def test_without_explicit_model_control_a_killed_stub_heals_by_a_server_restart(
        docker_client, text_embedding_image):
    """The command of an image whose Triton cannot lock its repository API (22.12, 23.07): no
    explicit model control, so no client can load anything, and the supervisor heals a killed
    stub by starting the server again in place."""
    from builder.base.releases import resolve
    from builder.image.serving_dockerfile import ServingOptions

    command = ServingOptions().command(resolve("11.8"))
    assert "--lock-admin-apis" not in command and "--model-control-mode=explicit" not in command
    with ServingContainer(docker_client, text_embedding_image, command=command) as endpoint:
        container = docker_client.containers.get(endpoint.container_id)
        path, body = HTTP_ATTACKS["load with an uploaded model.py"]
        assert _http(endpoint.http_url, path, body) == 503  # "not allowed" without explicit
        assert container.exec_run(["test", "-e", "/tmp/pwned"]).exit_code != 0
        killed = container.exec_run(["python3", "-c", KILL_PIPELINE_STUB]).output.split()
        assert killed, "no pipeline stub to kill"
        _wait_for(lambda: _metric(container, "triton_builder_server_restarts_total").get("", 0)
                  >= 1, 60, "the server restart")
        _wait_for(lambda: _answers_as_in_process(endpoint) is None, 90,
                  "the restarted server's answers")
        assert _metric(container, "triton_builder_stub_restarts_total").get("pipeline") == 1
        assert "restarting the server to heal it" in container.logs().decode()
