"""What the cache holds is seen whole or not at all by another process looking for it: a
download, and an entry filled through :func:`builder.cache.staged`.

The wheel is a local file of 64 MB that ``pip download`` copies, as it copies what it fetched
from an index: big enough that a second process looking while pip writes would see it
half-written, and no network needed.
"""

from __future__ import annotations

import os
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from builder.cache import (
    build_scratch,
    cache_dir,
    cached_download,
    marked_complete,
    staged,
    stale_scratches,
    stale_stagings,
)
from tests.support.at_once import at_once
from tests.support.staging_holder import StagingHolder

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


def test_a_staged_entry_appears_whole_with_its_mark_and_nothing_beside_it(tmp_path):
    entry = tmp_path / "entries" / "abc"
    with staged(entry) as staging:
        assert staging.parent == entry.parent and not entry.exists()
        (staging / "payload").write_text("made")
    assert (entry / "payload").read_text() == "made" and marked_complete(entry)
    assert os.listdir(entry.parent) == ["abc"]


def test_a_failed_block_leaves_no_entry_and_no_staging(tmp_path):
    entry = tmp_path / "abc"
    with pytest.raises(RuntimeError, match="pip failed"):
        with staged(entry) as staging:
            (staging / "half").write_text("half-written")
            raise RuntimeError("pip failed")
    assert os.listdir(tmp_path) == []


def test_a_whole_entry_is_kept_and_an_unfinished_one_replaced(tmp_path):
    """The second of two makers finds the first one's entry and uses it (it may be in use);
    one an interrupted builder left without its mark is made again."""
    entry = tmp_path / "abc"
    entry.mkdir()
    (entry / "first").write_text("interrupted")
    with staged(entry) as staging:
        (staging / "second").write_text("whole")
    assert sorted(os.listdir(entry)) == [".complete", "second"]
    with staged(entry) as staging:
        (staging / "third").write_text("also whole")
    assert sorted(os.listdir(entry)) == [".complete", "second"]
    assert os.listdir(tmp_path) == ["abc"]


def test_an_entry_whole_by_its_own_rule_gets_no_mark(tmp_path):
    entry = tmp_path / "stub"
    with staged(entry, lambda at: (at / "binary").is_file()) as staging:
        (staging / "binary").write_bytes(b"\x7fELF")
    assert os.listdir(entry) == ["binary"]


def test_a_killed_makers_staging_goes_with_the_next_make_and_a_living_ones_stays(tmp_path):
    """A maker killed outright (SIGKILL) cleans nothing up; its staging is found by its lock,
    which the kernel let go, and the next maker of the entry removes it. One whose maker still
    fills it is neither listed nor removed, and that maker then finishes as usual."""
    entry = tmp_path / "entries" / "abc"
    killed, living = StagingHolder(entry), StagingHolder(entry)
    killed.kill()
    assert killed.staging.is_dir() and living.staging.is_dir()
    assert stale_stagings(tmp_path) == [killed.staging]
    with staged(entry) as staging:
        (staging / "whole").write_text("made")
    assert not killed.staging.exists() and living.staging.is_dir()
    assert living.finish() == 0
    assert sorted(os.listdir(entry.parent)) == ["abc"]
    assert sorted(os.listdir(entry)) == [".complete", "whole"]


def test_a_killed_builds_working_directory_goes_with_the_next_build_and_a_living_ones_stays(
        tmp_path, monkeypatch):
    """A build killed outright leaves its working directory (a model repository, a payload,
    hundreds of MB) in the temporary directory; it is found by its lock, which the kernel let
    go, and the next build removes it. A running build's stays, and that build removes its own
    when it ends. Nothing else there is taken for one."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "triton-builder-drain").mkdir()  # the image's drain state: not a build's
    killed, living = StagingHolder(temporary=tmp_path), StagingHolder(temporary=tmp_path)
    killed.kill()
    assert killed.staging.parent == living.staging.parent == tmp_path
    assert stale_scratches() == [killed.staging]
    with build_scratch() as scratch:
        assert not killed.staging.exists() and living.staging.is_dir()
    assert not scratch.exists()
    assert living.finish() == 0
    assert os.listdir(tmp_path) == ["triton-builder-drain"]
