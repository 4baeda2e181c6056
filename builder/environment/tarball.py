"""The model environment of an image: one packed tarball, made once and reused while unchanged.

:func:`pack_environment` turns a merged spec (:mod:`builder.environment.spec`) into a checked
tarball for a target (:mod:`builder.environment.target`) with a packer
(:mod:`builder.environment.packers`).
Making one takes a download, an install in a container and a compression pass; so the result
is cached under a key that hashes everything it depends on — the spec's canonical text, the
packer, the target's Python, platform and base image id, the package sources — and reused
as long as none of them changes. Nothing enters the cache unchecked
(:func:`builder.environment.archive_check.check_archive`): a cached tarball is one Triton can load.

The tarball then goes into the repository with
:func:`builder.environment.attach.attach_environment`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from builder.build_epoch import build_epoch
from builder.cache import cache_dir, content_hash, marked_complete, staged, staging_directory
from builder.environment.archive_check import check_archive, check_spec, numpy_constraint
from builder.environment.errors import ArchiveCheckError
from builder.environment.index import PackageIndex
from builder.environment.packers import (
    ARCHIVE_NAME,
    PLAIN_ARCHIVE_NAME,
    Packer,
    StepClock,
    canonical_archive,
    choose_packer,
)
from builder.environment.spec import EnvironmentSpec
from builder.environment.target import EnvironmentTarget
from builder.progress import Log

RECIPE = "triton-builder environment 3"
"""Bumped when the way environments are made changes, so old cache entries stop matching
(2: the lock names every distribution, setuptools too, with its wheel's sha256; 3: canonical
archives, the same bytes for the same files). An uncompressed archive is keyed apart
(:func:`environment_key`'s ``compress``), not by a new recipe: its members are the same."""

LOCK_NAME = "environment.lock.txt"
METADATA_NAME = "environment.json"


@dataclass(frozen=True)
class EnvironmentTarball:
    """A checked environment archive, its lock (what it holds, pinned) and where it came from."""

    path: Path
    lock: Path | None
    """The lock file; None for an archive made elsewhere that came without one."""
    key: str
    packer: str
    python_version: str
    numpy_version: str
    reused: bool
    """True when it came from the cache, made by an earlier build."""
    seconds: float = 0.0
    """Time this call took to produce it (cache lookups included)."""
    steps: tuple[tuple[str, float], ...] = ()
    """Where that time went when it was made: ``download``, ``install``, ``pack`` (the
    packer's), ``canonical`` (the canonical archive), ``check``; empty when it was reused."""

    @classmethod
    def from_archive(cls, archive: str | os.PathLike, target: EnvironmentTarget, *,
                     lock: str | os.PathLike | None = None) -> EnvironmentTarball:
        """Use an archive made elsewhere, once it passes the same checks as ours."""
        archive = Path(archive).resolve()
        report = check_archive(archive, target)
        return cls(path=archive, lock=Path(lock).resolve() if lock else None,
                   key=content_hash(archive),
                   packer="prebuilt", python_version=report.python_version,
                   numpy_version=report.numpy_version, reused=True)


def environment_key(spec: EnvironmentSpec, target: EnvironmentTarget, packer: Packer,
                    index: PackageIndex, compress: bool = True) -> str:
    """The cache key: sha256 of everything the tarball depends on (not the CA bundle), the
    build's epoch too (the archive's mtimes), and whether it is compressed."""
    return content_hash(RECIPE, packer.name, packer.fingerprint(), spec.canonical(),
                        target.fingerprint(), index.fingerprint(), numpy_constraint(target) or "",
                        str(build_epoch()), *([] if compress else ["uncompressed"]))


def pack_environment(
    spec: EnvironmentSpec,
    target: EnvironmentTarget,
    *,
    packer: str | Packer | None = None,
    index: PackageIndex | None = None,
    cache: str | os.PathLike | None = None,
    compress: bool = True,
    on_log: Log | None = None,
) -> EnvironmentTarball:
    """Return the checked environment tarball for ``spec`` on ``target``, cached by content.

    ``packer`` is ``"venv"``, ``"conda"`` or a :class:`~builder.environment.packers.Packer`
    (default:
    chosen by the spec); ``cache`` defaults to ``$TRITON_BUILDER_CACHE/environments``;
    ``compress=False`` makes a plain ``environment.tar`` (for an environment that ships
    unpacked: gzip would only be undone). Raises
    :class:`~builder.environment.errors.EnvironmentBuildError` before anything is cached.
    """
    started = time.monotonic()
    log = on_log or (lambda line: None)
    index = index or PackageIndex()
    chosen = choose_packer(spec, packer)
    if chosen.name == "venv":
        target.require_matching_stub()
    check_spec(spec, target)
    key = environment_key(spec, target, chosen, index, compress)
    name = ARCHIVE_NAME if compress else PLAIN_ARCHIVE_NAME
    root = Path(cache) if cache is not None else cache_dir("environments")
    root.mkdir(parents=True, exist_ok=True)
    entry = root / key[:32]
    if marked_complete(entry):
        log(f"environment {key[:12]} is cached: {entry / name}")
        return _load(entry, reused=True, started=started)
    with staging_directory(f"{key[:12]}.partial-", root) as work:
        result = chosen.pack(spec, target, work, index=index, on_log=log)
        clock = StepClock()
        archive = canonical_archive(result.archive, work / name)
        clock.lap("canonical")
        log(f"checking {archive.name} against {target.where}")
        report = check_archive(archive, target, label=chosen.describe(spec))
        clock.lap("check")
        steps = (*result.seconds, *clock.laps)
        log("environment made in " + ", ".join(f"{step} {seconds:.1f} s"
                                                 for step, seconds in steps)
            + (f"; {result.downloaded_bytes / 1e9:.2f} GB of wheels downloaded"
               if result.downloaded_bytes else ""))
        with staged(entry) as staging:
            shutil.move(archive, staging / name)
            (staging / name).chmod(0o644)
            (staging / LOCK_NAME).write_text(_lock_header(chosen.name, report.python_version,
                                                          target) + result.lock)
            (staging / METADATA_NAME).write_text(json.dumps({
                "key": key, "packer": chosen.name, "python_version": report.python_version,
                "numpy_version": report.numpy_version, "layout": report.layout,
                "target": target.where, "target_image_id": target.image_id,
                "spec": json.loads(spec.canonical()), "warnings": list(result.warnings),
                "archive": name, "steps": dict(steps),
                "downloaded_bytes": result.downloaded_bytes,
            }, indent=2) + "\n")
    log(f"environment {key[:12]} packed: {entry / name}")
    return _load(entry, reused=False, started=started)


def _load(entry: Path, *, reused: bool, started: float) -> EnvironmentTarball:
    metadata = json.loads((entry / METADATA_NAME).read_text())
    archive = entry / metadata.get("archive", ARCHIVE_NAME)
    if not archive.is_file():
        raise ArchiveCheckError(f"cache entry {entry} lost its archive: delete the directory "
                                f"and build again")
    return EnvironmentTarball(
        path=archive, lock=entry / LOCK_NAME, key=metadata["key"], packer=metadata["packer"],
        python_version=metadata["python_version"], numpy_version=metadata["numpy_version"],
        reused=reused, seconds=time.monotonic() - started,
        steps=() if reused else tuple(metadata.get("steps", {}).items()),
    )


def _lock_header(packer: str, python_version: str, target: EnvironmentTarget) -> str:
    return (f"# The model environment, as packed by triton-builder ({packer} packer) for "
            f"{target.where}\n# Python {python_version}, {target.machine}, glibc "
            f"{target.glibc_version} or newer\n")
