"""The environment lock: what a packed environment holds, pinned, with the hashes of its wheels.

``pip freeze`` names every installed distribution and its version, but not which file it came
from; the wheels were downloaded on this host (:func:`builder.environment.packers.fetch_wheels`),
so their sha256 is added to each line in pip's hash-checking syntax
(``numpy==1.26.4 --hash=sha256:…``): the lock stays a requirements file that
``pip install --require-hashes -r`` accepts, and the image's bill of materials
(:mod:`builder.image.sbom`) reads names, versions and hashes from it. A conda lock
(:func:`builder.environment.packers.conda_lock`) holds ``name=version=build  # channel`` lines for
conda's packages; comment lines (``#``) carry what the packer said about the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    InvalidWheelFilename,
    NormalizedName,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import Version

from builder.cache import file_sha256
from builder.environment.errors import PackError


@dataclass(frozen=True)
class LockedPackage:
    """One distribution of a packed environment."""

    name: str
    version: str
    ecosystem: str
    """``pypi`` (installed by pip) or ``conda``."""
    hashes: tuple[str, ...] = ()
    """``sha256:<hex>`` of the file(s) it was installed from (pip's hash syntax)."""
    channel: str = ""
    """conda only: the channel it came from."""
    build: str = ""
    """conda only: the build string."""


def hash_lock(freeze: str, wheels: Path) -> str:
    """``pip freeze`` output with ``--hash=sha256:…`` of the wheel each line was installed from.

    Raises :class:`~builder.environment.errors.PackError` when a frozen ``name==version`` has no
    wheel in ``wheels``: the lock would then claim a file nobody can check.
    """
    digests: dict[tuple[NormalizedName, Version], list[str]] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        try:
            name, version, _, _ = parse_wheel_filename(wheel.name)
        except InvalidWheelFilename:
            continue
        digests.setdefault((name, version), []).append(f"sha256:{file_sha256(wheel)}")
    lines = []
    for line in freeze.splitlines():
        requirement = _pinned(line)
        if requirement is None:
            lines.append(line)
            continue
        name, version = requirement
        found = digests.get((canonicalize_name(name), Version(version)))
        if not found:
            raise PackError(f"the environment holds {name}=={version}, but no wheel of it was "
                            f"downloaded into {wheels}: cannot lock it with a hash")
        lines.append(line.strip() + "".join(f" --hash={digest}" for digest in sorted(found)))
    return "\n".join(lines) + "\n"


def read_lock(text: str) -> tuple[LockedPackage, ...]:
    """The packages a lock names (pip pins with their hashes, conda records), sorted by name."""
    packages = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        comment = raw.split(" #", 1)[1].strip() if " #" in raw else ""
        if not line or line.startswith("#"):
            continue
        words = line.split()
        hashes = tuple(word.removeprefix("--hash=") for word in words
                       if word.startswith("--hash="))
        pinned = _pinned(" ".join(word for word in words if not word.startswith("--")))
        if pinned is not None:
            packages.append(LockedPackage(pinned[0], pinned[1], "pypi", hashes))
            continue
        conda = words[0].split("=")
        if len(conda) == 3 and all(conda):
            packages.append(LockedPackage(conda[0], conda[1], "conda", channel=comment,
                                          build=conda[2]))
    return tuple(sorted(packages, key=lambda p: (canonicalize_name(p.name), p.ecosystem)))


def _pinned(line: str) -> tuple[str, str] | None:
    """(name, version) of a ``name==version`` line (options after it allowed); None otherwise."""
    text = line.split(" #", 1)[0].strip()
    if not text or text.startswith(("#", "-")):
        return None
    try:
        requirement = Requirement(text.split(" --", 1)[0].strip())
    except InvalidRequirement:
        return None
    specifiers = list(requirement.specifier)
    if requirement.url or len(specifiers) != 1 or specifiers[0].operator not in ("==", "==="):
        return None
    return requirement.name, specifiers[0].version


