"""The packed environment is canonical: the same files give the same bytes, whatever the order
they were listed in, their mtimes, owners and the umask they were written under."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

from builder.environment.canonical_archive import write_canonical_archive


def _prefix(root: Path, umask: int, mtime: int) -> Path:
    old = os.umask(umask)
    try:
        (root / "lib" / "site-packages").mkdir(parents=True)
        (root / "bin").mkdir()
        (root / "lib" / "site-packages" / "mod.py").write_text("x = 1\n")
        (root / "bin" / "tool").write_text("#!/usr/bin/env python\n")
        os.chmod(root / "bin" / "tool", 0o777 & ~umask)
        (root / "bin" / "python").symlink_to("/usr/bin/python3")
    finally:
        os.umask(old)
    for path in [root, *root.rglob("*")]:
        os.utime(path, (mtime, mtime), follow_symlinks=False)
    return root


def _raw(prefix: Path, output: Path, reverse: bool) -> Path:
    """A plain tar as a packer writes it: file-system order (here: either way round)."""
    with tarfile.open(output, "w") as archive:
        for path in sorted(prefix.rglob("*"), reverse=reverse):
            archive.add(path, arcname=str(path.relative_to(prefix)), recursive=False)
    return output


def test_two_packings_of_the_same_files_are_byte_identical(tmp_path):
    first = _raw(_prefix(tmp_path / "a", 0o022, 1_600_000_000), tmp_path / "a.tar", False)
    second = _raw(_prefix(tmp_path / "b", 0o077, 1_700_000_000), tmp_path / "b.tar", True)
    assert first.read_bytes() != second.read_bytes()
    one = write_canonical_archive(first, tmp_path / "one.tar.gz", mtime=946684800)
    two = write_canonical_archive(second, tmp_path / "two.tar.gz", mtime=946684800)
    assert one.read_bytes() == two.read_bytes()
    with tarfile.open(one) as archive:
        members = archive.getmembers()
    assert [m.name for m in members] == sorted(m.name for m in members)
    modes = {m.name: (m.mode, m.mtime, m.uid, m.uname) for m in members}
    assert modes["bin/tool"] == (0o755, 946684800, 0, "")
    assert modes["lib/site-packages/mod.py"][0] == 0o644
    assert modes["lib"][0] == 0o755
    assert [m for m in members if m.name == "bin/python"][0].linkname == "/usr/bin/python3"


def test_the_gzip_header_carries_no_time_and_no_name(tmp_path):
    raw = _raw(_prefix(tmp_path / "a", 0o022, 1_600_000_000), tmp_path / "a.tar", False)
    packed = write_canonical_archive(raw, tmp_path / "env.tar.gz", mtime=946684800).read_bytes()
    assert packed[4:8] == b"\0\0\0\0"  # MTIME
    assert packed[3] & 0x08 == 0  # no FNAME
    with gzip.open(io.BytesIO(packed)) as stream:
        assert tarfile.open(fileobj=stream).getnames()


def test_a_hard_link_is_stored_as_the_file_it_names(tmp_path):
    prefix = _prefix(tmp_path / "a", 0o022, 1_600_000_000)
    os.link(prefix / "lib" / "site-packages" / "mod.py", prefix / "aaa.py")  # sorts first
    raw = _raw(prefix, tmp_path / "a.tar", True)
    with tarfile.open(raw) as archive:
        assert any(member.islnk() for member in archive.getmembers())
    packed = write_canonical_archive(raw, tmp_path / "env.tar.gz", mtime=0)
    with tarfile.open(packed) as archive:
        link = archive.getmember("aaa.py")
        assert link.isreg() and archive.extractfile(link).read() == b"x = 1\n"


def test_an_archive_named_tar_is_the_same_members_without_gzip(tmp_path):
    """What an environment that ships unpacked is packed as: nothing to decompress, the same
    canonical members in the same order as its ``.tar.gz`` twin, again byte-identical."""
    first = _raw(_prefix(tmp_path / "a", 0o022, 1_600_000_000), tmp_path / "a.tar", False)
    second = _raw(_prefix(tmp_path / "b", 0o077, 1_700_000_000), tmp_path / "b.tar", True)
    plain = write_canonical_archive(first, tmp_path / "one.tar", mtime=946684800)
    again = write_canonical_archive(second, tmp_path / "two.tar", mtime=946684800)
    assert plain.read_bytes() == again.read_bytes() and plain.read_bytes()[:2] != b"\x1f\x8b"
    zipped = write_canonical_archive(first, tmp_path / "one.tar.gz", mtime=946684800)
    with tarfile.open(plain, "r:") as bare, tarfile.open(zipped, "r:gz") as compressed:
        assert [m.get_info() for m in bare.getmembers()] == [
            m.get_info() for m in compressed.getmembers()]
