"""What a build made, removed on its way out, on the real engine: its containers (by its label)
and its untagged images go; a tagged image, another build's container and the images it was
built on stay. And a container is removed even where the engine is still busy with it."""

from __future__ import annotations

import uuid

import docker.errors
import pytest

from builder.engine.container_lifecycle import create_container, remove_container
from builder.engine.image_build import build_image
from builder.engine.leftovers import Leftovers
from builder.engine.ownership import BUILD_LABEL, BuildOwner

KEPT = "triton-builder-test/leftovers-kept:1"


def _tiny_image(client, os_image: str, directory, tags: list[str], made: list[str]) -> str:
    """An image no cache holds: ``os_image`` plus a label of its own (one step)."""
    directory.mkdir()
    (directory / "Dockerfile").write_text(
        f"FROM {os_image}\nLABEL ai.triton-builder.test-leftover={uuid.uuid4().hex}\n")
    return build_image(client, directory, tags, made=made).id


def test_a_builds_leftovers_go_and_nothing_else(docker_client, os_image, tmp_path):
    leftovers = Leftovers()
    untagged = _tiny_image(docker_client, os_image, tmp_path / "a", [], leftovers.images)
    kept = _tiny_image(docker_client, os_image, tmp_path / "b", [KEPT], leftovers.images)
    ours = create_container(docker_client, os_image, owner=leftovers.owner, command=["true"])
    theirs = create_container(docker_client, os_image, owner=BuildOwner.here(),
                              command=["true"])
    try:
        assert untagged[7:19] in leftovers.images and len(leftovers.images) == 2
        assert ours.labels[BUILD_LABEL] == leftovers.owner.build_id
        leftovers.remove(docker_client)
        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(ours.id)
        with pytest.raises(docker.errors.ImageNotFound):
            docker_client.images.get(untagged)
        assert docker_client.images.get(kept).tags == [KEPT]
        assert docker_client.containers.get(theirs.id).status == "created"
        assert docker_client.images.get(os_image)
    finally:
        remove_container(docker_client, theirs.id)
        docker_client.images.remove(KEPT)


def test_a_container_is_removed_while_it_runs_and_again_when_gone(docker_client, os_image):
    container = create_container(docker_client, os_image, owner=None, start=True,
                                 command=["sleep", "60"])
    assert docker_client.containers.get(container.id).status == "running"
    assert remove_container(docker_client, container.id)
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(container.id)
    assert remove_container(docker_client, container.id)  # already gone: done
