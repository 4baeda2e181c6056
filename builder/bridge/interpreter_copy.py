"""Copy the running Python into a relocatable prefix: the interpreter a bridged environment carries.

Run by the ``python3`` of an *interpreter image* (``python interpreter_copy.py DEST``), it writes
``DEST/bin/pythonX.Y``, the standard library to ``DEST/lib/pythonX.Y`` (extension modules
included), ``libpythonX.Y.so`` and the shared libraries those need (glibc's own excepted) to
``DEST/lib`` — which the python backend puts on the stub's ``LD_LIBRARY_PATH`` — an empty
``site-packages``, a ``sitecustomize`` that adds it wherever the distribution looks elsewhere
(Debian's ``dist-packages``), and a ``bin/activate`` that needs no absolute path.

The stub finds the prefix the way ``python3`` does: ``PYTHONHOME`` from ``bin/activate`` (which
Triton sources up to 25.07), else ``python3`` on ``PATH`` (``DEST/bin`` first) whose parent
holds ``lib/pythonX.Y/os.py``.

``--development`` adds what compiling a stub against this very Python takes (the bridged stub
then links the ``libpython`` the environment carries, on a release image whose distribution may
not package this Python at all): the headers in ``DEST/include/pythonX.Y`` — Debian's
multiarch ``pyconfig.h`` resolved — the ``libpythonX.Y.so`` link, and ``bin/pythonX.Y-build``,
a launcher that finds ``lib/`` itself, for build tools that run the interpreter (pybind11's
CMake queries it). Standard library only: it runs in an image without this project.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

SKIPPED = ("site-packages", "dist-packages", "__pycache__", "test", "idlelib", "tkinter",
           "turtledemo", "ensurepip", "sitecustomize.py")
SYSTEM_LIBRARIES = re.compile(
    r"^(ld-linux.*|libc|libm|libdl|libpthread|librt|libutil|libresolv|libcrypt|libgcc_s|"
    r"libstdc\+\+|libmvec|linux-vdso)\.so")

SITECUSTOMIZE = '''"""Written by triton-builder: the packages of this relocatable environment."""
import os
import site
import sys

site.addsitedir(os.path.join(sys.prefix, "lib", "python%d.%d" % sys.version_info[:2],
                             "site-packages"))
'''

ACTIVATE = """# Written by triton-builder: an environment that carries its own Python {version}.
# Sourced by Triton's python backend; relocatable (no absolute path inside).
_prefix="$(cd "$(dirname "${{BASH_SOURCE[0]:-$0}}")/.." && pwd)"
export VIRTUAL_ENV="$_prefix"
export PYTHONHOME="$_prefix"
export PATH="$_prefix/bin:$PATH"
unset _prefix
"""


LAUNCHER = """#!/bin/sh
# Written by triton-builder: runs the copied Python {version} with its own shared libraries.
here="$(cd "$(dirname "$0")" && pwd)"
LD_LIBRARY_PATH="$here/../lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" \\
  exec "$here/python{version}" "$@"
"""


def copy_interpreter(dest: Path) -> dict:
    """Copy this interpreter into ``dest``; return what was copied (for the lock file)."""
    version = "{}.{}".format(*sys.version_info[:2])
    paths = sysconfig.get_paths()
    stdlib = Path(paths["stdlib"])
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    lib = dest / "lib"
    target = lib / f"python{version}"
    shutil.copytree(stdlib, target, ignore=shutil.ignore_patterns(*SKIPPED),
                    ignore_dangling_symlinks=True)
    dynload = Path(paths["platstdlib"]) / "lib-dynload"
    if dynload.is_dir() and not (target / "lib-dynload").is_dir():
        shutil.copytree(dynload, target / "lib-dynload")
    (target / "site-packages").mkdir(exist_ok=True)
    (target / "sitecustomize.py").write_text(SITECUSTOMIZE)

    executable = Path(os.path.realpath(sys.executable))
    shutil.copy2(executable, dest / "bin" / f"python{version}")
    for alias in ("python3", "python"):
        (dest / "bin" / alias).symlink_to(f"python{version}")
    (dest / "bin" / "activate").write_text(ACTIVATE.format(version=version))

    libpython = _libpython()
    shutil.copy2(libpython, lib / libpython.name)
    elves = [executable, libpython, *sorted((target / "lib-dynload").glob("*.so"))]
    libraries = {soname: path for soname, path in _dependencies(elves).items()
                 if not soname.startswith("libpython")}
    for soname, path in sorted(libraries.items()):
        shutil.copy2(path, lib / soname)
    return {"python": sys.version.split()[0], "executable": str(executable),
            "stdlib": str(stdlib), "libpython": str(libpython),
            "libraries": {soname: str(path) for soname, path in sorted(libraries.items())}}


def copy_development_files(dest: Path) -> dict:
    """Add headers, the ``libpythonX.Y.so`` link and the build launcher to the copy in ``dest``."""
    version = "{}.{}".format(*sys.version_info[:2])
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        raise SystemExit(f"this Python has no development headers ({include}/Python.h is "
                         f"missing): a stub cannot be compiled against it; use an image that "
                         f"has them (python:{version}-slim, or one with python{version}-dev)")
    target = dest / "include" / f"python{version}"
    shutil.copytree(include, target, dirs_exist_ok=True)
    pyconfig = include / "pyconfig.h"
    multiarch = sysconfig.get_config_var("MULTIARCH")
    platform_config = include.parent / str(multiarch) / f"python{version}" / "pyconfig.h"
    if multiarch and platform_config.is_file():  # Debian's pyconfig.h only includes this one
        pyconfig = platform_config
        shutil.copy2(pyconfig, target / "pyconfig.h")
    libpython = _libpython()
    link = dest / "lib" / f"libpython{version}.so"
    if not link.exists():
        link.symlink_to(libpython.name)
    launcher = dest / "bin" / f"python{version}-build"
    launcher.write_text(LAUNCHER.format(version=version))
    launcher.chmod(0o755)
    return {"include": str(include), "pyconfig": str(pyconfig)}


def _libpython() -> Path:
    """The shared libpython the stub links (``INSTSONAME`` in ``LIBDIR``, or a known place)."""
    version = "{}.{}".format(*sys.version_info[:2])
    name = sysconfig.get_config_var("INSTSONAME") or f"libpython{version}.so.1.0"
    places = [sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LIBPL"),
              os.path.join(sys.base_prefix, "lib")]
    for place in places:
        if place and os.path.isfile(os.path.join(place, name)):
            return Path(os.path.realpath(os.path.join(place, name)))
    raise SystemExit(f"this Python has no shared {name} (looked in {places}): the python "
                     f"backend stub links it; use an image with a shared libpython")


def _dependencies(elves: list) -> dict:
    """Shared libraries the ELF files load (by soname), outside glibc and the compiler runtime."""
    found = {}
    for elf in elves:
        result = subprocess.run(["ldd", str(elf)], capture_output=True, text=True)
        for line in result.stdout.splitlines():
            match = re.match(r"\s*(\S+) => (/\S+)", line)
            if match and not SYSTEM_LIBRARIES.match(match.group(1)):
                found[match.group(1)] = Path(match.group(2))
    return found


def main(argv: list) -> dict:
    """``interpreter_copy.py DEST [--development]``."""
    dest = Path(argv[0])
    copied = copy_interpreter(dest)
    if "--development" in argv[1:]:
        copied["development"] = copy_development_files(dest)
    return copied


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
