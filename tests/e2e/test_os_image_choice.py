"""Which OS image our bases are built on when none is named, on an engine without Docker Hub.

After ``triton-builder base os`` (and ``--platform linux/arm64``), the CPU bases of both
platforms and the slim GPU base are built with no ``TRITON_BUILDER_OS_IMAGE*`` set: the image
``base os`` made is found by its label (or, made before the label, by its tag). Each base comes
out the same as the one the suite built from the named image — same content hash, so no build.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import docker.errors
import pytest

from builder.base.cpu import build_cpu_base
from builder.base.gpu_slim import build_slim_base
from builder.base.os_choice import OS_PYTHON_LABEL, official_os_image, os_image_for
from builder.base.releases import builder_python
from builder.engine.platforms import ARM64, DEFAULT_PLATFORM

pytestmark = [pytest.mark.slow, pytest.mark.alongside]

VARIABLES = ("TRITON_BUILDER_OS_IMAGE", "TRITON_BUILDER_OS_IMAGE_ARM64")


@pytest.fixture
def no_variable(monkeypatch):
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def test_the_bases_of_both_platforms_need_no_variable_after_base_os(
        docker_client, os_image, cpu_base_image, arm64_cpu_base_image, slim_base_image,
        no_variable):
    for platform, base in ((DEFAULT_PLATFORM, cpu_base_image), (ARM64, arm64_cpu_base_image)):
        chosen = os_image_for(docker_client, "3.11", platform)
        assert chosen != official_os_image("3.11"), f"{platform}: the Docker Hub name"
        assert docker_client.images.get(chosen).attrs["Architecture"] == platform.architecture
        found = build_cpu_base(docker_client, platform=platform)  # the content hash: no build
        assert found.id == docker_client.images.get(base).id, platform
    slim = build_slim_base(docker_client, builder_python())
    assert slim.id == docker_client.images.get(slim_base_image).id


def test_the_cli_builds_the_arm64_base_with_no_variable(docker_client, arm64_cpu_base_image):
    """As a user runs it after ``base os --platform linux/arm64``: no ``--os-image``, no
    variable."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in VARIABLES}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "triton-builder"), "base", "cpu", "--platform",
         "linux/arm64"], capture_output=True, text=True, env=environment, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == arm64_cpu_base_image


def test_an_image_with_the_label_is_found_and_the_official_one_comes_first(docker_client,
                                                                            no_variable):
    """A Python no real image has (3.77): the labelled image is chosen while the official one
    is missing; without either, the official name is returned, for a pull that says what to
    do when it fails."""
    assert os_image_for(docker_client, "3.77") == official_os_image("3.77")
    empty = io.BytesIO()
    with tarfile.open(fileobj=empty, mode="w") as archive:
        archive.addfile(tarfile.TarInfo("etc"), None)
    reference = "triton-builder-test/os-image-choice:python3.77"
    docker_client.api.import_image_from_data(
        empty.getvalue(), repository=reference.split(":")[0], tag="python3.77",
        changes=[f"LABEL {OS_PYTHON_LABEL}=3.77"])
    try:
        assert os_image_for(docker_client, "3.77") == reference
        assert os_image_for(docker_client, "3.77", ARM64) == official_os_image("3.77")
        docker_client.images.get(reference).tag(official_os_image("3.77"))
        assert os_image_for(docker_client, "3.77") == official_os_image("3.77")
    finally:
        for name in (official_os_image("3.77"), reference):
            docker_client.images.remove(name, force=True)


def test_an_image_built_on_the_os_image_is_not_taken_for_it(docker_client, no_variable,
                                                             tmp_path):
    """Each image built on the OS image inherits its label (the CPU base, every serving image)
    and is newer: the OS image is still the one chosen. Taking the CPU base for it broke the
    next base build on a fresh engine (``useradd: user 'triton-server' already exists``)."""
    empty = io.BytesIO()
    with tarfile.open(fileobj=empty, mode="w") as archive:
        archive.addfile(tarfile.TarInfo("etc"), None)
    reference = "triton-builder-test/os-image-choice:python3.78"
    derived = "triton-builder-test/os-image-choice:built-on-python3.78"
    docker_client.api.import_image_from_data(
        empty.getvalue(), repository=reference.split(":")[0], tag="python3.78",
        changes=[f"LABEL {OS_PYTHON_LABEL}=3.78"])
    (tmp_path / "Dockerfile").write_text(f"FROM {reference}\nCOPY marker /marker\n")
    (tmp_path / "marker").write_text("built on the OS image\n")
    try:
        docker_client.images.build(path=str(tmp_path), tag=derived, rm=True)
        assert docker_client.images.get(derived).labels[OS_PYTHON_LABEL] == "3.78"
        assert os_image_for(docker_client, "3.78") == reference
    finally:
        for image in (derived, reference):
            try:
                docker_client.images.remove(image, force=True)
            except docker.errors.ImageNotFound:
                pass
