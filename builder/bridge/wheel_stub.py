"""A prebuilt stub for another Python, from the ``nvidia-pytriton`` wheel of the release's Triton.

PyTriton's wheels bundle one Triton each with python backend stubs for several Pythons (see
:data:`builder.base.releases.PYTRITON_STUBS`): where the release's Triton is among them, the
stub is taken from there rather than compiled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder.cache import cache_dir
from builder.tritonserver.wheel import (
    PYTRITON_REQUIREMENT,
    DistributionError,
    download_wheel,
    triton_distribution,
    unpack_wheel,
    wheel_digest,
)


@dataclass(frozen=True)
class WheelStub:
    """A python backend stub taken out of an ``nvidia-pytriton`` wheel, for a bridged image."""

    path: Path
    libraries: tuple[Path, ...]
    """The wheel's vendored libraries the stub loads (``libcudart-<hash>.so``): its RPATH points
    into the wheel, so they travel in the environment's ``lib/``."""
    requirement: str


def wheel_stub(requirement: str, python_version: str) -> WheelStub:
    """The stub for ``python_version`` from the wheel ``requirement`` (``nvidia-pytriton==X``)."""
    if requirement == PYTRITON_REQUIREMENT:
        root = triton_distribution().root
    else:
        wheel = download_wheel(requirement)
        root = cache_dir("tritonserver") / f"stubs-{wheel_digest(wheel)[:16]}"
        if not (root / ".complete").exists():
            unpack_wheel(wheel, root, ("pytriton/tritonserver/python_backend_stubs/",
                                  "nvidia_pytriton.libs/"))
    stub = root / "pytriton/tritonserver/python_backend_stubs" / python_version / (
        "triton_python_backend_stub")
    if not stub.is_file():
        held = sorted(p.name for p in stub.parent.parent.iterdir())
        raise DistributionError(f"{requirement} has no python backend stub for Python "
                                f"{python_version} (it holds {', '.join(held)})")
    binary = stub.read_bytes()
    libraries = tuple(library for library in sorted((root / "nvidia_pytriton.libs").iterdir())
                      if library.name.encode() + b"\0" in binary)
    return WheelStub(path=stub, libraries=libraries, requirement=requirement)

