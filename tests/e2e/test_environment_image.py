"""End to end in the CPU image: a model whose package exists only in the packed environment.

The venv is made in a container of the CPU base image by the image's own ``python3`` (which has
neither pip nor python3-venv), packed, checked, attached to a repository of two python models
(the second through a symlink), built into an image FROM the CPU base through the Docker SDK,
run, and queried over gRPC. Triton's own log shows the environment extracted once.
"""

from __future__ import annotations

import os
import re
import shutil
import time

import docker.errors
import pytest

from builder.engine.image_build import build_image
from builder.engine.ownership import PID_LABEL
from builder.environment.attach import attach_environment
from builder.environment.spec import load_spec
from builder.environment.tarball import pack_environment
from builder.environment.target import image_target
from builder.verify.container import ServingContainer
from tests.e2e.test_environment_host import SPEC, probe, write_probe_repository

pytestmark = [pytest.mark.slow, pytest.mark.alongside]  # its own tag, nothing timed

TAG = "triton-builder-test/environment-e2e:latest"


def test_model_importing_an_environment_only_package_answers_in_the_cpu_image(
        docker_client, cpu_base_image, tmp_path):
    with pytest.raises(docker.errors.ContainerError, match="No module named .*tabulate"):
        docker_client.containers.run(cpu_base_image, ["python3", "-c", "import tabulate"],
                                     remove=True)

    target = image_target(docker_client, cpu_base_image)
    tarball = pack_environment(load_spec([SPEC]), target, cache=tmp_path / "cache")
    assert tarball.python_version == target.stub_python_version == "3.11"
    assert "tabulate==0.9.0" in tarball.lock.read_text()

    context = tmp_path / "context"
    repository = write_probe_repository(tmp_path / "models", ["table", "table_too"])
    assert attach_environment(repository, tarball) == ["table", "table_too"]
    shutil.copytree(repository, context / "models", symlinks=True)
    (context / "Dockerfile").write_text(
        f"FROM {cpu_base_image}\nCOPY models/ /models/\n"
        'CMD ["tritonserver", "--model-repository=/models", "--log-verbose=1"]\n')
    image = build_image(docker_client, context, [TAG])
    container = ServingContainer(docker_client, image.id)
    try:
        with container as endpoint:
            answers = [probe(endpoint.grpc_url, name) for name in ("table", "table_too")]
            logs = container.logs()
    finally:
        docker_client.images.remove(image.id, force=True)

    for table, prefix, numpy_version in answers:
        assert table == "1  2\n3  4"
        assert prefix.startswith("/tmp/python_env_")
        assert numpy_version == tarball.numpy_version == "1.26.4"
    assert answers[0][1] == answers[1][1], "the two models run in different extractions"
    extractions = re.findall(r'Extracting Python execution env (\S+?)"', logs)
    assert extractions == ["/models/table/environment.tar.gz"], extractions


def test_the_image_probe_is_kept_per_image_id(docker_client, cpu_base_image, tmp_path,
                                              monkeypatch):
    """A second probe of the same image ID starts no container (the engine's events say so).

    Only this process's containers count (the owner's pid label): the other worker may start
    one of the same base meanwhile (a new machine's run at 3490635 counted two)."""
    monkeypatch.setenv("TRITON_BUILDER_CACHE", str(tmp_path))
    since = int(time.time()) - 1
    first = image_target(docker_client, cpu_base_image)
    second = image_target(docker_client, cpu_base_image)
    created = docker_client.events(
        since=since, until=int(time.time()) + 1, decode=True,
        filters={"type": "container", "event": "create", "image": cpu_base_image,
                 "label": f"{PID_LABEL}={os.getpid()}"})
    assert len(list(created)) == 1
    assert second.fingerprint() == first.fingerprint()
    assert second.python_executable == first.python_executable
