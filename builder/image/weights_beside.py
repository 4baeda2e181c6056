"""An image whose weights travel beside it (``weights="artifact"``): the repository's weight
files leave the image, each replaced by a link into the node's weights cache, and the lock that
names them goes in.

Why links: the model repository stays the image's, read-only, at the paths Triton was given;
the supervisor fills the cache before the server starts
(:mod:`builder.runtime.supervisor.weights_fetch`), and the links — written at build time, their
targets named by digest — resolve from then on. A link's target is a digest, so the code layer
changes when a model's weights do, and the image's content hash with it.

The cache directory is in the image too, writable by every user and sticky (as ``/tmp``: the
layer stays reproducible, no ``chown`` of its parents), and declared a ``VOLUME``: a container
started without a volume of its own still gets a writable cache (an anonymous volume,
initialised from that directory), and one with ``-v
triton-builder-weights:/var/cache/triton-builder/weights`` shares it with every container of
the node, so each digest is fetched once per node.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path, PurePosixPath

from builder.image.context import LAYERS, ContextEntry, ContextPlan, file_digest
from builder.runtime.supervisor.weights_lock import (
    CACHE_DIR,
    LOCK_PATH,
    WeightFile,
    WeightsLock,
    blob_path,
)

WEIGHTS_CHOICES = ("image", "artifact")
CACHE_CONTEXT = "weights-cache"
"""The context directory that holds the empty cache directory at :data:`CACHE_DIR`."""


def weights_beside(plan: ContextPlan, repository: str) -> tuple[ContextPlan, WeightsLock,
                                                                 dict[WeightFile, Path]]:
    """``plan`` without its weight files (each a link into the cache, in the code layer),
    the lock naming them in ``repository``, and each locked file's source here (what the push
    and the verification send)."""
    entries: list[ContextEntry] = []
    sources: dict[WeightFile, Path] = {}
    for entry in plan.entries:
        if entry.layer != "weights":
            entries.append(entry)
            continue
        image_path = "/" + PurePosixPath(entry.path).relative_to("weights", entry.part).as_posix()
        code_path = f"code{image_path}"
        if entry.source is None:
            entries.append(replace(entry, layer="code", path=code_path, part="code"))
            continue
        file = WeightFile(entry.part, image_path, f"sha256:{file_digest(entry.source)}",
                          entry.source.stat().st_size)
        sources[file] = entry.source
        entries.append(ContextEntry("code", code_path, link=str(blob_path(file.digest)),
                                    part="code"))
    entries.sort(key=lambda e: (LAYERS.index(e.layer), e.path))
    lock = WeightsLock(repository, tuple(sources))
    return ContextPlan(tuple(entries), plan.model_repository), lock, sources


def write_cache_directory(context: Path) -> None:
    """The empty cache directory, at its place under :data:`CACHE_CONTEXT`: sticky and
    writable by every user, as ``/tmp`` (whoever the server runs as fills it; each file is
    checked by its digest before use)."""
    directory = context / CACHE_CONTEXT / CACHE_DIR.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o1777)


def write_lock(code: Path, lock: WeightsLock) -> None:
    """The lock, at :data:`LOCK_PATH` under the code layer's context directory."""
    target = code / LOCK_PATH.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(lock.to_json())
