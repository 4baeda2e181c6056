"""The build context as the engine receives it: a tar whose bytes depend on the files alone.

Why not the SDK's own (``client.api.build(path=...)``): it tars the directory as it lies — each
file's mtime, the modes the umask gave, the owner — and the legacy builder's ``COPY`` keeps mtimes
and modes in the layer. Two builds of the same repository from two checkouts, or with another
umask, gave layers with other digests. Here entries are sorted, every mtime is the build's epoch
(:mod:`builder.build_epoch`), modes are 0755 for directories and executables and 0644 for the
rest (a directory with the sticky bit is 1777, as ``/tmp``), and owners are root without names.
"""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path
from typing import BinaryIO


def context_member(path: Path, name: str, mtime: int) -> tarfile.TarInfo:
    """The tar header of ``path`` in the context, as ``name``."""
    info = os.lstat(path)
    member = tarfile.TarInfo(name)
    member.mtime = mtime
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    if stat.S_ISLNK(info.st_mode):
        member.type, member.mode, member.linkname = tarfile.SYMTYPE, 0o777, os.readlink(path)
    elif stat.S_ISDIR(info.st_mode):  # sticky: a directory every user may write to, as /tmp
        member.type = tarfile.DIRTYPE
        member.mode = 0o1777 if info.st_mode & stat.S_ISVTX else 0o755
    elif stat.S_ISREG(info.st_mode):
        member.mode = 0o755 if info.st_mode & stat.S_IXUSR else 0o644
        member.size = info.st_size
    else:
        raise ValueError(f"{path}: not a file, directory or symlink: it cannot go into an image")
    return member


def write_context_archive(context: str | os.PathLike, file: BinaryIO, *, mtime: int) -> None:
    """Write the directory ``context`` to ``file`` as an uncompressed, canonical tar."""
    root = Path(context)
    paths = sorted((Path(directory) / name for directory, directories, files in os.walk(root)
                    for name in (*directories, *files)),  # links to directories not followed
                   key=lambda path: path.relative_to(root).parts)
    with tarfile.open(fileobj=file, mode="w:", format=tarfile.PAX_FORMAT) as archive:
        for path in paths:
            member = context_member(path, path.relative_to(root).as_posix(), mtime)
            if member.isreg():
                with open(path, "rb") as data:
                    archive.addfile(member, data)
            else:
                archive.addfile(member)
