"""The interpreter a bridged environment carries: which image it is taken from, and the script
that copies it out of that image (:mod:`builder.bridge.interpreter_copy`, run there).

The interpreter and its extension modules run on the release's glibc, so the image is an
official Python image on a Debian whose glibc is no newer than the release's.
"""

from __future__ import annotations

from pathlib import Path

from builder.base.releases import DEBIAN_SUITES, Release, version_key
from builder.bridge.errors import PythonBridgeError

COPY_SCRIPT = Path(__file__).with_name("interpreter_copy.py")
"""Copies the running Python into a relocatable prefix; run by the image's own python3."""

INTERPRETER_IMAGE = "python:{python}-slim-{suite}"
"""Docker Hub's official Python images (Debian based, ``libpython`` shared, in /usr/local)."""
INTERPRETER_IMAGE_VARIABLE = "TRITON_BUILDER_INTERPRETER_IMAGE"
"""Overrides the interpreter image (a mirror, or an image made without a registry)."""


def interpreter_image_for(release: Release, python_version: str) -> str:
    """The official Python image on the newest Debian whose glibc the release's is not older than.

    The interpreter and its extension modules are copied into the environment; they must run on
    the release's glibc.
    """
    fitting = [suite for suite, (_, glibc) in DEBIAN_SUITES.items()
               if version_key(glibc) <= version_key(release.glibc)]
    if not fitting:
        raise PythonBridgeError(
            f"{release.describe()} has glibc {release.glibc}, older than every Debian suite we "
            f"take interpreters from ({', '.join(DEBIAN_SUITES)}): install conda, or pass "
            f"interpreter_image=")
    suite = max(fitting, key=lambda name: version_key(DEBIAN_SUITES[name][1]))
    return INTERPRETER_IMAGE.format(python=python_version, suite=suite)

