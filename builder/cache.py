"""Where Triton Builder keeps what it reuses between runs, and the content hashes that key it:
wheels, unpacked servers, environments, images; and the locked stagings its writers fill (a
build's working directory among them), which tell a killed build's leftovers from a live one's."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from builder.errors import TritonBuilderError
from builder.interrupts import deferred_interrupts

STAGING_PATTERNS = ("*.partial-*", ".download-*")
"""The directories the cache's writers fill, then rename (:func:`staging_directory`)."""
SCRATCH_PREFIX = "triton-builder-build-"
"""A build's working directory in the system's temporary directory (:func:`build_scratch`)."""
STALE_AFTER_S = 10.0
"""A staging younger than this is never taken for stale: its maker may not hold its lock yet."""


class DownloadError(TritonBuilderError, RuntimeError):
    """``pip download`` fetched nothing for the requirement; ``output`` says why."""

    def __init__(self, requirement: str, output: str) -> None:
        super().__init__(f"pip download {requirement} failed:\n{output}")
        self.output = output


def cache_dir(*parts: str) -> Path:
    """Return (and create) ``$TRITON_BUILDER_CACHE/<parts>`` (``~/.cache/triton-builder``)."""
    root = os.environ.get("TRITON_BUILDER_CACHE") or Path.home() / ".cache" / "triton-builder"
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def cached_download(requirement: str, subdirectory: str, pattern: str, *options: str) -> Path:
    """The file ``pattern`` matches in ``cache_dir(subdirectory)``, fetched there with ``pip
    download --no-deps <options> requirement`` when none does yet (the newest match).

    pip writes into a hidden directory inside the cache's, and each finished file is renamed
    into place: pip copies into ``--dest`` as it goes, and another process looking for the
    same file then finds it half-written."""
    dest = cache_dir(subdirectory)
    found = sorted(dest.glob(pattern))
    if not found:
        with staging_directory(".download-", dest) as directory:
            result = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", *options, "--dest",
                 str(directory), requirement], capture_output=True, text=True)
            if result.returncode == 0:
                for name in os.listdir(directory):
                    os.replace(directory / name, dest / name)
        found = sorted(dest.glob(pattern))
        if result.returncode != 0 or not found:
            raise DownloadError(requirement, result.stderr.strip())
    return found[-1]


def marked_complete(entry: Path) -> bool:
    """Whether ``entry`` holds the ``.complete`` marker written last into its staging."""
    return (entry / ".complete").exists()


@contextmanager
def staged(entry: Path, complete: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """A new directory beside the cache ``entry`` to fill in the block; renamed to ``entry``
    when the block ends without an error, removed in any case.

    The cache's one way of writing what two processes may make at once: each fills its own
    directory, and the one that renames second finds the first one's entry and uses it. Only an
    entry that is not ``complete`` (an interrupted older builder's) is removed first: a whole
    one may be in use. Without ``complete``, the directory is marked (``.complete``, written
    last) and the mark is what makes an entry whole."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with staging_directory(f"{entry.name}.partial-", entry.parent) as directory:
        directory.chmod(0o755)
        yield directory
        if complete is None:
            (directory / ".complete").touch()
        _publish(directory, entry, complete or marked_complete)


@contextmanager
def staging_directory(prefix: str, parent: Path) -> Iterator[Path]:
    """A new directory ``prefix…`` in ``parent``, removed when the block ends (unless renamed
    away), and locked (``flock``) until then.

    Why the lock: a process killed outright (``SIGKILL``, the machine's OOM killer) runs no
    clean-up, and its staging, an environment of gigabytes perhaps, stays. The kernel lets go
    of the lock with the process, so a staging no one holds is a dead process's: the next
    staging of the same ``prefix`` removes it first, and the doctor lists those of the whole
    cache (:func:`stale_stagings`)."""
    for older in sorted(parent.glob(f"{prefix}*")):
        remove_stale_staging(older)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield path
    finally:
        with deferred_interrupts():
            shutil.rmtree(path, ignore_errors=True)
        os.close(descriptor)


def build_scratch() -> contextlib.AbstractContextManager[Path]:
    """A build's working directory (its model repository, payload, environment: hundreds of
    MB), a staging in the system's temporary directory: a build killed outright leaves it, and
    the next build removes it, as the doctor does (:func:`stale_scratches`). An interrupt that
    lands while it is removed waits for the removal to end, where
    :class:`tempfile.TemporaryDirectory` would stop half-way and never come back to it."""
    return staging_directory(SCRATCH_PREFIX, Path(tempfile.gettempdir()))


def stale_scratches() -> list[Path]:
    """The working directories of builds killed outright (:func:`build_scratch`)."""
    return stale_stagings(Path(tempfile.gettempdir()), depth=1, patterns=(f"{SCRATCH_PREFIX}*",))


def stale_stagings(root: Path | None = None, depth: int = 3,
                   patterns: tuple[str, ...] = STAGING_PATTERNS) -> list[Path]:
    """The stagings (``patterns``) no living process holds, in the top ``depth`` levels of
    ``root`` (default: the whole cache), where the cache's writers make them."""
    root = root or cache_dir()
    found = []
    for directory, subdirectories, _ in os.walk(root):
        for name in sorted(subdirectories):
            path = Path(directory, name)
            if any(path.match(pattern) for pattern in patterns):
                subdirectories.remove(name)
                if _unheld(path, remove=False):
                    found.append(path)
        if len(Path(directory).relative_to(root).parts) + 1 >= depth:
            subdirectories.clear()
    return found


def remove_stale_staging(path: Path) -> bool:
    """Remove the staging ``path`` if no living process holds it; whether it was removed."""
    return path.is_dir() and _unheld(path, remove=True)


def _unheld(path: Path, *, remove: bool) -> bool:
    """Whether no process holds ``path``'s lock (and it is old enough to have had one); with
    ``remove``, removed under the lock taken to ask."""
    try:
        if time.time() - path.stat().st_mtime < STALE_AFTER_S:
            return False
        descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        if remove:
            shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(descriptor)


def _publish(directory: Path, entry: Path, complete: Callable[[Path], bool]) -> None:
    if entry.exists() and not complete(entry):
        shutil.rmtree(entry, ignore_errors=True)
    try:
        directory.rename(entry)
    except OSError:
        if not complete(entry):
            raise


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of one file's bytes, read in blocks (wheels and archives run to gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def content_hash(*parts: bytes | str | Path) -> str:
    """A sha256 over build inputs: bytes, text, files, or directories (walked in order)."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            for path in _files(part):
                digest.update(str(path.relative_to(part) if part.is_dir() else path.name).encode())
                digest.update(b"\0")
                with open(path, "rb") as stream:
                    for block in iter(functools.partial(stream.read, 1 << 20), b""):
                        digest.update(block)
        else:
            digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0\0")
    return digest.hexdigest()


def _files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    found: list[Path] = []
    for directory, subdirs, names in os.walk(root):
        subdirs.sort()
        found.extend(Path(directory, name) for name in sorted(names))
    return found
