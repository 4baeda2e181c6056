"""Where Triton Builder keeps what it reuses between runs, and the content hashes that key it:
wheels, unpacked servers, environments, images."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
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
    download --no-deps <options> requirement`` when none does yet (the newest match)."""
    dest = cache_dir(subdirectory)
    found = sorted(dest.glob(pattern))
    if not found:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", *options, "--dest", str(dest),
             requirement], capture_output=True, text=True)
        found = sorted(dest.glob(pattern))
        if result.returncode != 0 or not found:
            raise DownloadError(requirement, result.stderr.strip())
    return found[-1]


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
