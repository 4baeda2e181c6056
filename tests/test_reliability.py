"""What goes wrong in production, on the real engine, registry and Triton: interrupted builds,
a registry that goes away during a push, bad requests among good ones, a load test.

Lean on purpose (CI runs it whole): one image of the text-embedding pipeline, shared by the
serving tests; the load test's size is :data:`LOAD_REQUESTS` at :data:`LOAD_CONCURRENCY`
(``TRITON_BUILDER_LOAD_REQUESTS`` raises it, e.g. to the 10,000 of a release check).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from builder.image.labels import OCI

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
PIPELINE = "pipelines/text_embedding.py:pipeline"


def _images_titled(client, title: str) -> list:
    return client.images.list(all=True, filters={"label": f"{OCI}title={title}"})


def test_interrupted_build_leaves_no_tag_and_no_image(docker_client, cpu_base_image):
    """Ctrl-C (SIGINT) while the new image is being verified: the CLI stops, the verification
    container and the untagged image are removed, no tag was set."""
    title = f"tb-i14-interrupted-{uuid.uuid4().hex[:8]}"
    reference = f"triton-builder-test/{title}:1"
    program = Path(sys.executable).parent / "triton-builder"
    process = subprocess.Popen([str(program), "image", PIPELINE, "-t", reference], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        verifying = []
        while not verifying and process.poll() is None and time.monotonic() < deadline:
            verifying = [c for c in docker_client.containers.list()
                         if c.image.labels.get(f"{OCI}title") == title]
            time.sleep(0.2)
        assert verifying, f"no verification container appeared:\n{process.stderr.read()}"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0, stderr
    assert _images_titled(docker_client, title) == [], "the interrupted build left its image"
    with pytest.raises(Exception, match="No such image|not found"):
        docker_client.images.get(reference)
    assert not [c for c in docker_client.containers.list(all=True)
                if c.id == verifying[0].id], "the verification container was left behind"


def _env_flag(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


# -- a served image under stress --------------------------------------------------------------
HEALTH_INTERVAL_S, HEALTH_RETRIES = 2, 3


@pytest.fixture(scope="module")
def served_image(docker_client, cpu_base_image) -> str:
    from builder import build_docker_image
    from pipelines.text_embedding import pipeline

    reference = "triton-builder-test/tb-i14-reliability:1"
    build_docker_image(pipeline, reference, client=docker_client)
    return reference


def _fast_healthcheck(client, image: str) -> dict:
    """The image's own health check command, run every HEALTH_INTERVAL_S instead of 15 s."""
    test = client.images.get(image).attrs["Config"]["Healthcheck"]["Test"]
    return {"test": test, "interval": HEALTH_INTERVAL_S * 10**9, "timeout": 5 * 10**9,
            "retries": HEALTH_RETRIES, "start_period": 60 * 10**9}


def _health(container) -> str:
    container.reload()
    return container.attrs["State"]["Health"]["Status"]


KILL_PIPELINE_STUB = (
    "import os, signal\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    cmd = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
    "    if cmd[0].endswith(b'triton_python_backend_stub') and b'/pipeline/' in cmd[1]:\n"
    "        os.kill(int(pid), signal.SIGKILL); print(pid)\n"
)


def test_a_dead_stub_turns_the_container_unhealthy(docker_client, served_image):
    """Kill the pipeline model's stub inside a running container: requests fail, Triton still
    says ready, and the health check turns the container unhealthy within interval x retries
    (Docker's schedule: the bound is the acceptance criterion, the measured time is printed)."""
    import urllib.request

    from builder.client.errors import RemoteModelError
    from builder.client.pipeline import Client
    from builder.verify.container import ServingContainer

    with ServingContainer(docker_client, served_image,
                          healthcheck=_fast_healthcheck(docker_client, served_image)) as endpoint:
        container = docker_client.containers.get(endpoint.container_id)
        deadline = time.monotonic() + 60
        while _health(container) != "healthy" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _health(container) == "healthy"
        with Client(f"grpc://{endpoint.grpc_url}/pipeline") as client:
            client("alive")
            killed = container.exec_run(["python3", "-c", KILL_PIPELINE_STUB]).output.split()
            assert len(killed) == 1, killed
            started = time.monotonic()
            with pytest.raises(RemoteModelError, match="is not healthy"):
                client("dead")
        with urllib.request.urlopen(f"http://{endpoint.http_url}/v2/health/ready") as response:
            assert response.status == 200, "Triton itself notices nothing: why the check exists"
        bound = HEALTH_INTERVAL_S * HEALTH_RETRIES + 5
        while _health(container) != "unhealthy" and time.monotonic() - started < 4 * bound:
            time.sleep(0.2)
        elapsed = time.monotonic() - started
        print(f"unhealthy {elapsed:.1f}s after the kill (interval {HEALTH_INTERVAL_S}s x "
              f"{HEALTH_RETRIES} retries)")
        assert _health(container) == "unhealthy"
        assert elapsed <= bound
        log = container.attrs["State"]["Health"]["Log"][-1]["Output"]
        assert "python backend stub process(es) died" in log
