"""The images the engine lists, read one by one, leaving out any removed in between.

docker-py's ``images.list`` asks the engine for the IDs, then inspects each, and fails whole on
the first one gone: another build's clean-up or a user's ``docker rmi`` in another terminal
then fails a build that only wanted to choose among the rest. A listing is a snapshot; an
image gone before it is read was not there to choose.
"""

from __future__ import annotations

import docker
import docker.errors
from docker.models.images import Image


def listed_images(client: docker.DockerClient, *, name: str | None = None,
                  filters: dict | None = None, all: bool = False) -> list[Image]:
    """``client.images.list(name, all, filters)``, without the images removed meanwhile."""
    images = []
    for image_id in client.api.images(name=name, all=all, quiet=True, filters=filters):
        try:
            images.append(client.images.get(image_id))
        except docker.errors.ImageNotFound:
            continue
    return images
