"""Whether the model environment ships as an archive or unpacked (a directory in an image layer).

The python backend extracts an archive ``EXECUTION_ENV_PATH`` into ``/tmp`` at every server start
(python_backend ``pb_env.cc``, ``EnvironmentManager::ExtractIfNotExtracted``); a directory it
uses in place. A GPU release's environment carries CUDA torch, gigabytes: measured here
(BENCHMARKS.md, "CUDA environments", host Triton 2.51, 2 CPUs, medians of 3), the 22.12
(CUDA 11.8, 2.38 GB archive) environment was ready in 36.9 s as an archive against 3.6 s
unpacked, the 24.05 (CUDA 12.4, 3.13 GB) one in 43.9 s against 4.9 s: over half a minute of
every start. Unpacked, the same bytes sit in the image's environment layer instead (the
registry compresses layers anyway, and the container no longer writes a second copy into
``/tmp``), so every release whose python backend takes a directory gets one, the CPU base too.

Which branches take one, read from python_backend's ``src/pb_env.cc`` in
``../shared/triton-sources``: r22.12 and r23.05 only extract (``ExtractIfNotExtracted`` has no
directory case); r24.10, r24.12 and r25.11 return the canonical path of a directory
(``S_ISDIR``). The change is python_backend commit 34bb9d8, first in r23.07 (that branch is not
among the snapshots: the boundary between r23.05 and r24.10 is the commit's).
"""

from __future__ import annotations

import re

from builder.base.releases import Release

DIRECTORY_FROM = (23, 7)
"""The first python_backend release branch that uses a directory ``EXECUTION_ENV_PATH`` in place
(commit 34bb9d8); the CPU base runs Triton 2.51 (r24.10)."""


def accepts_directory(release: Release) -> bool:
    """Whether ``release``'s python backend uses an unpacked environment in place."""
    found = re.fullmatch(r"r(\d+)\.(\d+)", release.branch)
    return found is not None and (int(found.group(1)), int(found.group(2))) >= DIRECTORY_FROM


def ships_unpacked(release: Release) -> bool:
    """Whether the environment goes into the repository unpacked: wherever the release's python
    backend takes a directory (:func:`accepts_directory`).

    Besides the start time above, an archive needs a ``/tmp`` that is writable *and* allows
    executables at every start (its shared libraries are loaded from there): under
    ``docker run --read-only --tmpfs /tmp`` (Docker mounts such a tmpfs ``noexec``) the example's
    pipeline model failed to import numpy ("you should not try to import numpy from its source
    directory"). Unpacked, nothing is written at start. Releases before r23.07 get the archive:
    their backend accepts nothing else (a read-only container then needs
    ``--tmpfs /tmp:exec``).
    """
    return accepts_directory(release)
