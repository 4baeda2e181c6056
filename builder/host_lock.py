"""Locks between the builder's processes on one machine: an exclusive ``fcntl.flock`` on a
named file.

Why: a user may run two builds at once, and the tests run in two workers; both then reach the
same check-then-act steps (is the image there? is apt's program installed? does dockerd
answer?) and would both act. ``flock`` rather than a marker file: the kernel lets go of it
when its holder dies, so a killed build leaves no lock behind for the next one to wait on.

A lock on what the cache holds lives in ``cache_dir("locks")``; one on what builds with other
caches or of other users share — apt, dockerd, the engine's images (:func:`image_lock`) — in
:func:`machine_lock_directory`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from builder.cache import cache_dir

MACHINE_LOCKS = Path("/run/lock")
"""Where the Filesystem Hierarchy Standard keeps the machine's lock files (world-writable)."""


def machine_lock_directory() -> Path:
    """:data:`MACHINE_LOCKS`, or the temporary directory where a container has no ``/run/lock``."""
    return MACHINE_LOCKS if MACHINE_LOCKS.is_dir() else Path(tempfile.gettempdir())


@contextmanager
def host_lock(name: str, directory: Path | None = None) -> Iterator[None]:
    """Hold the lock ``name`` exclusively until the block ends, waiting while another process
    holds it. It is the file ``triton-builder-<name>.lock`` in ``directory`` (default
    ``cache_dir("locks")``); what a file name may not hold (an image tag's ``/`` and ``:``)
    becomes ``_``, and a long name is cut, its hash kept (a file name has 255 bytes at most).

    The file is opened read-only (``flock`` needs no more), so a lock file another user made
    serves this one too.
    """
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    if len(safe) > 120:
        safe = f"{safe[:100]}-{hashlib.sha256(name.encode()).hexdigest()[:16]}"
    path = (directory or cache_dir("locks")) / f"triton-builder-{safe}.lock"
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        descriptor = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        os.close(descriptor)


def image_lock(tag: str) -> AbstractContextManager[None]:
    """The lock of making the image ``tag`` (find it on the engine, else build and tag it): the
    machine's, since a build with another ``TRITON_BUILDER_CACHE`` uses the same engine."""
    return host_lock(f"image-{tag}", machine_lock_directory())
