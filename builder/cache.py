"""Where Triton Builder keeps what it reuses between runs, and the content hashes that key it:
wheels, unpacked servers, environments, images."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from builder.errors import TritonBuilderError


class DownloadError(TritonBuilderError, RuntimeError):
    """``pip download`` fetched nothing for the requirement; ``output`` says why."""

    def __init__(self, requirement: str, output: str) -> None:
        super().__init__(f"pip download {requirement} failed:\n{output}")
        self.output = output


def cache_dir(*parts: str) -> Path:
    """Return (and create) ``$TRITON_BUILDER_CACHE/<parts>`` (``~/.cache/triton-builder``)."""
    root = os.environ.get("TRITON_BUILDER_CACHE") or Path.home() / ".cache" / "triton-builder"
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def cached_download(requirement: str, subdirectory: str, pattern: str, *options: str) -> Path:
    """The file ``pattern`` matches in ``cache_dir(subdirectory)``, fetched there with ``pip
    download --no-deps <options> requirement`` when none does yet (the newest match).

    pip writes into a hidden directory inside the cache's, and each finished file is renamed
    into place: pip copies into ``--dest`` as it goes, and another process looking for the
    same file then finds it half-written."""
    dest = cache_dir(subdirectory)
    found = sorted(dest.glob(pattern))
    if not found:
        with tempfile.TemporaryDirectory(prefix=".download-", dir=dest) as staging:
            result = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", *options, "--dest",
                 staging, requirement], capture_output=True, text=True)
            if result.returncode == 0:
                for name in os.listdir(staging):
                    os.replace(os.path.join(staging, name), dest / name)
        found = sorted(dest.glob(pattern))
        if result.returncode != 0 or not found:
            raise DownloadError(requirement, result.stderr.strip())
    return found[-1]


def marked_complete(entry: Path) -> bool:
    """Whether ``entry`` holds the ``.complete`` marker written last into its staging."""
    return (entry / ".complete").exists()


@contextmanager
def staged(entry: Path, complete: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """A new directory beside the cache ``entry`` to fill in the block; renamed to ``entry``
    when the block ends without an error, removed in any case.

    The cache's one way of writing what two processes may make at once: each fills its own
    directory, and the one that renames second finds the first one's entry and uses it. Only an
    entry that is not ``complete`` (an interrupted older builder's) is removed first: a whole
    one may be in use. Without ``complete``, the directory is marked (``.complete``, written
    last) and the mark is what makes an entry whole."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{entry.name}.partial-", dir=entry.parent))
    try:
        staging.chmod(0o755)
        yield staging
        if complete is None:
            (staging / ".complete").touch()
        _publish(staging, entry, complete or marked_complete)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _publish(staging: Path, entry: Path, complete: Callable[[Path], bool]) -> None:
    if entry.exists() and not complete(entry):
        shutil.rmtree(entry, ignore_errors=True)
    try:
        staging.rename(entry)
    except OSError:
        if not complete(entry):
            raise


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of one file's bytes, read in blocks (wheels and archives run to gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def content_hash(*parts: bytes | str | Path) -> str:
    """A sha256 over build inputs: bytes, text, files, or directories (walked in order)."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            for path in _files(part):
                digest.update(str(path.relative_to(part) if part.is_dir() else path.name).encode())
                digest.update(b"\0")
                with open(path, "rb") as stream:
                    for block in iter(lambda s=stream: s.read(1 << 20), b""):
                        digest.update(block)
        else:
            digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0\0")
    return digest.hexdigest()


def _files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    found = []
    for directory, subdirs, names in os.walk(root):
        subdirs.sort()
        found.extend(Path(directory, name) for name in sorted(names))
    return found
