"""A download into the cache is seen whole or not at all by another process looking for it.

The wheel is a local file of 64 MB that ``pip download`` copies, as it copies what it fetched
from an index: big enough that a second process looking while pip writes would see it
half-written, and no network needed.
"""

from __future__ import annotations

import os
import time
import zipfile
from pathlib import Path

import pytest

from builder.cache import cache_dir, cached_download
from tests.support.at_once import at_once

PATTERN = "bulky-1.0-*.whl"


@pytest.fixture
def wheel(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("TRITON_BUILDER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "source" / "bulky-1.0-py3-none-any.whl"
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("bulky/__init__.py", "")
        archive.writestr("bulky/blob.bin", os.urandom(64 << 20))
        archive.writestr("bulky-1.0.dist-info/METADATA",
                         "Metadata-Version: 2.1\nName: bulky\nVersion: 1.0\n")
        archive.writestr("bulky-1.0.dist-info/WHEEL",
                         "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n")
        archive.writestr("bulky-1.0.dist-info/RECORD", "")
    return path


def _download(wheel: Path) -> str:
    return cached_download(str(wheel), "wheels", PATTERN).name


def _watch(deadline: float) -> list[str]:
    """Look for the wheel in the cache until it is there whole: what was seen before."""
    dest = cache_dir("wheels")
    seen: set[str] = set()
    while time.monotonic() < deadline:
        for path in dest.glob(PATTERN):
            try:
                if zipfile.is_zipfile(path):
                    return sorted(seen)
                seen.add(f"{path.name} at {path.stat().st_size} bytes, not a whole zip")
            except OSError as error:
                seen.add(f"{path.name}: {error}")
    return [*sorted(seen), "the wheel never appeared whole"]


def test_another_process_never_finds_a_half_written_download(wheel):
    name, seen = at_once(lambda which: _download(wheel) if which == "download"
                         else _watch(time.monotonic() + 60), [("download",), ("watch",)])
    assert name == wheel.name
    assert seen == []
    assert [p.name for p in cache_dir("wheels").iterdir()] == [wheel.name]


def test_two_processes_downloading_at_once_both_get_the_whole_wheel(wheel):
    names = at_once(_download, [(wheel,)] * 2)
    assert names == [wheel.name] * 2
    assert (cache_dir("wheels") / wheel.name).read_bytes() == wheel.read_bytes()
    assert [p.name for p in cache_dir("wheels").iterdir()] == [wheel.name]
