"""The interpreter copy a bridged image carries, and the development files a stub compiles against.

``builder/bridge/interpreter_copy.py`` runs in interpreter images; here it runs with the
Pythons this machine has — pyenv's (headers in its own prefix) and, where installed, Debian's
``python3.11`` with ``python3.11-dev`` (whose ``pyconfig.h`` only includes the multiarch one) —
and the copy is then run from its new place.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.bridge.interpreter import COPY_SCRIPT

VERSION = "{}.{}".format(*sys.version_info[:2])
PYTHONS = [sys.executable]
if shutil.which(f"/usr/bin/python{VERSION}") and Path(f"/usr/include/python{VERSION}").is_dir():
    PYTHONS.append(f"/usr/bin/python{VERSION}")


def _copy(python: str, dest: Path, *flags: str) -> dict:
    result = subprocess.run([python, str(COPY_SCRIPT), str(dest), *flags], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("python", PYTHONS)
def test_the_development_copy_has_headers_library_link_and_a_launcher(python, tmp_path):
    dest = tmp_path / "python"
    copied = _copy(python, dest, "--development")
    include = dest / "include" / f"python{VERSION}"
    assert (include / "Python.h").is_file()
    pyconfig = (include / "pyconfig.h").read_text()
    assert "#define SIZEOF_VOID_P" in pyconfig, "pyconfig.h must be the real one, not a wrapper"
    link = dest / "lib" / f"libpython{VERSION}.so"
    assert link.is_symlink() and link.resolve().is_file()
    assert Path(copied["libpython"]).name == link.resolve().name
    probe = subprocess.run(
        [str(dest / "bin" / f"python{VERSION}-build"), "-c",
         "import sys, sysconfig; print(sys.prefix); print(sysconfig.get_paths()['include'])"],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert probe.returncode == 0, probe.stderr
    prefix, headers = probe.stdout.split()
    assert Path(prefix) == dest and Path(headers) == include


def test_without_the_flag_no_development_files_are_copied(tmp_path):
    dest = tmp_path / "python"
    copied = _copy(sys.executable, dest)
    assert "development" not in copied
    assert not (dest / "include").exists()
    assert not (dest / "bin" / f"python{VERSION}-build").exists()
