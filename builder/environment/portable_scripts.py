"""Console scripts that do not name the directory they were installed in, and RECORDs that agree.

Why: pip writes each console script (``bin/f2py``…) with a shebang naming the interpreter by its
absolute path — inside this build's temporary directory — and records the script's sha256 in its
distribution's ``RECORD``. venv-pack rewrites the shebang to ``#!/usr/bin/env python`` as it packs,
but the ``RECORD`` keeps the hash of the script as written, so it differed with the directory's
random name, and with it the environment archive and the image layer. Here the shebangs are
rewritten before packing, to what venv-pack would write, and each ``RECORD`` line is updated to the
script as shipped (hash and size) — also what ``pip uninstall`` then checks against.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
from pathlib import Path

PORTABLE_SHEBANG = b"#!/usr/bin/env python"


def record_hash(data: bytes) -> str:
    """A ``RECORD`` hash field (PEP 376/627: urlsafe base64 of the sha256, without padding)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


EXEC_WRAPPER = re.compile(b"#!/bin/sh\n'''exec' (.+) \"\\$0\" \"\\$@\"\n' '''\n")
"""pip's shebang for an interpreter path over 127 bytes (the kernel's limit): a shell line."""


def portable_script(data: bytes, prefix: Path) -> bytes:
    """``data`` with its shebang — ``#!<prefix>/…python…``, or pip's ``/bin/sh`` wrapper for a
    long path — replaced by :data:`PORTABLE_SHEBANG` where it names an interpreter under
    ``prefix``."""
    under = str(prefix).encode() + b"/"
    wrapper = EXEC_WRAPPER.match(data)
    if wrapper and wrapper.group(1).strip(b"'\"").startswith(under):
        return PORTABLE_SHEBANG + b"\n" + data[wrapper.end():]
    first, newline, rest = data.partition(b"\n")
    if first.startswith(b"#!" + under) and b"python" in first:
        return PORTABLE_SHEBANG + newline + rest
    return data


def make_scripts_portable(site_packages: Path, prefix: Path) -> list[Path]:
    """Rewrite the scripts the ``RECORD`` files of ``site_packages`` list whose shebang names an
    interpreter under ``prefix``; update those ``RECORD`` lines. The scripts rewritten."""
    rewritten = []
    for record in sorted(site_packages.glob("*.dist-info/RECORD")):
        original = record.read_bytes().decode()
        rows = list(csv.reader(io.StringIO(original, newline="")))
        changed = False
        for row in rows:
            if len(row) < 3 or not row[1] or "bin" not in Path(row[0]).parts:
                continue  # scripts live in bin/ (../../../bin/ in a venv, bin/ with --target)
            script = Path(os.path.normpath(site_packages / row[0]))
            if script.is_symlink() or not script.is_file():
                continue
            data = script.read_bytes()
            portable = portable_script(data, prefix)
            if portable != data:
                script.write_bytes(portable)
                row[1], row[2] = record_hash(portable), str(len(portable))
                rewritten.append(script)
                changed = True
        if changed:
            text = io.StringIO()
            ending = "\r\n" if "\r\n" in original else "\n"  # pip writes csv's default
            csv.writer(text, lineterminator=ending).writerows(rows)
            record.write_bytes(text.getvalue().encode())
    return rewritten


def drop_venv_command(venv: Path) -> None:
    """Drop ``command = …`` from ``pyvenv.cfg``: Python 3.11+ records there the ``venv`` command
    line (this build's directory); nothing reads it."""
    config = venv / "pyvenv.cfg"
    if config.is_file():
        lines = config.read_text().splitlines(keepends=True)
        config.write_text("".join(line for line in lines if not line.startswith("command =")))
