"""A wheel's own ``METADATA``, read from an index without downloading the wheel.

Choosing a torch build for a CUDA version must rest on what the wheel declares (its
``Requires-Dist: nvidia-cuda-runtime-cu12==12.4.127``), not on its name: PyPI's plain
``torch-2.6.0`` is a CUDA 12.4 build, ``torch-2.13.0`` a CUDA 13 one. Wheels are gigabytes, so
the metadata comes from the index's PEP 658 file (``<wheel url>.metadata``) where it has one,
and otherwise from the wheel itself with HTTP range requests: a wheel is a zip, whose central
directory at the end says where ``*.dist-info/METADATA`` lies (what pip's ``fast-deps`` does).
Index listings are read as PEP 691 JSON, or as PEP 503 HTML (PyTorch's index).
"""

from __future__ import annotations

import io
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from builder.environment.errors import IndexUnreachableError

TIMEOUT = 20.0
_BLOCK = 1 << 18
_JSON = "application/vnd.pypi.simple.v1+json"


@dataclass(frozen=True)
class WheelFile:
    """One wheel an index lists."""

    filename: str
    url: str
    version: Version
    tags: frozenset[Tag]
    metadata_url: str | None
    """The PEP 658 metadata file, where the index says it has one (else it may still exist)."""


def ssl_context(ca_bundle: str | Path | None = None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle else None)


def list_wheels(index_url: str, project: str, *, context: ssl.SSLContext | None = None,
                timeout: float = TIMEOUT) -> list[WheelFile]:
    """The wheels of ``project`` that the simple index at ``index_url`` lists (yanked left out)."""
    url = f"{index_url.rstrip('/')}/{canonicalize_name(project)}/"
    request = urllib.request.Request(url, headers={"Accept": f"{_JSON}, text/html;q=0.5"})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            kind = response.headers.get("Content-Type", "")
            body = response.read().decode("utf-8", errors="replace")
            base = response.geturl()
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise IndexUnreachableError(f"{url}: {getattr(error, 'reason', error)}") from error
    entries = _json_entries(body) if "json" in kind else _html_entries(body)
    wheels = []
    for filename, href, metadata, yanked in entries:
        if yanked or not filename.endswith(".whl"):
            continue
        try:
            _, version, _, tags = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            continue
        absolute = urllib.parse.urljoin(base, href)
        wheels.append(WheelFile(filename=filename, url=absolute.split("#")[0], version=version,
                                tags=frozenset(tags),
                                metadata_url=absolute.split("#")[0] + ".metadata" if metadata
                                else None))
    return wheels


def compatible_wheels(wheels: list[WheelFile], python_version: str,
                      platforms: Sequence[str]) -> list[WheelFile]:
    """The wheels a CPython ``python_version`` on one of ``platforms`` installs."""
    interpreter = "cp" + python_version.replace(".", "")
    allowed = set(platforms)
    return [w for w in wheels if any(t.interpreter == interpreter and t.platform in allowed
                                     and t.abi in (interpreter, "abi3", "none")
                                     for t in w.tags)]


def marker_environment(python_version: str, machine: str, extra: str = "") -> dict[str, str]:
    """What the markers of a wheel's ``Requires-Dist`` lines are evaluated against: CPython
    ``python_version`` on Linux ``machine`` — the image's, not this host's."""
    return {"platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
            "platform_machine": machine, "python_version": python_version,
            "python_full_version": f"{python_version}.0", "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "extra": extra}


def read_metadata(wheel: WheelFile, *, context: ssl.SSLContext | None = None,
                  timeout: float = TIMEOUT) -> tuple[str, str]:
    """The wheel's ``METADATA`` text, and how it was read (``index metadata``/``range``)."""
    try:
        with urllib.request.urlopen(wheel.url + ".metadata", timeout=timeout,
                                    context=context) as response:
            return response.read().decode("utf-8", errors="replace"), "the index's metadata file"
    except urllib.error.HTTPError as error:
        if error.code not in (403, 404):
            raise IndexUnreachableError(f"{wheel.url}.metadata: {error}") from error
    except (urllib.error.URLError, OSError) as error:
        raise IndexUnreachableError(f"{wheel.url}.metadata: {error}") from error
    try:
        with zipfile.ZipFile(_RangeFile(wheel.url, context, timeout)) as archive:
            return _metadata_member(archive, wheel.filename), "the wheel's METADATA (range reads)"
    except (urllib.error.URLError, OSError, zipfile.BadZipFile) as error:
        raise IndexUnreachableError(f"{wheel.url}: cannot read its METADATA: {error}") from error


def local_metadata(path: str | Path) -> str:
    """``METADATA`` of a wheel file on disk."""
    with zipfile.ZipFile(path) as archive:
        return _metadata_member(archive, Path(path).name)


def _metadata_member(archive: zipfile.ZipFile, filename: str) -> str:
    names = [n for n in archive.namelist()
             if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
    if len(names) != 1:
        raise zipfile.BadZipFile(f"{filename} has {len(names)} */.dist-info/METADATA files")
    return archive.read(names[0]).decode("utf-8", errors="replace")


def _json_entries(body: str) -> list[tuple[str, str, bool, bool]]:
    document = json.loads(body)
    return [(f["filename"], f["url"],
             bool(f.get("core-metadata", f.get("dist-info-metadata", False))),
             bool(f.get("yanked", False))) for f in document.get("files", [])]


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.entries: list[tuple[str, str, bool, bool]] = []
        self._current: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._current = dict(attrs)

    def handle_data(self, data: str) -> None:
        if self._current is not None and data.strip():
            attrs = self._current
            metadata = any(key in attrs for key in ("data-core-metadata",
                                                    "data-dist-info-metadata"))
            self.entries.append((data.strip(), attrs.get("href") or "", metadata,
                                 "data-yanked" in attrs))
            self._current = None


def _html_entries(body: str) -> list[tuple[str, str, bool, bool]]:
    parser = _Anchors()
    parser.feed(body)
    return parser.entries


class _RangeFile(io.RawIOBase):
    """A remote file read with HTTP range requests, in cached blocks (for :mod:`zipfile`)."""

    def __init__(self, url: str, context: ssl.SSLContext | None, timeout: float) -> None:
        self.url, self.context, self.timeout = url, context, timeout
        self.position = 0
        self.blocks: dict[int, bytes] = {}
        self.size = self._size()

    def _size(self) -> int:
        request = urllib.request.Request(self.url, headers={"Range": "bytes=0-0"})
        with urllib.request.urlopen(request, timeout=self.timeout,
                                    context=self.context) as response:
            content_range = response.headers.get("Content-Range", "")
            if response.status != 206 or "/" not in content_range:
                raise OSError(f"{self.url}: the server does not answer range requests")
            return int(content_range.rsplit("/", 1)[1])

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def read(self, size: int = -1) -> bytes:
        end = self.size if size is None or size < 0 else min(self.size, self.position + size)
        parts = []
        while self.position < end:
            index = self.position // _BLOCK
            block = self._block(index)
            start = self.position - index * _BLOCK
            piece = block[start:start + end - self.position]
            parts.append(piece)
            self.position += len(piece)
        return b"".join(parts)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def _block(self, index: int) -> bytes:
        if index not in self.blocks:
            first = index * _BLOCK
            last = min(self.size, first + _BLOCK) - 1
            request = urllib.request.Request(self.url, headers={"Range": f"bytes={first}-{last}"})
            with urllib.request.urlopen(request, timeout=self.timeout,
                                        context=self.context) as response:
                self.blocks[index] = response.read()
        return self.blocks[index]
