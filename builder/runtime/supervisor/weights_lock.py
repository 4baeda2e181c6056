"""The weights lock: which files an image's models need, by digest, and where a node keeps them.

An image built with its weights beside it (``weights="artifact"``) carries no weight file. It
carries this lock instead (:data:`LOCK_PATH`, JSON): the registry repository that holds the
weights, and for each model operator its files — each one's path in the model repository, its
``sha256:`` digest and its size. Each such path in the image is a symbolic link into the
node's cache (:func:`blob_path`), so nothing in the image is written at start: the supervisor
fills the cache (:mod:`.weights_fetch`) before it starts the server, and Triton follows the
links.

The cache (:data:`CACHE_DIR`, a volume: ``docker run -v triton-builder-weights:…``, a
PersistentVolumeClaim, a host directory; without one, the image's own ``VOLUME`` gives each
container an anonymous one) holds ``blobs/sha256/<hex>``, each a file whose content has that
digest — written only after it was checked, renamed into place whole — and ``partial/<hex>``,
a fetch under way, which a later start resumes. A file in the cache is used only when its
digest is again the lock's (:func:`verify_blob`): a cache shared by many containers on a node
cannot hand a model a file another process damaged.

Standard library only, Python 3.8 and later: it runs with the image's own ``python3``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOCK_PATH = "/opt/triton-builder/weights.lock.json"
LOCK_VARIABLE = "TRITON_BUILDER_WEIGHTS_LOCK"
CACHE_DIR = "/var/cache/triton-builder/weights"
CACHE_VARIABLE = "TRITON_BUILDER_WEIGHTS_CACHE"
"""Another cache directory: the image's links point into :data:`CACHE_DIR`, so only where the
model repository is not the image's (a test, a server of one's own)."""
CACHE_VOLUME = "triton-builder-weights"
"""The named volume ``serve`` and ``deploy swarm`` give every container of a node."""
SCHEMA = 1
READ_SIZE = 1024 * 1024


class WeightsError(RuntimeError):
    """The weights cannot be put in place: the container must not start its server."""


@dataclass(frozen=True)
class WeightFile:
    """One file of a model operator, as the lock names it."""

    model: str
    path: str
    """Its path in the image (in the model repository), a link into the cache."""
    digest: str
    size: int

    @property
    def hex(self) -> str:
        return self.digest.split(":", 1)[1]

    def describe(self) -> str:
        return f"model operator {self.model!r}: {self.path} ({self.digest})"


@dataclass(frozen=True)
class WeightsLock:
    """The repository that holds the weights, and every file of every model operator."""

    repository: str
    """``host[:port]/name`` of the registry repository the image was pushed to."""
    files: tuple[WeightFile, ...]

    @property
    def models(self) -> list[str]:
        return sorted({file.model for file in self.files})

    @property
    def size(self) -> int:
        return sum(file.size for file in self.unique())

    def unique(self) -> list[WeightFile]:
        """Each digest once (two models may hold the same file)."""
        seen: dict[str, WeightFile] = {}
        for file in self.files:
            seen.setdefault(file.digest, file)
        return list(seen.values())

    def to_json(self) -> str:
        models: dict[str, list[dict[str, Any]]] = {}
        for file in sorted(self.files, key=lambda f: (f.model, f.path)):
            models.setdefault(file.model, []).append(
                {"path": file.path, "digest": file.digest, "size": file.size})
        document = {"schema": SCHEMA, "repository": self.repository, "models": models}
        return json.dumps(document, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = LOCK_PATH) -> WeightsLock:
        try:
            document = json.loads(text)
            if document.get("schema") != SCHEMA:
                raise WeightsError(f"{source}: schema {document.get('schema')!r}, this "
                                   f"supervisor reads schema {SCHEMA}")
            files = tuple(
                WeightFile(model, entry["path"], _digest(entry["digest"]), int(entry["size"]))
                for model, entries in sorted(document["models"].items())
                for entry in entries)
            return cls(str(document["repository"]), files)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise WeightsError(f"{source} is not a weights lock: {error}") from None


def read_lock(path: str | os.PathLike[str]) -> WeightsLock:
    return WeightsLock.from_json(Path(path).read_text(), str(path))


def blob_path(digest: str, cache: str | os.PathLike[str] = CACHE_DIR) -> Path:
    """Where the file of ``digest`` sits in the cache once checked."""
    algorithm, _, hex_digest = _digest(digest).partition(":")
    return Path(cache) / "blobs" / algorithm / hex_digest


def partial_path(digest: str, cache: str | os.PathLike[str] = CACHE_DIR) -> Path:
    """Where a fetch of ``digest`` under way keeps what it has (a later start resumes it)."""
    return Path(cache) / "partial" / _digest(digest).partition(":")[2]


def verify_blob(file: WeightFile, cache: str | os.PathLike[str] = CACHE_DIR) -> bool:
    """Whether the cache holds ``file`` whole: its size, then its digest read again. A file
    found damaged is removed, so that it is fetched again."""
    path = blob_path(file.digest, cache)
    try:
        if path.stat().st_size != file.size:
            path.unlink()
            return False
        if sha256_of(path) != file.digest:
            path.unlink()
            return False
    except FileNotFoundError:
        return False
    return True


def sha256_of(path: str | os.PathLike[str], limit: int | None = None) -> str:
    """``sha256:…`` of the file at ``path`` (of its first ``limit`` bytes)."""
    return "sha256:" + hash_prefix(path, limit).hexdigest()


def hash_prefix(path: str | os.PathLike[str], limit: int | None = None) -> Any:
    """A sha256 object fed with the file's first ``limit`` bytes (all if None): a resumed
    fetch goes on hashing from there."""
    digest = hashlib.sha256()
    left = limit
    with open(path, "rb") as stream:
        while left is None or left > 0:
            chunk = stream.read(READ_SIZE if left is None else min(READ_SIZE, left))
            if not chunk:
                break
            digest.update(chunk)
            if left is not None:
                left -= len(chunk)
    return digest


def unnamed_blobs(cache: str | os.PathLike[str], digests: Iterable[str]) -> list[Path]:
    """Files of the cache whose digest is none of ``digests`` (every lock's): what ``doctor``
    lists."""
    named = set(digests)
    root = Path(cache) / "blobs" / "sha256"
    if not root.is_dir():
        return []
    return sorted(path for path in root.iterdir() if f"sha256:{path.name}" not in named)


def _digest(value: str) -> str:
    algorithm, _, hex_digest = str(value).partition(":")
    if algorithm != "sha256" or len(hex_digest) != 64 or not all(
            c in "0123456789abcdef" for c in hex_digest):
        raise WeightsError(f"not a sha256 digest: {value!r}")
    return f"sha256:{hex_digest}"
