"""Building images through the Docker SDK, with the build log streamed and errors kept.

The SDK's high-level ``images.build`` hides the log until the end and its error carries little
of the failing step. We read the low-level stream ourselves: each line goes to ``on_log`` as it
comes, the lines of the current step are kept, and a failure raises :class:`ImageBuildError`
with the step and its output. A build that fails or is interrupted removes the images it made,
including those the engine made after the interrupt (:class:`_BuildStream`).
"""

from __future__ import annotations

import io
import queue
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from builder.build_epoch import build_epoch
from builder.engine.context_archive import write_context_archive
from builder.engine.reference import ImageReference
from builder.errors import TritonBuilderError
from builder.interrupts import deferred_interrupts
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
    made: list[str] | None = None,
) -> BuiltImage:
    """Build ``context`` and tag the result with every name in ``tags``.

    ``platform`` (``linux/arm64``) builds for that platform: the legacy builder takes a FROM
    image the engine holds for it, and runs the ``RUN`` steps under emulation where it is not
    the engine's own (:mod:`builder.engine.emulation`).

    The context goes to the engine as a canonical tar (:mod:`builder.engine.context_archive`),
    so the layers its ``COPY`` steps make depend on the files alone. Tags are set only once the
    build succeeded, all of them or (interrupted) none, so a failure never leaves a tag pointing
    at a broken image. With no tags the image is left untagged (known by its ID), for callers
    that tag only after checking it: ``made`` then receives each image the build makes, as the
    engine makes it, so that the caller can remove them whatever the instant it is stopped.
    """
    tags = list(tags)
    log: list[str] = []
    made = [] if made is None else made
    running: list[str] = []
    build = None
    finished = False
    with tempfile.TemporaryFile(prefix="triton-builder-context-") as archive:
        write_context_archive(context, archive, mtime=build_epoch())
        archive.seek(0)
        upload = _Upload(archive)
        try:
            build = _BuildStream(lambda: client.api.build(
                fileobj=upload, custom_context=True, dockerfile=dockerfile,
                labels=labels or {}, buildargs=buildargs, network_mode=network_mode,
                nocache=nocache, rm=True, forcerm=True, decode=True, platform=platform,
            ), upload, made, running)
            image_id = build.follow(log, on_log)
            with deferred_interrupts():
                image = client.images.get(image_id)
                for tag in tags:
                    reference = ImageReference.parse(tag)
                    image.tag(reference.repository, reference.tag)
                finished = True
        except BaseException:  # failed or interrupted (Ctrl-C): remove the images it made
            if not finished:
                discard_build(client, made, running, build)
            raise
    return BuiltImage(id=image.id, tags=tags, built=True, log=log)


_LAYER = re.compile(r"^ ---> ([0-9a-f]{12,64})$")
_RUNNING = re.compile(r"^ ---> Running in ([0-9a-f]{12,64})$")


class _Upload(io.RawIOBase):
    """The build context as the SDK sends it, cut short once ``abandoned``: the engine then
    reads a truncated context and builds nothing."""

    def __init__(self, file: io.BufferedIOBase) -> None:
        super().__init__()
        self._file = file
        self.abandoned = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer) -> int:
        if self.abandoned:
            raise OSError("the build was abandoned: its context is not sent further")
        return self._file.readinto(buffer)


class _BuildStream:
    """The request that starts a build and the engine's build stream, both in a thread of
    their own until the stream ends.

    The engine goes on with a build whose client left — one whose context it has received
    already, even before it answered — and what it makes is known only from the stream: in
    the caller's thread, an interrupt would end the reading and leave the images made after it
    unknown. This thread records in ``made`` the images the build created (not those taken from
    the layer cache, not the FROM image) and in ``running`` the containers of its ``RUN``
    steps.
    """

    def __init__(self, start: Callable[[], Iterable[dict]], upload: _Upload, made: list[str],
                 running: list[str]) -> None:
        self.made, self.running = made, running
        self.image_id: str | None = None
        self.error: BaseException | None = None
        self._upload = upload
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(start,), daemon=True,
                                        name="docker-build-stream")

    def abandon(self) -> None:
        """Send no more of the context (what the engine has not received, it does not build)."""
        self._upload.abandoned = True

    def follow(self, log: list[str], on_log: Log | None) -> str:
        """Start the build; each line to ``log`` and ``on_log`` as it comes; the built image's
        ID at the end."""
        self._thread.start()
        while (text := self._lines.get()) is not None:
            log.append(text)
            if on_log:
                on_log(text.rstrip("\n"))
        if self.error is not None:
            raise self.error
        if self.image_id is None:  # never: _read sets an error then
            raise ImageBuildError("docker build ended without an image id")
        return self.image_id

    def ended(self, wait: float) -> bool:
        """Whether the stream has ended, or the build never started (waiting up to ``wait``
        seconds): then ``made`` is complete."""
        if self._thread.ident is None:
            return True
        self._thread.join(wait)
        return not self._thread.is_alive()

    def _read(self, start: Callable[[], Iterable[dict]]) -> None:
        step = ""
        step_output: list[str] = []
        cached = False
        try:
            for chunk in start():
                if "error" in chunk or "errorDetail" in chunk:
                    detail = chunk.get("errorDetail", {}).get("message") or chunk.get("error", "")
                    self.error = ImageBuildError(f"docker build failed: {detail.strip()}", step,
                                                 "".join(step_output[-200:]))
                    return
                text = chunk.get("stream", "")
                if "aux" in chunk and "ID" in chunk["aux"]:
                    self.image_id = chunk["aux"]["ID"]
                if not text:
                    continue
                if _STEP.match(text):
                    step, step_output, cached = text.strip(), [], False
                else:
                    step_output.append(text)
                    cached = cached or text.strip() == "---> Using cache"
                    layer = _LAYER.match(text.rstrip("\n"))
                    if layer and not cached and " : FROM " not in step:
                        self.made.append(layer.group(1))
                    container = _RUNNING.match(text.rstrip("\n"))
                    if container:
                        self.running.append(container.group(1))
                self._lines.put(text)
            if self.image_id is None:
                self.error = ImageBuildError("docker build ended without an image id", step,
                                             "".join(step_output[-200:]))
        except Exception as error:  # noqa: BLE001 - the connection broke: the caller raises it
            self.error = error
        finally:
            self._lines.put(None)


def discard_build(client: docker.DockerClient, made: list[str], running: list[str],
                  build: _BuildStream | None = None, wait: float = 60.0,
                  removal_wait: float = 15.0) -> None:
    """Remove what a failed or interrupted build made; a second interrupt waits for it.

    The engine does not stop a build whose stream the client left (the SDK keeps the response
    open): it goes on with the next step. A ``RUN`` step's container holds the last layer, and
    removing it fails the step and ends the build; a ``COPY`` step runs in no container and
    cannot be stopped. So the step containers are removed until the stream has ended (up to
    ``wait`` seconds), and only then the layers (``made`` is complete), again until none is
    left or ``removal_wait`` seconds have passed. Not before: the engine commits the running
    step's layer on the newest one, and with that one removed meanwhile the commit fails
    half-way ("failed to set parent"), leaving a layer with no parent that no stream names.
    """
    with deferred_interrupts():
        if build is not None:
            build.abandon()
        deadline = time.monotonic() + wait
        while True:
            _remove_step_containers(client, made, running)
            if build is None or build.ended(0.5) or time.monotonic() > deadline:
                break
        deadline = time.monotonic() + removal_wait
        while True:
            made.extend(_descendants(client, made))
            if not remove_images(client, reversed(made)) or time.monotonic() > deadline:
                return
            time.sleep(0.2)
            _remove_step_containers(client, made, running)


def _remove_step_containers(client: docker.DockerClient, made: list[str],
                            running: list[str]) -> None:
    for container_id in running + _step_containers(client, made):
        try:
            client.api.remove_container(container_id, force=True)
        except docker.errors.APIError:
            pass


def _descendants(client: docker.DockerClient, layers: list[str]) -> list[str]:
    """Images made on top of ``layers`` that the build's stream did not name (the engine
    committed them after the stream ended): the build's own too, whatever made them, since
    no other build starts from a layer only this one made."""
    if not layers:
        return []
    known = {layer[:12] for layer in layers}
    try:
        newer = client.api.images(all=True, quiet=True, filters={"since": layers[0]})
    except docker.errors.APIError:
        return []
    found = []
    for image_id in newer:
        try:
            parent = client.api.inspect_image(image_id).get("Parent", "")
        except docker.errors.APIError:
            continue
        short = image_id.removeprefix("sha256:")[:12]
        if parent.removeprefix("sha256:")[:12] in known and short not in known:
            found.append(image_id)
            known.add(short)
    return found


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
