"""Where Triton Builder keeps what it reuses between runs, and the content hashes that key it:
wheels, unpacked servers, environments, images."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """Return (and create) ``$TRITON_BUILDER_CACHE/<parts>`` (``~/.cache/triton-builder``)."""
    root = os.environ.get("TRITON_BUILDER_CACHE") or Path.home() / ".cache" / "triton-builder"
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


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
