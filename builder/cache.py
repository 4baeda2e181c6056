"""Where Triton Builder keeps what it reuses between runs: wheels, unpacked servers, contexts."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """Return (and create) ``$TRITON_BUILDER_CACHE/<parts>`` (``~/.cache/triton-builder``)."""
    root = os.environ.get("TRITON_BUILDER_CACHE") or Path.home() / ".cache" / "triton-builder"
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
