"""What a build leaves on the engine when it does not finish, and how that goes away.

A build that fails or is interrupted removes, on its way out, what it made and did not keep
(:class:`Leftovers`): the containers labelled with its id (:mod:`builder.engine.ownership`) and
the images it recorded as the engine made them — recorded before the engine call that makes
them where the ID is known in advance (a rewritten image config). Only untagged images go: a
tag means a complete image that something names (a layer cache entry, a verified image).

A build killed with SIGKILL cleans nothing. Its containers still carry its owner's labels, so
:func:`find_orphans` finds those whose owner process is gone (a live build's, here or on another
host, is never one), and :func:`remove_orphans` removes each with the untagged image it ran —
the killed build's new image, which was never tagged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import docker
import docker.errors

from builder.engine.container_lifecycle import remove_container
from builder.engine.image_build import remove_images
from builder.engine.ownership import BUILD_LABEL, BuildOwner
from builder.interrupts import deferred_interrupts


@dataclass
class Leftovers:
    """What one build made on the engine, for removal if it does not finish."""

    owner: BuildOwner = field(default_factory=BuildOwner.here)
    images: list[str] = field(default_factory=list)
    """Image IDs in the order the engine made them (removed newest first)."""

    def remove(self, client: docker.DockerClient) -> None:
        """Remove the build's containers (by its label) and its images that are still untagged.
        Runs to its end through further interrupts."""
        with deferred_interrupts():
            for container_id in _containers(client, {BUILD_LABEL: self.owner.build_id}):
                remove_container(client, container_id)
            remove_images(client, reversed(self.images))


@dataclass(frozen=True)
class Orphan:
    """A container whose owning build was killed."""

    container_id: str
    name: str
    status: str
    image_id: str
    owner: BuildOwner

    def describe(self) -> str:
        return (f"{self.name} ({self.status}, image {self.image_id[7:19]}; builder pid "
                f"{self.owner.pid} on {self.owner.host} is gone)")


def find_orphans(client: docker.DockerClient) -> list[Orphan]:
    """Containers of builds whose process is gone from this host."""
    found = []
    for summary in client.api.containers(all=True, filters={"label": BUILD_LABEL}):
        owner = BuildOwner.from_labels(summary.get("Labels") or {})
        if owner is None or owner.alive() is not False:
            continue
        found.append(Orphan(summary["Id"], (summary.get("Names") or ["?"])[0].lstrip("/"),
                            summary.get("State", "?"), summary.get("ImageID", ""), owner))
    return found


def remove_orphans(client: docker.DockerClient, orphans: Iterable[Orphan]) -> tuple[int, int]:
    """Remove each orphan and then its image where untagged and unused; (containers, images)
    removed."""
    orphans = list(orphans)
    containers = sum(remove_container(client, orphan.container_id) for orphan in orphans)
    images = {orphan.image_id for orphan in orphans if orphan.image_id}
    present = [image for image in images if _exists(client, image)]
    left = remove_images(client, present)
    return containers, len([image for image in present
                            if image not in left and not _exists(client, image)])


def _containers(client: docker.DockerClient, labels: dict[str, str]) -> list[str]:
    selector = [f"{key}={value}" for key, value in labels.items()]
    try:
        return [c["Id"] for c in client.api.containers(all=True, filters={"label": selector})]
    except docker.errors.APIError:
        return []


def _exists(client: docker.DockerClient, image_id: str) -> bool:
    try:
        client.images.get(image_id)
        return True
    except docker.errors.ImageNotFound:
        return False
