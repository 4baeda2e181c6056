"""An image's configuration without the build's clock: the same layers and settings, one ID.

Why: the engine's legacy builder stamps the time of each step on the image config (``created``,
every ``history`` entry) and names the intermediate image and container of each step
(``config.Image``, ``container``, ``container_config``). The image ID is the sha256 of that
config, so two builds of byte-identical layers still gave two IDs. :func:`restamp_image` writes
the config again — the layers (``rootfs``) and run settings (``config``) of the built image,
its history with the build's steps dated ``created`` and the base's steps as the base has them,
nothing that names a step's container — and loads it with ``docker load``. The engine
already holds every layer, so the archive sent holds the config and a manifest only: ``docker
load`` looks a layer up by its chain ID and reads a layer file only when the layer is missing.
It takes well under a second, whatever the image's size (``docker save``, which reads every
layer, took 4 s for the 540 MB example and would take minutes for a CUDA image).

The history is read through the engine's history API, which says each step's size but not
whether it made a layer (``empty_layer``): a step is taken to have made one when its size is
not 0. Where that does not account for every layer (a layer holding only directories or
deletions is 0 bytes too), the config is read whole from ``docker save`` instead. Either way
the result is checked: the new image must list the same steps with the same sizes and layers.

The build's steps that make a layer (``COPY``, ``ADD``, ``RUN``) may be named too: each name is
the ``comment`` of its history entry (``LAYER_COMMENT`` + the name), where OCI keeps a step's
note, ``docker history`` shows it, and a registry copies it with the config.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors

from builder.build_epoch import rfc3339
from builder.engine.platforms import Platform
from builder.errors import TritonBuilderError
from builder.interrupts import deferred_interrupts


class RestampError(TritonBuilderError, RuntimeError):
    """The rewritten configuration would not describe the image that was built."""


LAYER_COMMENT = "triton-builder: "
"""How the comment of a history entry that names its layer begins."""
_METADATA_STEP = re.compile(r"#\(nop\)\s+(?!COPY\b|ADD\b)")


def restamp_image(client: docker.DockerClient, image_id: str, *, created: str,
                  kept_history: int, layer_names: Sequence[str] = (),
                  made: list[str] | None = None) -> str:
    """The ID of ``image_id`` with its configuration rewritten (see the module's docstring):
    dated ``created``, the first ``kept_history`` history entries (the base's) left as they
    are, the build's steps that make a layer named by ``layer_names`` in order (none named
    unless there are as many). The built image stays; the caller removes it. ``made`` receives
    the new image's ID before the engine makes it, so that an interrupted caller knows what to
    remove."""
    attributes = client.api.inspect_image(image_id)
    steps = list(reversed(client.api.history(image_id)))
    diff_ids = list(attributes["RootFS"]["Layers"])
    history = [_history_entry(step, created if index >= kept_history else None)
               for index, step in enumerate(steps)]
    if sum(not entry.get("empty_layer") for entry in history) != len(diff_ids):
        raw = raw_config(client, image_id)
        history = [{**entry, "created": created} if index >= kept_history else entry
                   for index, entry in enumerate(raw.get("history", []))]
    history = _named(history, kept_history, layer_names)
    config = {
        "architecture": attributes["Architecture"],
        "os": attributes["Os"],
        **({"variant": attributes["Variant"]} if attributes.get("Variant") else {}),
        **({"author": attributes["Author"]} if attributes.get("Author") else {}),
        "config": {**attributes["Config"], "Image": ""},
        "created": created,
        "history": history,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    new_id = load_config(client, config, made)
    _check_same_image(client, image_id, new_id, steps)
    return new_id


def restamp_platform(client: docker.DockerClient, image_id: str,
                     platform: Platform) -> dict[str, Any]:
    """The config of ``image_id`` (read whole from ``docker save``) saying ``platform``: for an
    image imported from another architecture's root file system, which ``docker import`` stamps
    with the engine's own."""
    config = raw_config(client, image_id)
    config["architecture"], config["os"] = platform.architecture, platform.os
    config.pop("variant", None)
    if platform.variant:
        config["variant"] = platform.variant
    return config


def _named(history: list[dict[str, Any]], kept_history: int,
           names: Sequence[str]) -> list[dict[str, Any]]:
    """``history`` with the comments of the steps after ``kept_history`` that make a layer set
    from ``names``; as it is when the counts differ (no name is better than a wrong one)."""
    steps = [index for index, entry in enumerate(history) if index >= kept_history
             and not _METADATA_STEP.search(entry.get("created_by", ""))]
    if not names or len(steps) != len(names):
        return history
    named = [dict(entry) for entry in history]
    for index, name in zip(steps, names):
        named[index]["comment"] = LAYER_COMMENT + name
    return named


def layer_name(comment: str | None) -> str | None:
    """The name :func:`restamp_image` gave a layer, from its history entry's comment."""
    return comment[len(LAYER_COMMENT):] if comment and comment.startswith(LAYER_COMMENT) else None


@dataclass(frozen=True)
class ImageLayer:
    """One layer of an image, oldest first: what it holds, its size unpacked, its step."""

    part: str
    size: int
    step: str


def image_layers(client: docker.DockerClient, reference: str) -> list[ImageLayer]:
    """The layers of ``reference``: each named as its build named it (:func:`restamp_image`),
    ``base`` where it came with the base (or from a build that named none). Steps that made no
    bytes are left out."""
    layers = []
    for step in reversed(client.api.history(reference)):
        name = layer_name(step.get("Comment"))
        if step.get("Size") or name:
            layers.append(ImageLayer(name or "base", int(step.get("Size") or 0),
                                     step.get("CreatedBy", "")))
    return layers


def _history_entry(step: dict[str, Any], created: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"created": created or rfc3339(step["Created"]),
                             "created_by": step.get("CreatedBy", "")}
    if step.get("Comment"):
        entry["comment"] = step["Comment"]
    if not step.get("Size"):
        entry["empty_layer"] = True
    return entry


def config_bytes(config: dict[str, Any]) -> bytes:
    """The canonical JSON of an image config: its sha256 is the image ID."""
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def load_config(client: docker.DockerClient, config: dict[str, Any],
                made: list[str] | None = None) -> str:
    """Load an image made of ``config`` and layers the engine already holds; its ID (added to
    ``made`` before the engine has the image). The load runs to its end through an interrupt."""
    body = config_bytes(config)
    digest = hashlib.sha256(body).hexdigest()
    if made is not None:
        made.append(f"sha256:{digest}")
    manifest = [{"Config": f"{digest}.json", "RepoTags": None,
                 "Layers": [f"{index}/layer.tar"
                            for index in range(len(config["rootfs"]["diff_ids"]))]}]
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:") as tar:
        for name, data in ((f"{digest}.json", body),
                           ("manifest.json", json.dumps(manifest).encode())):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    try:
        with deferred_interrupts():
            client.images.load(archive.getvalue())
    except docker.errors.APIError as error:
        raise RestampError(f"the engine refused the rewritten image config: {error}") from error
    return f"sha256:{digest}"


def raw_config(client: docker.DockerClient, image_id: str) -> dict[str, Any]:
    """The image's config as the engine stores it, from ``docker save`` (reads every layer)."""
    with tarfile.open(fileobj=_Stream(client.api.get_image(image_id)), mode="r|") as archive:
        for member in archive:
            if member.name == f"{image_id.split(':')[-1]}.json":
                config = archive.extractfile(member)
                if config is None:
                    break
                return json.load(config)
    raise RestampError(f"docker save of {image_id} holds no config")


def _check_same_image(client: docker.DockerClient, old_id: str, new_id: str,
                      steps: list[dict[str, Any]]) -> None:
    old, new = client.api.inspect_image(old_id), client.api.inspect_image(new_id)
    new_steps = list(reversed(client.api.history(new_id)))
    problems = [field for field, same in (
        ("layers", old["RootFS"]["Layers"] == new["RootFS"]["Layers"]),
        ("run settings", {**old["Config"], "Image": ""} == new["Config"]),
        ("steps", [(s.get("CreatedBy"), s.get("Size")) for s in steps]
         == [(s.get("CreatedBy"), s.get("Size")) for s in new_steps]),
    ) if not same]
    if problems:
        raise RestampError(f"the rewritten image {new_id} differs from the built {old_id} in "
                           f"its {', '.join(problems)}")


class _Stream(io.RawIOBase):
    """A file over the chunks ``docker save`` streams."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = iter(chunks)
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._left:
            self._left = next(self._chunks, b"")
            if not self._left:
                return 0
        size = min(len(buffer), len(self._left))
        buffer[:size], self._left = self._left[:size], self._left[size:]
        return size
