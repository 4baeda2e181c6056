"""Splitting a model repository into the layers of the serving image.

Docker reuses a layer only while everything above it is unchanged, so the repository is sorted
by how often its files change:

* ``environment`` — packed Python environments (``*.tar.gz``, ``*.tgz``, ``*.tar``, or an unpacked
  one: a directory holding ``bin/activate``), plus tarballs passed explicitly, which go to
  :data:`ENVIRONMENTS_DIR`. Gigabytes, changed when dependencies change.
* ``weights`` — model files by suffix (``*.onnx``, ``*.pt``, ``*.safetensors``, ``*.plan`` …) and
  anything of :data:`LARGE_FILE` bytes or more, one *part* (a layer of its own) per model
  directory, so that a retrained model rebuilds, pushes and pulls its own layer alone; files at
  the repository's top are the part :data:`REPOSITORY_PART`.
* ``code`` — the rest: ``config.pbtxt``, ``model.py``, pickled pipelines, small JSON. Changed on
  every edit, and cheap to rebuild.

The context holds each layer as a directory copied to ``/`` (``environment/``,
``weights/<model>/``, ``code/``), each file at its path in the image under it —
``code/models/pipeline/config.pbtxt``, ``weights/encoder/models/encoder/1/model.onnx`` —
so the parent directories are in the context too, with the context's canonical dates and modes,
not made by ``COPY`` with the build's clock (see ``dockerfiles/serving.Dockerfile.j2``).
Files are hard-linked into the context where possible, so a multi-gigabyte environment is not
copied on every build. A symlink inside the repository stays a symlink (in its target's layer);
one that leaves the repository is replaced by what it points at (once: other links to the same
file become links to that copy), in the layer of the link's own place — a virtual environment's
``bin/python`` pointing at the host's interpreter is the environment's, not the code's.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from builder.cache import cache_dir, file_sha256
from builder.errors import TritonBuilderError

ENVIRONMENTS_DIR = "/opt/triton-builder/environments"
LAYERS = ("environment", "weights", "code")
LARGE_FILE = 16 * 1024 * 1024
ENVIRONMENT_SUFFIXES = (".tar.gz", ".tgz", ".tar")
WEIGHT_SUFFIXES = frozenset({
    ".onnx", ".data", ".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".plan", ".engine",
    ".pb", ".h5", ".keras", ".tflite", ".pdmodel", ".pdiparams", ".gguf", ".ggml", ".npy",
    ".npz", ".msgpack", ".ot", ".joblib", ".mlmodel", ".xgb", ".ubj", ".lgb", ".params",
})
SKIPPED_DIRECTORIES = frozenset({"__pycache__", ".ipynb_checkpoints", ".git"})
REPOSITORY_PART = "_repository"
"""The weights part of files at the model repository's top (not in a model's directory)."""


class BuildContextError(TritonBuilderError, ValueError):
    """The repository cannot be laid out as a build context."""


@dataclass(frozen=True)
class ContextEntry:
    """One file, symlink or empty directory of the context, and the layer it belongs to."""

    layer: str
    path: str
    """Where it goes in the context, e.g. ``weights/linear/models/linear/1/model.onnx``."""
    source: Path | None = None
    link: str | None = None
    directory: bool = False
    part: str = ""
    """The context directory one ``COPY`` takes it from: the layer's name, or for weights the
    model's (``weights/<part>/``)."""

    @property
    def executable(self) -> bool:
        return bool(self.source and os.stat(self.source).st_mode & stat.S_IXUSR)


@dataclass(frozen=True)
class ContextPlan:
    """Every entry of a repository's build context, sorted into layers."""

    entries: tuple[ContextEntry, ...]
    model_repository: str

    def layer(self, name: str) -> tuple[ContextEntry, ...]:
        return tuple(e for e in self.entries if e.layer == name)

    def has(self, name: str) -> bool:
        return any(e.layer == name for e in self.entries)

    def size(self, name: str) -> int:
        return sum(os.stat(e.source).st_size for e in self.layer(name) if e.source)

    def weight_parts(self) -> tuple[str, ...]:
        """The weights' parts, largest first, each a layer of the image.

        Docker rebuilds every layer after a changed one, and a large pretrained model changes
        less often than a small head trained on top of it; a rebuilt layer of unchanged content
        is byte-identical (canonical dates and modes), so its push uploads nothing either way."""
        parts = {entry.part for entry in self.layer("weights")}
        return tuple(sorted(parts, key=lambda part: (-self.part_size(part), part)))

    def part_size(self, part: str) -> int:
        """Bytes of the weights part ``part``."""
        return sum(os.stat(e.source).st_size for e in self.layer("weights")
                   if e.part == part and e.source)

    def digest(self, *layers: str) -> str:
        """A sha256 over paths, kinds, exec bits and contents of ``layers`` (all if none)."""
        digest = hashlib.sha256()
        for entry in self.entries:
            if layers and entry.layer not in layers:
                continue
            digest.update(f"{entry.layer}\0{entry.path}\0".encode())
            if entry.directory:
                digest.update(b"dir\0")
            elif entry.link is not None:
                digest.update(f"link\0{entry.link}\0".encode())
            elif entry.source is not None:
                digest.update(b"x\0" if entry.executable else b"f\0")
                digest.update(file_digest(entry.source).encode())
        return digest.hexdigest()

    def write(self, context: Path, layers: Iterable[str]) -> Path:
        """Lay out ``layers`` under ``context`` (hard links where the file system allows)."""
        wanted = set(layers)
        for entry in self.entries:
            if entry.layer not in wanted:
                continue
            target = context / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            if entry.directory:
                target.mkdir(parents=True, exist_ok=True)
            elif entry.link is not None:
                os.symlink(entry.link, target)
            elif entry.source is not None:
                _place(entry.source, target, entry.executable)
        return context


def plan_context(
    repository: str | os.PathLike,
    *,
    environments: Iterable[str | os.PathLike] = (),
    model_repository: str = "/models",
) -> ContextPlan:
    """Sort ``repository`` (and explicit environment tarballs) into the image's layers."""
    root = Path(repository).resolve()
    if not root.is_dir():
        raise BuildContextError(f"not a model repository directory: {repository}")
    image_root = PurePosixPath(model_repository).relative_to("/")
    environment_dirs = environment_directories(root)
    entries: list[ContextEntry] = []
    copied: dict[Path, str] = {}
    for relative, path in _walk(root):
        rel = PurePosixPath(relative)
        if path is None:
            entries.append(_entry("code", rel, image_root, directory=True))
            continue
        layer = _layer(path, rel, environment_dirs)
        if path.is_symlink():
            inside = _inside(root, path)
            if inside is not None:
                link = os.path.relpath(inside, path.parent.resolve())
                target_rel = PurePosixPath(inside.relative_to(root).as_posix())
                entries.append(_entry(_layer(inside, target_rel, environment_dirs),
                                      rel, image_root, link=link))
                continue
            target = path.resolve()
            if target.is_dir():
                raise BuildContextError(
                    f"{relative} links to a directory outside the repository ({target}); copy "
                    f"it in or link to files")
            if target in copied:
                link = posixpath.relpath(copied[target], rel.parent.as_posix())
                entries.append(_entry(layer, rel, image_root, link=link))
                continue
            copied[target] = rel.as_posix()
            path = target
        entries.append(_entry(layer, rel, image_root, source=path))
    seen: set[str] = set()
    for tarball in environments:
        tarball = Path(tarball).resolve()
        if not tarball.is_file():
            raise BuildContextError(f"environment tarball not found: {tarball}")
        if tarball.name in seen:
            raise BuildContextError(f"two environments are named {tarball.name}")
        seen.add(tarball.name)
        entries.append(ContextEntry(
            "environment", f"environment{environment_image_path(tarball)}", source=tarball))
    entries.sort(key=lambda e: (LAYERS.index(e.layer), e.path))
    return ContextPlan(tuple(entries), model_repository)


def environment_image_path(tarball: str | os.PathLike) -> str:
    """Where an explicit environment tarball lands in the image (for ``EXECUTION_ENV_PATH``)."""
    return f"{ENVIRONMENTS_DIR}/{Path(tarball).name}"


_DIGESTS: dict[tuple[int, int, int, int, int], str] = {}
PERSISTED_DIGEST_SIZE = 4 * 1024 * 1024


def file_digest(path: Path) -> str:
    """sha256 of a file, remembered by (device, inode, size, mtime, ctime).

    Re-hashing gigabytes of unchanged weights on every build would cost more than the rebuild of
    the code layer itself, so digests of large files are also kept on disk (like git's index: any
    write or ``chmod`` moves ctime, which no tool can set back).
    """
    info = os.stat(path)
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    cached = _DIGESTS.get(key)
    if cached is not None:
        return cached
    record = None
    if info.st_size >= PERSISTED_DIGEST_SIZE:
        name = hashlib.sha256(repr((str(Path(path).resolve()), key)).encode()).hexdigest()
        record = cache_dir("file-digests", name[:2]) / name
        try:
            cached = record.read_text().strip()
        except OSError:
            cached = None
    if not cached or len(cached) != 64:
        cached = file_sha256(path)
        if record is not None:
            partial = record.with_suffix(f".{os.getpid()}.partial")
            partial.write_text(cached)
            os.replace(partial, record)
    _DIGESTS[key] = cached
    return cached


def _walk(root: Path) -> list[tuple[str, Path | None]]:
    """(relative path, path) for files and symlinks; (relative path, None) for empty dirs."""
    found: list[tuple[str, Path | None]] = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRECTORIES)
        here = Path(directory)
        links = [d for d in subdirs if (here / d).is_symlink()]
        subdirs[:] = [d for d in subdirs if d not in links]
        kept = [n for n in names if not n.endswith((".pyc", ".pyo"))] + links
        for name in sorted(kept):
            found.append(((here / name).relative_to(root).as_posix(), here / name))
        if not kept and not subdirs and here != root:
            found.append((here.relative_to(root).as_posix(), None))
    return found


def environment_directories(root: Path) -> list[Path]:
    """Unpacked environments (``EXECUTION_ENV_PATH`` may name a directory with bin/activate),
    each once (links to one from other models are not followed)."""
    return sorted(p.parent.parent for p in Path(root).resolve().rglob("bin/activate")
                  if p.is_file())


def _layer(path: Path, rel: PurePosixPath, environment_dirs: list[Path]) -> str:
    """The layer of the file at ``path``, found at ``rel`` in the repository (its place, not a
    link's target, says whether it belongs to an environment)."""
    name = rel.name.lower()
    if name.endswith(ENVIRONMENT_SUFFIXES) or any(
            d in path.parents for d in environment_dirs):
        return "environment"
    if PurePosixPath(name).suffix in WEIGHT_SUFFIXES:
        return "weights"
    if path.is_file() and os.stat(path).st_size >= LARGE_FILE:
        return "weights"
    return "code"


def _entry(layer: str, rel: PurePosixPath, image_root: PurePosixPath, **kind) -> ContextEntry:
    """The entry of ``rel`` in ``layer``: weights under their model's part
    (``weights/<model>/models/<model>/...``), the other layers under their own name."""
    if layer != "weights":
        return ContextEntry(layer, f"{layer}/{image_root / rel}", part=layer, **kind)
    part = rel.parts[0] if len(rel.parts) > 1 else REPOSITORY_PART
    return ContextEntry(layer, f"weights/{part}/{image_root / rel}", part=part, **kind)


def _inside(root: Path, link: Path) -> Path | None:
    target = link.resolve()
    return target if target == root or root in target.parents else None


def _place(source: Path, target: Path, executable: bool) -> None:
    """Hard-link when the file already has the mode the image should have; copy otherwise."""
    mode = 0o755 if executable else 0o644
    if stat.S_IMODE(os.stat(source).st_mode) == mode:
        try:
            os.link(source, target)
            return
        except OSError:
            pass
    shutil.copyfile(source, target)
    os.chmod(target, mode)
