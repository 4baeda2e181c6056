"""Image references (``[host[:port]/]path[:tag]``): the one parser every stage uses.

The grammar is the distribution project's (lowercase path components, tags of at most 128 word
characters), so anything else — spaces, newlines, ``$(...)``, quotes — is refused before it
reaches the engine or a Dockerfile. The split follows the engine: the first component is a
registry host only when it holds a ``.`` or a ``:`` or is ``localhost``; otherwise the image is
on Docker Hub, where one-component names live under ``library/``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from builder.errors import TritonBuilderError

DOCKER_HUB = "registry-1.docker.io"

_NAME_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = (r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)"
         r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?")
_GRAMMAR = re.compile(
    rf"(?:(?P<host>{_HOST})/)?"
    rf"(?P<path>{_NAME_COMPONENT}(?:/{_NAME_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
)


class InvalidReferenceError(TritonBuilderError, ValueError):
    """Not a valid image reference."""


@dataclass(frozen=True)
class ImageReference:
    """A parsed reference: ``host`` is ``None`` for Docker Hub, ``tag`` defaults to ``latest``."""

    host: str | None
    path: str
    tag: str

    @classmethod
    def parse(cls, text: str) -> ImageReference:
        if not isinstance(text, str) or not _GRAMMAR.fullmatch(text):
            raise InvalidReferenceError(
                f"not a valid image reference ([host[:port]/]name[:tag], lowercase name): "
                f"{text!r}")
        remainder, tag = text, "latest"
        if ":" in text.rsplit("/", 1)[-1]:
            remainder, tag = text.rsplit(":", 1)
        first, _, rest = remainder.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            return cls(first, rest, tag)
        return cls(None, remainder, tag)

    @property
    def repository(self) -> str:
        """What ``docker tag`` and ``docker push`` take beside the tag."""
        return f"{self.host}/{self.path}" if self.host else self.path

    @property
    def registry(self) -> str:
        """The host the registry API is asked at."""
        return self.host or DOCKER_HUB

    @property
    def registry_path(self) -> str:
        """The repository's name in the registry API (Docker Hub's ``library/`` made explicit)."""
        return self.path if self.host or "/" in self.path else f"library/{self.path}"

    def __str__(self) -> str:
        return f"{self.repository}:{self.tag}"


def tag_references(image_name: str, tags: Iterable[str] = ()) -> list[str]:
    """``image_name`` and ``tags`` as full references, each checked; bare tags (``"latest"``)
    belong to ``image_name``'s repository."""
    name = ImageReference.parse(image_name)
    references = [image_name]
    for tag in tags:
        reference = tag if ("/" in tag or ":" in tag) else f"{name.repository}:{tag}"
        ImageReference.parse(reference)
        if reference not in references:
            references.append(reference)
    return references
