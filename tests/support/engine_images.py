"""Leaving the engine as a test found it: the images a build made, removed after it.

The engine is shared with other checkouts testing at the same time, so images come and go while
this runs: they are listed with the engine's plain list (one call, no inspection of each, which
fails for an image removed in between) and an image gone already counts as removed.
"""

from __future__ import annotations

from collections.abc import Iterable

import docker.errors


def remove_images_made(client, before: set[str], tags: Iterable[str]) -> None:
    """Every image not in ``before``: first those named by ``tags`` (references, or prefixes
    of them ending in ``/`` or ``:``), then the untagged ones the build left, children first."""
    prefixes = tuple(tags)
    for image in client.api.images():
        if image["Id"] in before:
            continue
        for tag in image.get("RepoTags") or []:
            if tag.startswith(prefixes):
                _remove(client, tag)
    for _ in range(10):  # children first: repeat until no new untagged image is left
        left = [image["Id"] for image in client.api.images(all=True)
                if image["Id"] not in before
                and not [t for t in image.get("RepoTags") or [] if t != "<none>:<none>"]]
        if not left:
            return
        for image_id in left:
            _remove(client, image_id)


def _remove(client, name: str) -> None:
    try:
        client.api.remove_image(name, noprune=True)
    except docker.errors.NotFound:
        pass  # removed in between
    except docker.errors.APIError:
        pass  # a parent of one still there, or in use: the next round, or left


def image_ids(client) -> set[str]:
    """The IDs of every image the engine holds now (intermediate ones included)."""
    return {image["Id"] for image in client.api.images(all=True)}
