"""The digest a compiled stub has once the builder has placed it in a model directory.

The builder gives a stub beside an unpacked environment an RPATH into that environment
(``builder.environment.stub_rpath``), so the served file is the compiled one with that one
change: comparing it with the cache's bytes would fail for the right build.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from builder.environment.stub_rpath import point_at_environment


def placed_stub_sha256(compiled: Path) -> str:
    """SHA-256 of ``compiled`` after the same RPATH edit the builder makes."""
    with tempfile.TemporaryDirectory() as scratch:
        placed = Path(scratch) / compiled.name
        shutil.copyfile(compiled, placed)
        point_at_environment(placed)
        return hashlib.sha256(placed.read_bytes()).hexdigest()
