"""A listing of images on the real engine, while another client removes one of them: the image
removed between the engine's list and its inspection is left out, and the rest are read.

docker-py's ``images.list`` inspects each listed ID in turn and fails whole on the first one
gone (the CI failure of stop 53, in the interrupt sweep, beside other builds on its payload).
The tests remove an image at exactly that moment, by removing it on the engine just before
the SDK inspects it: the engine and the removal are real, only the instant is chosen."""

from __future__ import annotations

import contextlib
import uuid

import docker.errors
import pytest

from builder.base.os_choice import OS_PYTHON_LABEL, made_os_image
from builder.engine.image_build import build_image
from builder.engine.image_listing import listed_images


def _labelled_image(client, os_image: str, directory, labels: dict[str, str],
                    tags: list[str]) -> str:
    directory.mkdir()
    lines = "".join(f'LABEL {key}="{value}"\n' for key, value in labels.items())
    (directory / "Dockerfile").write_text(f"FROM {os_image}\n{lines}")
    return build_image(client, directory, tags).id


def _remove(client, tags: list[str]) -> None:
    for tag in tags:
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(tag, force=True)


@pytest.fixture
def removed_when_inspected(docker_client, monkeypatch):
    """Register an image ID: the engine removes it the first time the SDK inspects it."""
    doomed: set[str] = set()
    inspect = docker_client.api.inspect_image

    def inspect_after_removal(image, *args, **kwargs):
        if image in doomed:
            doomed.discard(image)
            docker_client.api.remove_image(image, force=True)
        return inspect(image, *args, **kwargs)

    monkeypatch.setattr(docker_client.api, "inspect_image", inspect_after_removal)
    return doomed.add


def test_an_image_removed_during_a_listing_is_left_out(docker_client, os_image, tmp_path,
                                                       removed_when_inspected):
    label = f"ai.triton-builder.test-listing={uuid.uuid4().hex}"
    key, value = label.split("=")
    tags = [f"triton-builder-test/listing-{value[:8]}:{name}" for name in ("kept", "gone")]
    kept = _labelled_image(docker_client, os_image, tmp_path / "kept", {key: value}, tags[:1])
    gone = _labelled_image(docker_client, os_image, tmp_path / "gone",
                           {key: value, "other": "layer"}, tags[1:])
    try:
        removed_when_inspected(gone)
        assert [image.id for image in listed_images(docker_client, filters={"label": label})] \
            == [kept]
        with pytest.raises(docker.errors.ImageNotFound):
            docker_client.images.get(gone)
    finally:
        _remove(docker_client, tags)


def test_the_os_image_is_found_while_another_labelled_image_is_removed(
        docker_client, os_image, tmp_path, removed_when_inspected):
    """Every serving image carries its OS image's label: removing one (``docker rmi``, another
    build's clean-up) while a build picks its OS image must not fail that build."""
    python = f"0.{uuid.uuid4().hex[:8]}"
    tags = [f"triton-builder-test/os-listing-{python[2:]}:{name}" for name in ("os", "serving")]
    _labelled_image(docker_client, os_image, tmp_path / "os", {OS_PYTHON_LABEL: python}, tags[:1])
    serving = _labelled_image(docker_client, tags[0], tmp_path / "serving",
                              {"ai.triton-builder.test-serving": python}, tags[1:])
    try:
        removed_when_inspected(serving)
        assert made_os_image(docker_client, python) == tags[0]
    finally:
        _remove(docker_client, tags)
