"""What a compiled binary's dynamic section says, read with binutils' ``readelf -d``."""

from __future__ import annotations

import subprocess
from pathlib import Path

from builder.host_packages import ensure_program


def dynamic_section(binary: Path) -> str:
    """``readelf -d binary``: its NEEDED libraries, RPATH or RUNPATH, …"""
    return subprocess.run([ensure_program("readelf", "binutils"), "-d", str(binary)],
                          capture_output=True, text=True, check=True).stdout


def needed_libraries(dynamic: str) -> list[str]:
    """The NEEDED entries of a :func:`dynamic_section`, in its order."""
    return [line.split("[")[1].rstrip("]") for line in dynamic.splitlines()
            if "(NEEDED)" in line]
