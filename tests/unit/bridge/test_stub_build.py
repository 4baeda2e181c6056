"""A compiled stub laid into the cache from the build stage's archives: two processes that
compiled the same stub at once (two builds, two pytest-xdist workers) both end with the whole
entry, neither deleting the other's.

The archives are written by the test as the engine's ``get_archive`` answers them (a tar of the
stub, a tar of the ``python_backend`` folder); the stub is 48 MB, so that the two unpackings
overlap. The compiles themselves run in ``tests/e2e``.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path

from builder.bridge.stub_build import BACKEND_FILES, _place
from tests.support.at_once import at_once


def _archive(members: dict[str, bytes | None]) -> bytes:
    """A tar of ``members``: a file's bytes, or None for a folder."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                archive.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _place_and_read(archives: list[bytes], entry: Path) -> dict[str, str]:
    """Place the entry, then read back each of its files at once: its digest and mode."""
    _place(archives, entry, True)
    return {p.name: f"{hashlib.sha256(p.read_bytes()).hexdigest()} "
                    f"{stat.S_IMODE(p.stat().st_mode):o}"
            for p in sorted(entry.iterdir())}


def test_two_processes_placing_one_stub_at_once_both_get_the_whole_entry(tmp_path):
    stub = os.urandom(48 << 20)
    backend = {name: f"the branch's {name}\n".encode() * 1000 for name in BACKEND_FILES}
    archives = [_archive({"triton_python_backend_stub": stub}),
                _archive({"python_backend": None,
                          **{f"python_backend/{name}": data for name, data in backend.items()}})]
    expected = {"triton_python_backend_stub": f"{hashlib.sha256(stub).hexdigest()} 755",
                **{name: f"{hashlib.sha256(data).hexdigest()} 644"
                   for name, data in backend.items()}}
    for attempt in range(3):
        entry = tmp_path / "stubs" / f"entry-{attempt}"
        first, second = at_once(_place_and_read, [(archives, entry)] * 2)
        assert first == expected
        assert second == expected
        assert sorted(entry.parent.glob(f"{entry.name}*")) == [entry], (
            "a staging directory was left")


def test_an_entry_an_interrupted_build_left_without_every_file_is_replaced(tmp_path):
    entry = tmp_path / "stubs" / "entry"
    entry.mkdir(parents=True)
    (entry / "triton_python_backend_stub").write_text("half")
    archives = [_archive({"triton_python_backend_stub": b"stub"}),
                _archive({"python_backend": None,
                          **{f"python_backend/{name}": b"file" for name in BACKEND_FILES}})]
    assert _place_and_read(archives, entry) == {
        "triton_python_backend_stub": f"{hashlib.sha256(b'stub').hexdigest()} 755",
        **{name: f"{hashlib.sha256(b'file').hexdigest()} 644" for name in BACKEND_FILES}}
