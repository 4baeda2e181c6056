"""Pushing through the SDK: digests confirmed by the registry, failures that say why.

The registry is Debian's real ``docker-registry`` (the ``registry`` fixture); the failing cases
are real too: a port where nothing listens, a host name that does not resolve.
"""

from __future__ import annotations

import socket
import urllib.request

import docker.errors
import pytest

from builder.engine.registry import (
    MANIFEST_TYPES,
    RegistryError,
    manifest_digest,
)
from builder.push.docker_push import PushError, push_image

pytestmark = pytest.mark.alongside


@pytest.fixture(scope="module")
def small_image(docker_client, tmp_path_factory):
    """A one-file image: pushes in well under a second."""
    context = tmp_path_factory.mktemp("small")
    (context / "payload").write_text("hello registry\n")
    (context / "Dockerfile").write_text("FROM scratch\nCOPY payload /payload\n")
    image, _ = docker_client.images.build(path=str(context), rm=True,
                                          tag="triton-builder-test/small:base")
    yield image
    try:
        docker_client.images.remove("triton-builder-test/small:base", force=True)
    except docker.errors.ImageNotFound:
        pass


def _tagged(client, image, reference):
    repository, _, tag = reference.rpartition(":")
    image.tag(repository, tag)
    return reference


@pytest.mark.slow
def test_a_push_is_confirmed_by_the_registrys_digest(docker_client, small_image, registry):
    reference = _tagged(docker_client, small_image, f"{registry.host}/triton-builder-test/small:1")
    try:
        result = push_image(docker_client, reference)
    finally:
        docker_client.images.remove(reference)
    request = urllib.request.Request(
        f"http://{registry.host}/v2/triton-builder-test/small/manifests/1",
        headers={"Accept": MANIFEST_TYPES})
    with urllib.request.urlopen(request) as response:
        assert response.headers["Docker-Content-Digest"] == result.digest
    assert manifest_digest(reference) == result.digest
    assert result.pinned == f"{registry.host}/triton-builder-test/small@{result.digest}"
    assert result.attempts == 1


@pytest.mark.slow
def test_a_registry_that_is_down_fails_clearly_after_retries(docker_client, small_image):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free once closed: nothing listens there
    reference = _tagged(docker_client, small_image, f"127.0.0.1:{port}/triton-builder-test/x:1")
    waits: list[float] = []
    try:
        with pytest.raises(PushError) as failure:
            push_image(docker_client, reference, retries=2, backoff=0.5, sleep=waits.append)
    finally:
        docker_client.images.remove(reference)
    message = str(failure.value)
    assert "connection refused" in message and "is the registry running" in message
    assert "after 3 attempts" in message
    assert failure.value.attempts == 3 and failure.value.transient
    assert waits == [0.5, 1.0]


@pytest.mark.slow
def test_an_unknown_registry_host_fails_at_once(docker_client, small_image):
    reference = _tagged(docker_client, small_image,
                        "registry.triton-builder.invalid/triton-builder-test/x:1")
    try:
        with pytest.raises(PushError, match="does not resolve") as failure:
            push_image(docker_client, reference, sleep=lambda seconds: None)
    finally:
        docker_client.images.remove(reference)
    assert failure.value.attempts == 1 and not failure.value.transient


@pytest.mark.slow
def test_pushing_an_image_that_is_not_here_says_so(docker_client, registry):
    with pytest.raises(PushError, match="build or tag the image first"):
        push_image(docker_client, f"{registry.host}/triton-builder-test/absent:1")


@pytest.mark.slow
def test_asking_for_a_tag_the_registry_lacks_is_an_error(registry):
    with pytest.raises(RegistryError, match="404"):
        manifest_digest(f"{registry.host}/triton-builder-test/never-pushed:1")
