"""Checks on a packed environment before it ships: would Triton extract and use it?

A failed extraction in Triton poisons every later environment model in that server process
(server#4955), and the other failures (wrong Python, no numpy) surface only as a model that
does not load, deep in a container log. So the whole archive is read here — every member, to
the end of the compressed stream — and held against the target, each failure with a message
that says what to do.
"""

from __future__ import annotations

import configparser
import json
import os
import posixpath
import re
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.environment.errors import ArchiveCheckError, SpecError
from builder.environment.spec import EnvironmentSpec
from builder.environment.target import EnvironmentTarget

ReadMode = Literal["r:gz", "r:"]
FORMATS: dict[str, ReadMode] = {".tar.gz": "r:gz", ".tar": "r:"}
"""What Triton's python backend extracts (besides a plain directory, used in place)."""

NUMPY_2_FIRST_TRITON: Version | None = None
"""The first Triton whose stub we have seen work with numpy 2: none yet.

The stub of Triton 2.51 returns *empty* output tensors when the environment has numpy 2, with
no error anywhere; until a release is checked, numpy 2 is refused for every target.
"""

_NUMPY_1_RELEASES = ("1.19.5", "1.20.3", "1.21.6", "1.22.4", "1.23.5", "1.24.4", "1.25.2",
                     "1.26.4")
_SITE = re.compile(r"^lib/python(3\.\d+)/site-packages(?:/|$)")
_NUMPY_METADATA = re.compile(
    r"^lib/python3\.\d+/site-packages/numpy-([^-/]+)(?:-py[^/]*)?\.(?:dist-info|egg-info)/")
_KEPT = frozenset({"pyvenv.cfg", "bin/activate"})
_HARD_CODED_ACTIVATE = re.compile(r"^\s*(?:export\s+)?VIRTUAL_ENV=['\"]?/", re.MULTILINE)


_CUDA_RUNTIME_DIST = re.compile(
    r"^lib/python3\.\d+/site-packages/(nvidia_cuda_runtime(?:_cu\d+)?-(\d+)\.(\d+)[^/]*"
    r"|torch-[^/+]+\+cu(\d+)(\d))\.dist-info/")


@dataclass(frozen=True)
class CudaRuntime:
    """The CUDA runtime an environment carries, and the distribution that says so."""

    cuda: str
    distribution: str


def archive_cuda_runtime(path: str | os.PathLike[str]) -> CudaRuntime | None:
    """The CUDA runtime inside a packed environment (``nvidia-cuda-runtime`` wheels, or a
    ``torch+cuXY`` build); None when it carries none (CPU packages only). ``path`` may also be
    an unpacked one (a directory), as GPU releases that accept one ship it
    (:mod:`builder.environment.unpacking`)."""
    found: CudaRuntime | None = None
    try:
        for name in _environment_names(Path(path)):
            match = _CUDA_RUNTIME_DIST.match(name)
            if match is None:
                continue
            if match.group(2):  # the runtime's own wheel outranks torch's label
                return CudaRuntime(f"{match.group(2)}.{match.group(3)}", match.group(1))
            found = found or CudaRuntime(f"{match.group(4)}.{match.group(5)}", match.group(1))
    except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
        raise ArchiveCheckError(f"{path} cannot be read: {error}") from error
    return found


def _environment_names(path: Path) -> Iterator[str]:
    """Member names of an archive; for a directory, its ``site-packages`` entries, named alike
    (``lib/python3.11/site-packages/x.dist-info/``), which is where the runtime shows."""
    if path.is_dir():
        for site in sorted(path.glob("lib/python3.*/site-packages")):
            for entry in sorted(site.iterdir()):
                yield f"{entry.relative_to(path).as_posix()}/"
        return
    with tarfile.open(path, "r|*") as archive:
        for member in archive:
            yield posixpath.normpath(member.name.removeprefix("./"))


@dataclass(frozen=True)
class ArchiveReport:
    """What the archive holds, as far as Triton cares."""

    path: Path
    layout: str
    """``venv`` (``pyvenv.cfg``), ``conda`` (``conda-meta/``) or ``interpreter`` (carries its
    own Python: :mod:`builder.environment.carried`)."""
    python_version: str
    numpy_version: str
    home: str | None
    """A venv's base interpreter directory (``home`` in ``pyvenv.cfg``)."""
    members: int


def numpy_constraint(target: EnvironmentTarget) -> str | None:
    """The numpy constraint the target's stub needs (``numpy<2``), or None."""
    if NUMPY_2_FIRST_TRITON is not None and target.triton_version:
        if Version(target.triton_version) >= NUMPY_2_FIRST_TRITON:
            return None
    return "numpy<2"


def check_spec(spec: EnvironmentSpec, target: EnvironmentTarget) -> None:
    """Refuse, before anything is downloaded, a spec that cannot work with the target's stub."""
    if numpy_constraint(target) is None:
        return
    for line in spec.requirements:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == "numpy" and not any(
                requirement.specifier.contains(version) for version in _NUMPY_1_RELEASES):
            raise SpecError(
                f"{line!r} ({spec.where(line)}) asks for numpy 2, but the python backend stub "
                f"of Triton {target.triton_version or '(this version)'} returns empty output "
                f"tensors with numpy 2, silently: require numpy<2 instead"
            )


def check_archive(path: str | Path, target: EnvironmentTarget, *,
                  label: str | None = None) -> ArchiveReport:
    """Read the whole archive and check it against the target; raise what would go wrong.

    ``label`` names the environment in messages about its contents (default: the path).
    """
    path = Path(path)
    name = label or str(path)
    mode = _mode(path)
    contents = _read(path, mode)
    names = contents.names
    if "bin/activate" not in names:
        raise ArchiveCheckError(
            f"{name} has no bin/activate: Triton sources it before it starts the stub. Pack "
            f"the environment with venv-pack or conda-pack (a plain tar of an environment "
            f"does not work)"
        )
    if contents.activate and _HARD_CODED_ACTIVATE.search(contents.activate):
        raise ArchiveCheckError(
            f"{name}: bin/activate sets VIRTUAL_ENV to the absolute path it was built at, but "
            f"Triton extracts the archive elsewhere: pack it with venv-pack, which writes a "
            f"relocatable activate"
        )
    layout, python_version, home = _layout(name, contents)
    if python_version != target.stub_python_version:
        raise ArchiveCheckError(
            f"{name} is a Python {python_version} environment, but the python backend stub of "
            f"{target.where} is built for Python {target.stub_python_version}: the stub would "
            f"not start. Rebuild it with Python {target.stub_python_version} (the venv packer "
            f"builds it with the target's own python3; for conda, set "
            f"python={target.stub_python_version})"
        )
    if layout == "venv" and home not in target.interpreter_dirs:
        raise ArchiveCheckError(
            f"{name} is a venv whose base interpreter lives in {home} (pyvenv.cfg `home`), "
            f"but on {target.where} python3 is {target.python_executable}: the environment "
            f"would have no interpreter. Build it in the target (the venv packer's default)"
        )
    numpy = contents.numpy_version
    if numpy is None:
        raise ArchiveCheckError(
            f"{name} has no numpy: the python backend stub imports numpy from inside the "
            f"environment (the image's own packages are not visible there). Add "
            f"{numpy_constraint(target) or 'numpy'} to the environment's requirements"
        )
    _check_numpy_version(name, numpy, target)
    return ArchiveReport(path=path, layout=layout, python_version=python_version,
                         numpy_version=numpy, home=home, members=len(names))


@dataclass
class _Contents:
    names: set[str]
    python_dirs: set[str]
    pyvenv_cfg: str | None = None
    conda_python: str | None = None
    activate: str | None = None
    numpy_version: str | None = None


def _mode(path: Path) -> ReadMode:
    for suffix, mode in FORMATS.items():
        if path.name.endswith(suffix):
            with open(path, "rb") as stream:
                gzipped = stream.read(2) == b"\x1f\x8b"
            if gzipped != (suffix == ".tar.gz"):
                raise ArchiveCheckError(
                    f"{path} is named {suffix} but is {'' if gzipped else 'not '}gzip-"
                    f"compressed: Triton picks how to extract by the name. Rename or re-pack it"
                )
            return mode
    raise ArchiveCheckError(
        f"{path}: Triton's python backend takes only .tar.gz or .tar environment archives "
        f"(or a directory). Pack it with `venv-pack -o env.tar.gz` or `conda-pack -o env.tar.gz`"
    )


def _read(path: Path, mode: ReadMode) -> _Contents:
    contents = _Contents(names=set(), python_dirs=set())
    try:
        with tarfile.open(path, mode) as archive:
            for member in archive:
                name = _member_name(path, member)
                contents.names.add(name)
                site = _SITE.match(name)
                if site:
                    contents.python_dirs.add(site.group(1))
                numpy = _NUMPY_METADATA.match(name)
                if numpy:
                    contents.numpy_version = numpy.group(1)
                if name.endswith("/site-packages/numpy/__init__.py") and (
                        contents.numpy_version is None):
                    contents.numpy_version = "unknown"  # metadata may follow
                if not member.isfile():
                    continue
                data = _read_member(archive, member, keep=name in _KEPT or name.startswith(
                    "conda-meta/python-"))
                if name == "pyvenv.cfg":
                    contents.pyvenv_cfg = data.decode(errors="replace")
                elif name == "bin/activate":
                    contents.activate = data.decode(errors="replace")
                elif re.match(r"^conda-meta/python-\d[^/]*\.json$", name):
                    record = json.loads(data)
                    if record.get("name") == "python":
                        contents.conda_python = record.get("version")
            trailing = _read_to_end(archive)
    except (tarfile.TarError, EOFError, zlib.error, OSError, json.JSONDecodeError) as error:
        raise ArchiveCheckError(
            f"{path} is corrupt or truncated ({type(error).__name__}: {error}). Triton would "
            f"fail to extract it — and a failed extraction breaks every later environment "
            f"model in that server. Re-pack it (and check the disk it was written to)"
        ) from error
    if trailing:
        raise ArchiveCheckError(
            f"{path} is corrupt or truncated: a tar header cannot be read, and archive data "
            f"follows it (Python's tarfile stops listing there; Triton's extraction would fail "
            f"or miss files). Re-pack it (and check the disk it was written to)"
        )
    if not contents.names:
        raise ArchiveCheckError(f"{path} is an empty archive: re-pack the environment")
    return contents


def _read_to_end(archive: tarfile.TarFile) -> bool:
    """Read past the last member to the end of the stream; True if non-zero data is left.

    tarfile ends its listing quietly at the first unreadable header after the first, so a
    corrupt header would hide the rest of the archive; and a gzip stream's checksum is only
    verified once it is read to its end.
    """
    trailing = False
    while block := archive.fileobj.read(1 << 20):
        trailing = trailing or bool(block.strip(b"\0"))
    return trailing


def _read_member(archive: tarfile.TarFile, member: tarfile.TarInfo, *, keep: bool) -> bytes:
    """Read a member to its end (that is what verifies the stream); return it if ``keep``."""
    stream = archive.extractfile(member)
    if stream is None:
        return b""
    if keep:
        return stream.read()
    while stream.read(1 << 20):
        pass
    return b""


def _member_name(path: Path, member: tarfile.TarInfo) -> str:
    name = posixpath.normpath(member.name.removeprefix("./"))
    if name.startswith(("/", "../")) or name == "..":
        raise ArchiveCheckError(f"{path}: member {member.name!r} would extract outside the "
                                f"environment directory; refusing the archive")
    return name  # links may point anywhere: a venv's bin/python3 names the base interpreter


def _layout(path: str, contents: _Contents) -> tuple[str, str, str | None]:
    if len(contents.python_dirs) != 1:
        found = ", ".join(sorted(contents.python_dirs)) or "none"
        raise ArchiveCheckError(
            f"{path} must hold exactly one lib/python3.X/site-packages (found: {found}): "
            f"pack one environment made with one Python"
        )
    (python_version,) = contents.python_dirs
    if contents.pyvenv_cfg is not None:
        parser = configparser.ConfigParser()
        parser.read_string("[venv]\n" + contents.pyvenv_cfg)
        home = parser.get("venv", "home", fallback="").strip().rstrip("/") or None
        declared = parser.get("venv", "version", fallback="") or parser.get(
            "venv", "version_info", fallback="")
        if declared and ".".join(declared.strip().split(".")[:2]) != python_version:
            raise ArchiveCheckError(
                f"{path}: pyvenv.cfg says Python {declared.strip()} but the packages are in "
                f"lib/python{python_version}: the environment is inconsistent; rebuild it"
            )
        return "venv", python_version, home
    if "conda-meta/history" in contents.names or contents.conda_python is not None:
        if contents.conda_python and not contents.conda_python.startswith(python_version):
            raise ArchiveCheckError(
                f"{path}: conda-meta records python {contents.conda_python} but the packages "
                f"are in lib/python{python_version}: the environment is inconsistent; rebuild it"
            )
        if f"bin/python{python_version}" not in contents.names:
            raise ArchiveCheckError(f"{path} is a conda environment without "
                                    f"bin/python{python_version}: add python to it")
        return "conda", python_version, None
    if {f"bin/python{python_version}", f"lib/python{python_version}/os.py"} <= contents.names:
        if f"lib/libpython{python_version}.so.1.0" not in contents.names:
            raise ArchiveCheckError(
                f"{path} carries Python {python_version} without lib/libpython"
                f"{python_version}.so.1.0: the python backend stub links it from the "
                f"environment's lib/; take the interpreter from an image with a shared libpython")
        return "interpreter", python_version, None
    raise ArchiveCheckError(
        f"{path} is neither a venv (pyvenv.cfg), a conda environment (conda-meta/) nor an "
        f"environment that carries its interpreter (bin/python3.X, lib/python3.X/os.py): pack "
        f"it with venv-pack or conda-pack"
    )


def _check_numpy_version(path: str, numpy: str, target: EnvironmentTarget) -> None:
    constraint = numpy_constraint(target)
    if constraint is None:
        return
    try:
        major = Version(numpy).major
    except InvalidVersion:
        return
    if major >= 2:
        raise ArchiveCheckError(
            f"{path} has numpy {numpy}: the python backend stub of Triton "
            f"{target.triton_version or '(this version)'} returns empty output tensors with "
            f"numpy 2, silently. Pin {constraint} in the environment's requirements"
        )
