"""Leaving the engine as a test found it: the images a build made, removed after it.

The engine is shared with other checkouts testing at the same time, so images come and go while
this runs, and an untagged image may be another build's (a serving image stays untagged until
it is verified). Only the build's own are removed: the images named by its tags, their new
ancestors (the steps that made them) and their new descendants (the steps built on them). They
are listed with the engine's plain list (one call, no inspection of each, which fails for an
image removed in between), and an image gone already counts as removed.
"""

from __future__ import annotations

from collections.abc import Iterable

import docker.errors


def remove_images_made(client, before: set[str], tags: Iterable[str]) -> None:
    """Every image new since ``before`` that is named by ``tags`` (references, or prefixes of
    them ending in ``/`` or ``:``), the payload each such serving image names (its
    ``payload-hash`` label: the payload's cache tag), and what those were built from or on."""
    from builder.image.labels import PAYLOAD_HASH
    from builder.image.serving_image import payload_reference

    listed = client.api.images(all=True)
    named = [image for image in listed
             if any(tag.startswith(tuple(tags)) for tag in image.get("RepoTags") or [])]
    prefixes = (*tuple(tags), *{payload_reference(image["Labels"][PAYLOAD_HASH])
                                for image in named if PAYLOAD_HASH in (image.get("Labels") or {})})
    parent = {image["Id"]: image.get("ParentId") or "" for image in listed}
    new = {image["Id"] for image in listed if image["Id"] not in before}
    roots = {image["Id"] for image in listed if image["Id"] in new
             and any(tag.startswith(prefixes) for tag in image.get("RepoTags") or [])}
    mine = set(roots)
    for root in roots:  # the steps it was built from
        step = parent.get(root, "")
        while step in new:
            mine.add(step)
            step = parent.get(step, "")
    built_on = set(roots)  # the steps built on them, and on those
    grown = True
    while grown:
        above = {image_id for image_id in new - built_on if parent.get(image_id) in built_on}
        built_on |= above
        grown = bool(above)
    mine |= built_on
    for image in listed:
        for tag in image.get("RepoTags") or []:
            if image["Id"] in mine and tag.startswith(prefixes):
                _remove(client, tag)

    def depth(image_id: str) -> int:
        count = 0
        while image_id:
            image_id, count = parent.get(image_id, ""), count + 1
        return count

    for image_id in sorted(mine, key=depth, reverse=True):  # children first
        _remove(client, image_id)


def _remove(client, name: str) -> None:
    try:
        client.api.remove_image(name, noprune=True)
    except docker.errors.NotFound:
        pass  # removed in between
    except docker.errors.APIError:
        pass  # in use, or still named elsewhere: left as it is


def image_ids(client) -> set[str]:
    """The IDs of every image the engine holds now (intermediate ones included)."""
    return {image["Id"] for image in client.api.images(all=True)}
