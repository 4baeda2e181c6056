"""Target platforms (``linux/amd64``, ``linux/arm64``): what each is called by every tool a
build passes through, in one table.

One image is built per platform; the names differ by tool, and a mix-up fails late (a wheel for
the wrong machine, an index entry no engine picks), so every name comes from :data:`PLATFORMS`:

* ``architecture`` / ``variant``: the OCI image index's ``platform`` (Go's ``GOARCH``; arm64's
  variant ``v8``), as the engine writes it in image configs and as ``docker pull`` matches it
  (OCI image-spec ``image-index.md``; the engine normalises ``linux/arm64`` to ``arm64/v8``);
* ``machine``: ``uname -m`` inside the container, and the last part of a wheel's manylinux
  platform tag (PEP 600: ``manylinux_2_28_aarch64``);
* ``debian``: Debian's architecture name (``mmdebstrap --architectures``, dpkg's
  ``Architecture``);
* ``binfmt``: the name ``binfmt-support`` / ``qemu-user-static`` register the emulator under in
  ``/proc/sys/fs/binfmt_misc`` (Debian's ``qemu-user-static``: ``qemu-aarch64``, ``qemu-x86_64``).
"""

from __future__ import annotations

import platform as host
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from builder.engine.reference import ImageReference
from builder.errors import TritonBuilderError


class UnknownPlatformError(TritonBuilderError, ValueError):
    """A platform string that is not one of :data:`PLATFORMS` (bad input: refused at once)."""


@dataclass(frozen=True)
class Platform:
    """One target platform, by each tool's name for it."""

    name: str
    """``linux/arm64``: what users write, ``--platform`` of the engine."""
    architecture: str
    variant: str | None
    machine: str
    debian: str
    binfmt: str

    @property
    def os(self) -> str:
        return self.name.split("/")[0]

    @property
    def tag_suffix(self) -> str:
        """What a per-platform tag adds to a tag (``1`` → ``1-arm64``)."""
        return self.architecture

    def matches(self, image_attrs: Mapping[str, Any]) -> bool:
        """Whether an engine's image (its ``docker inspect`` attributes) is of this platform: a
        base of another architecture builds an image that fails with ``exec format error``."""
        return image_attrs.get("Architecture") == self.architecture

    def index_entry(self) -> dict[str, str]:
        """The ``platform`` object of an OCI image index entry."""
        return {"architecture": self.architecture, "os": self.os,
                **({"variant": self.variant} if self.variant else {})}

    def __str__(self) -> str:
        return self.name


AMD64 = Platform("linux/amd64", "amd64", None, "x86_64", "amd64", "qemu-x86_64")
ARM64 = Platform("linux/arm64", "arm64", "v8", "aarch64", "arm64", "qemu-aarch64")
PLATFORMS: dict[str, Platform] = {p.name: p for p in (AMD64, ARM64)}
"""Every platform images are built for, by name."""
ALIASES = {"linux/arm64/v8": ARM64, "linux/x86_64": AMD64, "linux/aarch64": ARM64}
"""Other spellings the engine and ``uname`` use for the same platforms."""
DEFAULT_PLATFORM = AMD64
"""The platform of a build that names none, and the one whose tags carry no suffix."""


def image_platform_name(image_attrs: Mapping[str, Any]) -> str:
    """``linux/arm64``: the platform an engine's image says it is of (for messages)."""
    return f"{image_attrs.get('Os')}/{image_attrs.get('Architecture')}"


def platform_option(target: Platform | None) -> str | None:
    """What a build or a run of ``target``'s image passes the engine as ``--platform``: its
    name, but nothing for :data:`DEFAULT_PLATFORM`, whose builds and runs stay the engine's
    plain ones."""
    return target.name if target is not None and target != DEFAULT_PLATFORM else None


def parse_platform(text: str | Platform) -> Platform:
    """The :class:`Platform` named ``text`` (``linux/arm64``); :class:`UnknownPlatformError`
    naming it and the supported ones otherwise."""
    if isinstance(text, Platform):
        return text
    key = str(text).strip().lower()
    found = PLATFORMS.get(key) or ALIASES.get(key)
    if found is None:
        raise UnknownPlatformError(
            f"unknown platform {text!r}: images are built for {', '.join(PLATFORMS)}")
    return found


def parse_platforms(texts: Iterable[str | Platform] | None) -> tuple[Platform, ...]:
    """Each platform once, in the order given; ``None`` or empty: :data:`DEFAULT_PLATFORM`."""
    chosen: list[Platform] = []
    for text in texts or ():
        found = parse_platform(text)
        if found not in chosen:
            chosen.append(found)
    return tuple(chosen) or (DEFAULT_PLATFORM,)


def platform_of_machine(machine: str) -> Platform | None:
    """The platform whose ``uname -m`` (or OCI architecture) is ``machine``."""
    return next((p for p in PLATFORMS.values() if machine in (p.machine, p.architecture)), None)


def host_platform() -> Platform | None:
    """The platform this process runs on (None: a machine no image is built for)."""
    return platform_of_machine(host.machine())


def per_platform_tag(tag: str, target: Platform) -> str:
    """The tag of ``target``'s image in a multi-platform build: ``1`` → ``1-arm64``."""
    return f"{tag}-{target.tag_suffix}"


def platform_references(references: list[str], target: Platform) -> list[str]:
    """Each of ``references`` (``host/name:1``) with ``target``'s tag (``host/name:1-arm64``)."""
    found = []
    for reference in references:
        parsed = ImageReference.parse(reference)
        found.append(f"{parsed.repository}:{per_platform_tag(parsed.tag, target)}")
    return found
