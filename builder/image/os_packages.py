"""The OS packages a base image lists: dpkg's status database, read without running the image.

Debian and Ubuntu images (our CPU bases, every NGC release) record what is installed in
``/var/lib/dpkg/status``; ``/etc/os-release`` names the distribution, which the package URLs
need (``pkg:deb/debian/bash@5.2.15-2+b2?arch=amd64&distro=debian-12``). Both are read through
the engine's archive endpoint (:mod:`builder.engine.image_files`) and parsed with
``python-debian``. An image without dpkg lists nothing: the bill of materials then says so
rather than guessing.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import docker
from debian.deb822 import Deb822

from builder.engine.image_files import read_image_files

DPKG_STATUS = "/var/lib/dpkg/status"
OS_RELEASE = "/etc/os-release"
OS_RELEASE_FALLBACK = "/usr/lib/os-release"
"""os-release(5): read /etc/os-release, and /usr/lib/os-release where it does not exist."""


@dataclass(frozen=True)
class OsPackage:
    """One installed dpkg package."""

    name: str
    version: str
    architecture: str
    source: str = ""
    """The source package, where it differs from ``name`` (``Source:``, without its version)."""


@dataclass(frozen=True)
class OsPackages:
    """What an image's package manager lists, and the distribution it belongs to."""

    distribution: str
    """os-release ``ID`` (``debian``, ``ubuntu``); empty when the image has no os-release."""
    distribution_version: str
    """os-release ``VERSION_ID`` (``12``, ``22.04``)."""
    packages: tuple[OsPackage, ...]


_READ: dict[str, OsPackages | None] = {}
"""Per image ID: an image's content never changes under its ID."""


def image_os_packages(client: docker.DockerClient, image_id: str) -> OsPackages | None:
    """The dpkg packages installed in ``image_id``; None when it has no dpkg status."""
    if image_id not in _READ:
        files = read_image_files(client, image_id, [DPKG_STATUS, OS_RELEASE, OS_RELEASE_FALLBACK])
        status = files[DPKG_STATUS]
        if status is None:
            _READ[image_id] = None
        else:
            release = parse_os_release((files[OS_RELEASE] or files[OS_RELEASE_FALLBACK]
                                        or b"").decode("utf-8", "replace"))
            _READ[image_id] = OsPackages(release.get("ID", ""), release.get("VERSION_ID", ""),
                                         parse_dpkg_status(status.decode("utf-8", "replace")))
    return _READ[image_id]


def parse_dpkg_status(text: str) -> tuple[OsPackage, ...]:
    """The installed packages of a dpkg status file, sorted by name and architecture.

    Packages dpkg knows but that are not installed (removed with their configuration kept,
    half-installed) are left out: ``Status`` must end in ``installed``.
    """
    packages = []
    for paragraph in Deb822.iter_paragraphs(text.splitlines(keepends=True)):
        if not paragraph.get("Package") or not paragraph.get("Status", "").endswith(
                " installed"):
            continue
        source = paragraph.get("Source", "").split(" ", 1)[0]
        packages.append(OsPackage(
            name=paragraph["Package"], version=paragraph.get("Version", ""),
            architecture=paragraph.get("Architecture", ""),
            source=source if source != paragraph["Package"] else ""))
    return tuple(sorted(packages, key=lambda p: (p.name, p.architecture)))


def parse_os_release(text: str) -> dict[str, str]:
    """``KEY=value`` lines of os-release(5), values unquoted as the shell would."""
    fields = {}
    for line in text.splitlines():
        key, equals, value = line.strip().partition("=")
        if not equals or key.startswith("#"):
            continue
        try:
            words = shlex.split(value)
        except ValueError:
            continue
        fields[key] = words[0] if words else ""
    return fields
