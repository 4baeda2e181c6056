"""The packed environment as a canonical archive: the same files give the same bytes.

Why: venv-pack and conda-pack list a prefix in the file system's order (on ext4, a hash order
seeded per file system), keep each file's install time, owner and the packing umask's modes, and
write the gzip header with the clock. So one environment packed twice gave two archives, and the
image layer that holds it two digests. Here every packer writes a plain tar, and
:func:`write_canonical_archive` rewrites it: members sorted by name, every mtime the build's epoch
(:mod:`builder.build_epoch`), owner root with no names, modes reduced to 0755/0644 (symlinks
0777), hard links stored as the files they name, and a gzip header without a name or a time —
or no gzip at all, for an environment that ships unpacked (compressing 2.7 GB of CUDA libraries
took two minutes of a slim GPU build here, only for the archive to be extracted again).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import stat
import tarfile
from pathlib import Path

COMPRESS_LEVEL = 4
"""venv-pack's and conda-pack's default: 3.5x faster than 9 for about 3 % more bytes."""


def canonical_member(member: tarfile.TarInfo, mtime: int) -> tarfile.TarInfo:
    """``member`` with nothing but its name, kind, content size, link and exec bit kept."""
    canonical = tarfile.TarInfo(member.name)
    canonical.mtime = mtime
    canonical.uid = canonical.gid = 0
    canonical.uname = canonical.gname = ""
    if member.isdir():
        canonical.type, canonical.mode = tarfile.DIRTYPE, 0o755
    elif member.issym():
        canonical.type, canonical.mode, canonical.linkname = tarfile.SYMTYPE, 0o777, member.linkname
    elif member.isfile() or member.islnk():
        canonical.type = tarfile.REGTYPE
        canonical.mode = 0o755 if member.mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH) \
            else 0o644
        canonical.size = member.size
    else:
        raise ValueError(f"{member.name}: a {member.type!r} member has no place in an "
                         f"environment (devices and fifos are not packed)")
    return canonical


def write_canonical_archive(raw: str | os.PathLike, output: str | os.PathLike, *,
                            mtime: int) -> Path:
    """Rewrite the uncompressed tar ``raw`` as the canonical ``output``: gzip-compressed where
    it is named ``.tar.gz``, a plain tar where it is named ``.tar``."""
    output = Path(output)
    with open(output, "wb") as file, contextlib.ExitStack() as stack:
        stream: io.BufferedIOBase = file
        if output.name.endswith(".gz"):
            stream = stack.enter_context(gzip.GzipFile(
                filename="", mode="wb", compresslevel=COMPRESS_LEVEL, fileobj=file, mtime=0))
        _write_members(raw, stream, mtime)
    return output


def _write_members(raw: str | os.PathLike, stream: io.BufferedIOBase, mtime: int) -> None:
    with tarfile.open(raw, "r:") as source, \
            tarfile.open(fileobj=stream, mode="w:", format=tarfile.PAX_FORMAT) as target:
        latest = {member.name: member for member in source.getmembers()}  # as tar extracts
        for name in sorted(latest):
            member = latest[name]
            canonical = canonical_member(member, mtime)
            if canonical.type == tarfile.REGTYPE:
                data = source.extractfile(member)  # a hard link reads the file it names
                canonical.size = source.getmember(member.linkname).size if member.islnk() \
                    else member.size
                target.addfile(canonical, data)
            else:
                target.addfile(canonical)
