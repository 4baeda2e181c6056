"""Naming a verified image: every reference of a build pointed at it, and the images those
references named before dropped when that left them nameless (a rebuild loop would otherwise pile
up ``<none>`` images)."""

from __future__ import annotations

import docker
import docker.errors

from builder.engine.reference import ImageReference


def tag_image(client: docker.DockerClient, image_id: str, references: list[str]) -> None:
    """Point every one of ``references`` at ``image_id``."""
    replaced = set()
    for reference in references:
        try:
            previous = client.images.get(reference).id
            if previous != image_id:
                replaced.add(previous)
        except docker.errors.ImageNotFound:
            pass
    image = client.images.get(image_id)
    for reference in references:
        parsed = ImageReference.parse(reference)
        image.tag(parsed.repository, parsed.tag)
    for previous in replaced:
        try:
            if not client.images.get(previous).tags:
                client.images.remove(previous)
        except docker.errors.APIError:
            pass  # in use by a container, or already gone: leave it to `docker image prune`
