"""Building images through the Docker SDK, with the build log streamed and errors kept.

The SDK's high-level ``images.build`` hides the log until the end and its error carries little
of the failing step. We read the low-level stream ourselves: each line goes to ``on_log`` as it
comes, the lines of the current step are kept, and a failure raises :class:`ImageBuildError`
with the step and its output.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from builder.build_epoch import build_epoch
from builder.engine.context_archive import write_context_archive
from builder.engine.reference import ImageReference
from builder.errors import TritonBuilderError
from builder.progress import Log

CONTENT_HASH_LABEL = "ai.triton-builder.content-hash"

_STEP = re.compile(r"^Step \d+/\d+ : ")


class ImageBuildError(TritonBuilderError, RuntimeError):
    """A build step failed; ``step`` is the instruction and ``output`` what it printed."""

    def __init__(self, message: str, step: str = "", output: str = "") -> None:
        super().__init__(f"{message}\n  in step: {step}\n{output}" if step else message)
        self.step = step
        self.output = output


@dataclass
class BuiltImage:
    """An image the engine now holds, and whether this call had to build it."""

    id: str
    tags: list[str]
    built: bool
    log: list[str] = field(default_factory=list)


def build_image(
    client: docker.DockerClient,
    context: Path,
    tags: Iterable[str],
    *,
    dockerfile: str = "Dockerfile",
    labels: dict[str, str] | None = None,
    buildargs: dict[str, str] | None = None,
    network_mode: str | None = None,
    nocache: bool = False,
    platform: str | None = None,
    on_log: Log | None = None,
) -> BuiltImage:
    """Build ``context`` and tag the result with every name in ``tags``.

    ``platform`` (``linux/arm64``) builds for that platform: the legacy builder takes a FROM
    image the engine holds for it, and runs the ``RUN`` steps under emulation where it is not
    the engine's own (:mod:`builder.engine.emulation`).

    The context goes to the engine as a canonical tar (:mod:`builder.engine.context_archive`),
    so the layers its ``COPY`` steps make depend on the files alone. The first tag is given to
    the build; the others are added only once the build succeeded,
    so a failure never leaves a tag pointing at a broken image. With no tags the image is left
    untagged (known by its ID), for callers that tag only after checking it.
    """
    tags = list(tags)
    log: list[str] = []
    made: list[str] = []
    running: list[str] = []
    with tempfile.TemporaryFile(prefix="triton-builder-context-") as archive:
        write_context_archive(context, archive, mtime=build_epoch())
        archive.seek(0)
        try:
            stream = client.api.build(
                fileobj=archive, custom_context=True, dockerfile=dockerfile,
                labels=labels or {}, buildargs=buildargs, network_mode=network_mode,
                nocache=nocache, rm=True, forcerm=True, decode=True, platform=platform,
            )
            image_id = _follow(stream, made, running, log, on_log)
        except BaseException:  # failed or interrupted (Ctrl-C): remove the images it made
            discard_build(client, made, running)
            raise
    image = client.images.get(image_id)
    for tag in tags:
        reference = ImageReference.parse(tag)
        image.tag(reference.repository, reference.tag)
    return BuiltImage(id=image.id, tags=tags, built=True, log=log)


_LAYER = re.compile(r"^ ---> ([0-9a-f]{12,64})$")
_RUNNING = re.compile(r"^ ---> Running in ([0-9a-f]{12,64})$")


def _follow(stream: Iterable[dict], made: list[str], running: list[str], log: list[str],
            on_log: Log | None) -> str:
    """Read the build stream; collect in ``made`` the images this build created (not those
    taken from the layer cache, not the FROM image) and in ``running`` the containers of its
    ``RUN`` steps, so an interrupted build can remove them."""
    step, step_output = "", []
    image_id = None
    cached = False
    for chunk in stream:
        if "error" in chunk or "errorDetail" in chunk:
            detail = chunk.get("errorDetail", {}).get("message") or chunk.get("error", "")
            raise ImageBuildError(f"docker build failed: {detail.strip()}", step,
                                  "".join(step_output[-200:]))
        text = chunk.get("stream", "")
        if "aux" in chunk and "ID" in chunk["aux"]:
            image_id = chunk["aux"]["ID"]
        if not text:
            continue
        log.append(text)
        if _STEP.match(text):
            step, step_output, cached = text.strip(), [], False
        else:
            step_output.append(text)
            cached = cached or text.strip() == "---> Using cache"
            layer = _LAYER.match(text.rstrip("\n"))
            if layer and not cached and " : FROM " not in step:
                made.append(layer.group(1))
            container = _RUNNING.match(text.rstrip("\n"))
            if container:
                running.append(container.group(1))
        if on_log:
            on_log(text.rstrip("\n"))
    if image_id is None:
        raise ImageBuildError("docker build ended without an image id", step,
                              "".join(step_output[-200:]))
    return image_id


def discard_build(client: docker.DockerClient, made: list[str], running: list[str],
                  wait: float = 15.0) -> None:
    """Remove what a failed or interrupted build made.

    The engine does not stop a build whose stream the client left (the SDK keeps the response
    open): it goes on with the next step, whose container holds the last layer. So the step
    containers are removed first — which fails the step and ends the build — and the layers
    after them, again until none is left or ``wait`` seconds have passed.
    """
    deadline = time.monotonic() + wait
    while True:
        for container_id in running + _step_containers(client, made):
            try:
                client.api.remove_container(container_id, force=True)
            except docker.errors.APIError:
                pass
        if not remove_images(client, reversed(made)) or time.monotonic() > deadline:
            return
        time.sleep(0.5)


def _step_containers(client: docker.DockerClient, layers: list[str]) -> list[str]:
    """The containers running on the newest layer: the step the engine went on with."""
    if not layers:
        return []
    try:
        return [c["Id"] for c in client.api.containers(all=True, filters={"ancestor": layers[-1]})]
    except docker.errors.APIError:
        return []


def remove_images(client: docker.DockerClient, image_ids: Iterable[str]) -> list[str]:
    """Remove untagged images (children first); what is tagged or in use stays.

    Returns the untagged ones still there (in use, or the engine refused).
    """
    left = []
    for image_id in image_ids:
        try:
            if not client.images.get(image_id).tags:
                client.images.remove(image_id, noprune=True)
        except docker.errors.ImageNotFound:
            continue
        except docker.errors.APIError:
            left.append(image_id)
    return left


def find_built(client: docker.DockerClient, tag: str, content_hash: str) -> BuiltImage | None:
    """The image tagged ``tag`` if it was built from the same inputs (same content hash)."""
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    if (image.labels or {}).get(CONTENT_HASH_LABEL) != content_hash:
        return None
    return BuiltImage(id=image.id, tags=[tag], built=False)
