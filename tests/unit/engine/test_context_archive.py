"""The build context's tar depends on the files alone: not on where the context lies, the
files' mtimes or the umask they were written under."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from builder.engine.context_archive import write_context_archive


def _context(root: Path, umask: int, mtime: int) -> Path:
    old = os.umask(umask)
    try:
        (root / "code" / "models" / "pipeline" / "1").mkdir(parents=True)
        (root / "code" / "models" / "pipeline" / "1" / "model.py").write_text("pass\n")
        (root / "runtime").mkdir()
        (root / "runtime" / "run.sh").write_text("#!/bin/sh\n")
        os.chmod(root / "runtime" / "run.sh", 0o777 & ~umask)
        (root / "code" / "models" / "link").symlink_to("pipeline")
        (root / "Dockerfile").write_text("FROM scratch\nCOPY code/ /\n")
    finally:
        os.umask(old)
    for path in [root, *root.rglob("*")]:
        os.utime(path, (mtime, mtime), follow_symlinks=False)
    return root


def _archive(context: Path, mtime: int = 946684800) -> bytes:
    buffer = io.BytesIO()
    write_context_archive(context, buffer, mtime=mtime)
    return buffer.getvalue()


def test_two_contexts_of_the_same_files_give_the_same_bytes(tmp_path):
    first = _archive(_context(tmp_path / "a", 0o022, 1_600_000_000))
    second = _archive(_context(tmp_path / "elsewhere" / "b", 0o077, 1_700_000_000))
    assert first == second


def test_members_are_sorted_and_normalised(tmp_path):
    data = _archive(_context(tmp_path / "a", 0o077, 1_600_000_000), mtime=1234)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        members = {m.name: m for m in archive.getmembers()}
        names = archive.getnames()
    assert names[0] == "Dockerfile" and "code/models/pipeline/1/model.py" in names
    assert {m.mtime for m in members.values()} == {1234}
    assert members["runtime/run.sh"].mode == 0o755 and members["Dockerfile"].mode == 0o644
    assert members["code/models"].isdir() and members["code/models"].mode == 0o755
    link = members["code/models/link"]
    assert link.issym() and link.linkname == "pipeline"
    assert {(m.uid, m.gid, m.uname, m.gname) for m in members.values()} == {(0, 0, "", "")}
