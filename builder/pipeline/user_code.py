"""Where a Python module comes from: the Python installation, or the user's own code.

Why: custom operators must deploy without patching. Code that lives in the Python installation
(the standard library, ``site-packages``) can be imported again where the pipeline is served, as
long as the same packages are installed there; code anywhere else (a script, a module in the
user's home or a temporary directory, an editable checkout, this project) may be missing at serve
time, so ``pipe.pickle`` must carry it by value.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import site
import sys
import sysconfig
from collections.abc import Mapping

_INSTALLATION_PATHS: list[tuple[str, ...]] = []
"""Cache of :func:`installation_paths` (a plain list: ``lru_cache`` wrappers pickle by reference,
and this module is captured by value into ``pipe.pickle``)."""


def installation_paths() -> tuple[str, ...]:
    """The directories holding the standard library and installed packages."""
    if _INSTALLATION_PATHS:
        return _INSTALLATION_PATHS[0]
    paths = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            paths.add(os.path.realpath(path))
    getsite = getattr(site, "getsitepackages", None)
    for path in getsite() if getsite else ():
        paths.add(os.path.realpath(path))
    user_site = getattr(site, "getusersitepackages", lambda: None)()
    if user_site:
        paths.add(os.path.realpath(user_site))
    _INSTALLATION_PATHS.append(tuple(sorted(paths)))
    return _INSTALLATION_PATHS[0]


def is_installed(module_name: str | None) -> bool:
    """Whether ``module_name`` (already imported) comes from the Python installation, or from a
    directory pip installed it into (:func:`_installed_beside`).

    Built-in and frozen modules (no ``__file__``) count as installed; ``__main__`` never does.
    """
    if not module_name or module_name == "__main__":
        return False
    module = sys.modules.get(module_name)
    if module is None:
        return True
    path = getattr(module, "__file__", None)
    if path is None:
        return getattr(module, "__path__", None) is None or _namespace_installed(module)
    if _in_installation(path):
        return True
    return _installed_beside(module_name.split(".")[0])


def user_modules() -> list[str]:
    """The imported top-level modules and packages that are *not* installed: user code."""
    tops = {name.split(".")[0] for name, module in list(sys.modules.items())
            if module is not None and name != "__main__"}
    return sorted(top for top in tops if not is_installed(top))


def distributions_of(top: str) -> list[str]:
    """The installed distributions that provide the top-level module ``top``.

    The distribution named like the module (numpy, torch, onnxruntime) is asked first, from its
    ``top_level.txt`` or ``RECORD``; only a module named otherwise (``PIL`` from pillow, ``yaml``
    from PyYAML) pays for :func:`importlib.metadata.packages_distributions`, which reads every
    installed distribution's file list (most of a code-only rebuild's time before).
    """
    try:
        distribution = importlib.metadata.distribution(top)
    except importlib.metadata.PackageNotFoundError:
        distribution = None
    if distribution is not None and _provides(distribution, top):
        return [distribution.metadata["Name"]]
    if not _PACKAGES_DISTRIBUTIONS:
        _PACKAGES_DISTRIBUTIONS.append(importlib.metadata.packages_distributions())
    return list(_PACKAGES_DISTRIBUTIONS[0].get(top, []))


_PACKAGES_DISTRIBUTIONS: list[Mapping[str, list[str]]] = []


def _provides(distribution: importlib.metadata.Distribution, top: str) -> bool:
    top_level = distribution.read_text("top_level.txt")
    if top_level is not None:
        return top in top_level.split()
    return any(_names(line, top) for line in (distribution.read_text("RECORD") or "").splitlines())


def _namespace_installed(module: object) -> bool:
    top = getattr(module, "__name__", "").split(".")[0]
    return all(_in_installation(path) or _listed_in_record(os.path.dirname(path), top)
               for path in map(os.path.realpath, getattr(module, "__path__", [])))


def _in_installation(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real.startswith(root + os.sep) for root in installation_paths())


def _installed_beside(top: str) -> bool:
    """Whether pip installed ``top`` into a directory outside the installation that ``sys.path``
    reaches (``pip install --target DIR`` with ``DIR`` on ``PYTHONPATH``, as a machine without
    write access to its Python's site-packages does): a ``*.dist-info/RECORD`` beside it lists
    it. An editable checkout's own code is not: its metadata is in site-packages, or an
    ``.egg-info`` without a RECORD."""
    module = sys.modules.get(top)
    file = getattr(module, "__file__", None)
    locations = list(getattr(module, "__path__", None) or ([file] if file else []))
    return bool(locations) and all(
        _listed_in_record(os.path.dirname(os.path.realpath(location)), top)
        for location in locations)


def _listed_in_record(directory: str, top: str) -> bool:
    for record in glob.glob(os.path.join(glob.escape(directory), "*.dist-info", "RECORD")):
        with open(record, encoding="utf-8", errors="replace") as lines:
            if any(_names(line, top) for line in lines):
                return True
    return False


def _names(record_line: str, top: str) -> bool:
    """Whether a RECORD line is a file of the top-level module or package ``top``."""
    first = record_line.split(",", 1)[0].split("/", 1)[0]
    return first == top or first.split(".", 1)[0] == top
