"""Leaving the engine as a test found it: the images a build made, removed after it."""

from __future__ import annotations

from collections.abc import Iterable


def remove_images_made(client, before: set[str], tags: Iterable[str]) -> None:
    """Every image not in ``before``: first those named by ``tags`` (references, or prefixes
    of them ending in ``/`` or ``:``), then the untagged ones the build left, children first."""
    prefixes = tuple(tags)
    for image in client.images.list():
        if image.id in before:
            continue
        for tag in image.tags:
            if tag.startswith(prefixes):
                client.images.remove(tag, noprune=True)
    for _ in range(10):  # children first: repeat until no new untagged image is left
        left = [image for image in client.images.list(all=True)
                if image.id not in before and not image.tags]
        if not left:
            return
        for image in left:
            try:
                client.images.remove(image.id, noprune=True)
            except Exception:  # noqa: BLE001 - a parent of one still there; next round
                pass
