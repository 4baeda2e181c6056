"""Removing what builds on one base made, and nothing else, from an engine others share.

A clean second build needs the first one's layers gone: its image, its payload and the legacy
builder's intermediate images (which would hand the second build cached steps). Other jobs build
on the same engine meanwhile, so images are told apart by ancestry, not by age: only images
descending from ``base`` (the slim GPU base, which nothing else builds on) and made since
``before`` are removed.
"""

from __future__ import annotations

from collections.abc import Iterable

import docker
import docker.errors

from builder.image.serving_image import PAYLOAD_HASH, payload_reference


def remove_builds_on(client: docker.DockerClient, base_id: str, before: set[str],
                     references: Iterable[str]) -> None:
    """Remove ``references`` (and the payloads their labels name), then every untagged image
    made since ``before`` that descends from ``base_id``."""
    for reference in references:
        try:
            image = client.images.get(reference)
        except docker.errors.ImageNotFound:
            continue
        payload = (image.labels or {}).get(PAYLOAD_HASH)
        client.images.remove(reference, noprune=True)
        if payload:
            try:
                client.images.remove(payload_reference(payload), noprune=True)
            except docker.errors.APIError:
                pass  # gone already
    for _ in range(10):  # children first: repeat until none is left
        parents = {image["Id"]: image.get("ParentId", "")
                   for image in client.api.images(all=True)}
        left = [image for image, parent in parents.items() if image not in before
                and _descends(image, base_id, parents) and image != base_id]
        if not left:
            return
        for image in left:
            try:
                client.images.remove(image, noprune=True)
            except docker.errors.APIError:
                pass  # a parent of one still there (or tagged by another build): next round


def _descends(image: str, base_id: str, parents: dict[str, str]) -> bool:
    seen = set()
    while image and image not in seen:
        if image == base_id:
            return True
        seen.add(image)
        image = parents.get(image, "")
    return False
