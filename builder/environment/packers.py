"""Packers: make the environment for a target and pack it into one relocatable tarball.

* :class:`VenvPacker` (requirements files) — wheels for the target's Python and platform are
  downloaded on this host (where the package indexes, proxies and certificates are), then the
  target's own ``python3`` makes the venv and installs them with no network: in a container of
  the target image, or on this host for host-process servers. So the venv's base interpreter
  is the image's, at the path the image has it, and every compiled wheel fits its glibc.
  ``venv-pack`` packs it (it reads the files only: it needs no working interpreter here).
* :class:`CondaPacker` (``environment.yml``) — ``conda``/``mamba``/``micromamba env create``
  when one is on ``PATH``, or an existing environment (``prefix=``), packed by ``conda-pack``.
  A conda environment brings its own Python, so it runs wherever the C library is new enough.

Both return the archive and a lock (what is inside, pinned): ``pip freeze --all`` for a venv,
with the sha256 of each installed wheel (:mod:`builder.environment.lock`), the conda records
plus the pip-installed distributions for conda. Every tool's failure is raised
with its own output; conda-pack's warnings are passed on, never dropped.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from builder.build_epoch import build_epoch
from builder.environment.archive_check import numpy_constraint
from builder.environment.canonical_archive import write_canonical_archive
from builder.environment.errors import ArchiveCheckError, PackError, TargetError
from builder.environment.index import PackageIndex
from builder.environment.lock import hash_lock
from builder.environment.portable_scripts import drop_venv_command, make_scripts_portable
from builder.environment.spec import EnvironmentSpec
from builder.environment.target import EnvironmentTarget
from builder.progress import Log

ARCHIVE_NAME = "environment.tar.gz"
PLAIN_ARCHIVE_NAME = "environment.tar"
"""The canonical archive's name where it is not compressed (an environment that ships
unpacked: :func:`canonical_archive`)."""
RAW_ARCHIVE_NAME = "environment.raw.tar"
"""What a packer writes before :func:`canonical_archive` makes the archive of it."""
PIP_FOR_TARGET = "pip"
"""Run from its wheel by the target's Python: base images often lack pip and python3-venv."""


def canonical_archive(raw: Path, archive: Path) -> Path:
    """``archive``, the canonical ``.tar.gz`` (or plain ``.tar``) of the packer's plain tar
    ``raw`` (then removed): the same environment gives the same bytes
    (:mod:`builder.environment.canonical_archive`)."""
    write_canonical_archive(raw, archive, mtime=build_epoch())
    raw.unlink()
    return archive


@dataclass(frozen=True)
class PackResult:
    """A packed environment: the packer's plain tar (made canonical by
    :func:`builder.environment.tarball.pack_environment`), its lock, any warnings the packer
    gave, and the seconds each of its steps took (``download``, ``install``, ``pack``)."""

    archive: Path
    lock: str
    warnings: tuple[str, ...] = ()
    seconds: tuple[tuple[str, float], ...] = ()
    downloaded_bytes: int = 0
    """The wheels fetched for it, in bytes (what the package index served)."""


class Packer(Protocol):
    """Makes and packs an environment for a target inside ``workdir``."""

    name: str

    def fingerprint(self) -> str:
        """What besides the spec and target decides the result (hashed into the cache key)."""
        ...

    def describe(self, spec: EnvironmentSpec) -> str:
        """The environment it makes from ``spec``, in words, for messages."""
        ...

    def pack(self, spec: EnvironmentSpec, target: EnvironmentTarget, workdir: Path, *,
             index: PackageIndex, on_log: Log) -> PackResult: ...


def choose_packer(spec: EnvironmentSpec, packer: str | Packer | None = None) -> Packer:
    """``environment.yml`` specs → conda, requirements → venv; ``packer`` overrides."""
    if packer is None:
        packer = "conda" if spec.conda else "venv"
    if packer == "venv":
        if spec.conda:
            raise PackError(
                "the spec comes from an environment.yml (conda dependencies: "
                f"{', '.join(spec.conda_dependencies) or 'none'}); the venv packer installs "
                "pip requirements only: use the conda packer, or give a requirements file"
            )
        return VenvPacker()
    if packer == "conda":
        return CondaPacker()
    if isinstance(packer, str):
        raise PackError(f"unknown packer {packer!r}: use 'venv' or 'conda'")
    return packer


class VenvPacker:
    """A venv made by the target's own ``python3`` from wheels fetched on this host."""

    name = "venv"

    def fingerprint(self) -> str:
        return ""

    def describe(self, spec: EnvironmentSpec) -> str:
        return f"the venv packed from {', '.join(spec.sources()) or 'an empty spec'}"

    def pack(self, spec: EnvironmentSpec, target: EnvironmentTarget, workdir: Path, *,
             index: PackageIndex, on_log: Log) -> PackResult:
        workdir = workdir.resolve()
        clock = StepClock()
        requirements, constraints, wheels = fetch_wheels(spec, target, workdir, index, on_log)
        clock.lap("download")
        venv, lock = workdir / "venv", workdir / "lock.txt"
        pip = pip_wheel(wheels) / "pip"
        python = str(venv / "bin" / "python")
        install = [python, str(pip), "install", "--no-index", "--find-links", str(wheels),
                   "--no-compile", "--no-cache-dir", "--disable-pip-version-check",
                   "--no-warn-script-location", "-r", str(requirements), "-c", str(constraints)]
        freeze = [python, str(pip), "freeze", "--all", "--disable-pip-version-check"]
        create = [target.python_executable, "-m", "venv", "--without-pip", str(venv)]
        script = (f"set -e; {shlex.join(create)} && {shlex.join(install)}"
                  f" && {shlex.join(freeze)} > {shlex.quote(str(lock))}")
        on_log(f"making the venv with {target.python_executable} on {target.where}")
        try:
            target.run(["/bin/sh", "-c", script], what="make the venv and install its packages",
                       binds=[workdir], env={"HOME": "/tmp", "PIP_CONFIG_FILE": os.devnull})
        except TargetError as error:
            raise PackError(str(error)) from error
        clock.lap("install")
        for site_packages in venv.glob("lib/python*/site-packages"):
            make_scripts_portable(site_packages, venv)
        drop_venv_command(venv)
        raw = workdir / RAW_ARCHIVE_NAME
        on_log(f"packing {venv} with venv-pack")
        import venv_pack

        try:
            venv_pack.pack(prefix=str(venv), output=str(raw), format="tar", force=True)
        except venv_pack.VenvPackException as error:
            raise PackError(f"venv-pack could not pack {venv}: {error}") from error
        clock.lap("pack")
        return PackResult(archive=raw, lock=hash_lock(lock.read_text(), wheels),
                          seconds=clock.laps,
                          downloaded_bytes=sum(w.stat().st_size for w in wheels.glob("*.whl")))


class CondaPacker:
    """A conda environment, created from the spec or taken as it is (``prefix``)."""

    name = "conda"

    def __init__(self, prefix: str | os.PathLike | None = None,
                 executable: str | None = None) -> None:
        self.prefix = Path(prefix).resolve() if prefix else None
        self.executable = executable

    def fingerprint(self) -> str:
        """An existing environment is identified by its conda records and installed dists."""
        if self.prefix is None:
            return ""
        digest = hashlib.sha256(str(self.prefix).encode())
        for record in sorted((self.prefix / "conda-meta").glob("*")):
            digest.update(record.name.encode())
            digest.update(record.read_bytes() if record.is_file() else b"")
        for site in sorted(self.prefix.glob("lib/python3.*/site-packages")):
            digest.update("\n".join(sorted(p.name for p in site.iterdir())).encode())
        return digest.hexdigest()

    def describe(self, spec: EnvironmentSpec) -> str:
        if self.prefix is not None:
            return f"the conda environment at {self.prefix}"
        return f"the conda environment made from {', '.join(spec.sources()) or 'an empty spec'}"

    def pack(self, spec: EnvironmentSpec, target: EnvironmentTarget, workdir: Path, *,
             index: PackageIndex, on_log: Log) -> PackResult:
        if target.machine != platform.machine():
            raise PackError(
                f"a conda environment is made on this {platform.machine()} host, but "
                f"{target.where} is {target.machine}: build on a {target.machine} machine"
            )
        prefix = self.prefix or self._create(spec, target, workdir.resolve(), index, on_log)
        _check_prefix_python(prefix, target)
        raw = workdir.resolve() / RAW_ARCHIVE_NAME
        on_log(f"packing {prefix} with conda-pack")
        import conda_pack

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                conda_pack.pack(prefix=str(prefix), output=str(raw), format="tar", force=True)
            except conda_pack.CondaPackException as error:
                raise PackError(f"conda-pack could not pack {prefix}:\n{error}") from error
        notes = tuple(f"conda-pack: {warning.message}" for warning in caught)
        for note in notes:
            on_log(note)
        return PackResult(archive=raw, lock=conda_lock(prefix), warnings=notes)

    def _create(self, spec: EnvironmentSpec, target: EnvironmentTarget, workdir: Path,
                index: PackageIndex, on_log: Log) -> Path:
        tool = self.executable or next(
            (found for name in ("mamba", "micromamba", "conda") if (found := shutil.which(name))),
            None)
        if tool is None:
            raise PackError(
                "an environment.yml needs conda, mamba or micromamba on PATH to create the "
                "environment, and none is there: install one (micromamba is a single file), "
                "pack an existing environment (CondaPacker(prefix=...)), or give the "
                "requirements as a requirements file (venv packer)"
            )
        environment_yml = workdir / "environment.yml"
        environment_yml.write_text(spec.environment_yml(target.stub_python_version))
        prefix = workdir / "conda-env"
        if Path(tool).name.startswith("micromamba"):
            command = [tool, "create", "--yes", "--prefix", str(prefix), "--file",
                       str(environment_yml)]
        else:
            command = [tool, "env", "create", "--prefix", str(prefix), "--file",
                       str(environment_yml)]
        on_log(f"creating the conda environment: {shlex.join(command)}")
        result = subprocess.run(command, capture_output=True, text=True,
                                env={**os.environ, **index.environment()})
        if result.returncode != 0:
            raise PackError(f"{Path(tool).name} could not create the environment (exit "
                            f"{result.returncode}):\n{(result.stdout + result.stderr)[-6000:]}")
        return prefix


class StepClock:
    """Seconds per named step, measured one after another (what a pack's time went into)."""

    def __init__(self) -> None:
        self._last = time.monotonic()
        self.laps: tuple[tuple[str, float], ...] = ()

    def lap(self, step: str) -> float:
        now = time.monotonic()
        seconds, self._last = now - self._last, now
        self.laps = (*self.laps, (step, seconds))
        return seconds


def fetch_wheels(spec: EnvironmentSpec, target: EnvironmentTarget, workdir: Path,
                 index: PackageIndex, on_log: Log) -> tuple[Path, Path, Path]:
    """Write the spec's requirements and the stub's constraints into ``workdir`` and download
    their wheels for the target; return (requirements, constraints, wheel directory)."""
    requirements, constraints = workdir / "requirements.txt", workdir / "constraints.txt"
    requirements.write_text(spec.requirements_text())
    constraints.write_text(f"{numpy_constraint(target) or ''}\n")
    on_log(f"downloading wheels for Python {target.full_python_version} "
           f"({target.machine}, glibc {target.glibc_version})")
    download_wheels(requirements, constraints, target, workdir / "wheels", index)
    return requirements, constraints, workdir / "wheels"


def download_wheels(requirements: Path, constraints: Path, target: EnvironmentTarget,
                    dest: Path, index: PackageIndex) -> None:
    """Fetch wheels for the target's Python and platform (never sdists: nothing builds there)."""
    command = [
        sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--implementation", "cp",
        "--python-version", target.full_python_version,
        *(argument for tag in target.platform_tags() for argument in ("--platform", tag)),
        "--dest", str(dest), "--progress-bar", "off", "--disable-pip-version-check",
        "-r", str(requirements), "-c", str(constraints), *index.pip_arguments(), PIP_FOR_TARGET,
    ]
    result = subprocess.run(command, capture_output=True, text=True,
                            env={**os.environ, **index.environment()})
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        hint = ("pip could not verify the index's certificate: pass the CA bundle that signs it "
                "(ca_bundle; behind an intercepting proxy, the proxy's CA)"
                if "CERTIFICATE_VERIFY_FAILED" in output else
                "only wheels are used (nothing is compiled for the image): for a package without "
                "a wheel for this platform, build one and pass its directory as find_links")
        raise PackError(
            f"pip could not download the environment's wheels for Python "
            f"{target.full_python_version} on {target.machine} (glibc {target.glibc_version}) "
            f"(exit {result.returncode}):\n{output[-6000:]}\n{hint}"
        )


def conda_lock(prefix: Path) -> str:
    """What a conda environment holds: its conda records, then distributions pip put there."""
    managed: set[str] = set()
    lines = ["# conda packages: name=version=build (channel)"]
    for path in sorted((prefix / "conda-meta").glob("*.json")):
        record = json.loads(path.read_text())
        managed.update(record.get("files", []))
        lines.append(f"{record['name']}={record['version']}={record.get('build', '')}"
                     f"  # {record.get('channel', '')}")
    lines.append("# installed by pip (not managed by conda)")
    for site in sorted(prefix.glob("lib/python3.*/site-packages")):
        for dist in importlib.metadata.distributions(path=[str(site)]):
            files = [str(Path(site.relative_to(prefix)) / str(f)) for f in dist.files or []]
            if not any(f in managed for f in files):
                lines.append(f"{dist.metadata['Name']}=={dist.version}")
    return "\n".join(lines) + "\n"


def _check_prefix_python(prefix: Path, target: EnvironmentTarget) -> None:
    """Fail before packing (possibly gigabytes) when the environment's Python cannot load."""
    if not (prefix / "conda-meta").is_dir():
        raise PackError(f"{prefix} is not a conda environment (no conda-meta/): pass the "
                        f"environment's prefix, e.g. $CONDA_PREFIX")
    for path in (prefix / "conda-meta").glob("python-[0-9]*.json"):
        version = json.loads(path.read_text()).get("version", "")
        if ".".join(version.split(".")[:2]) != target.stub_python_version:
            raise ArchiveCheckError(
                f"{prefix} has Python {version}, but the python backend stub of "
                f"{target.where} is built for Python {target.stub_python_version}: recreate "
                f"it with python={target.stub_python_version}"
            )


def pip_wheel(wheels: Path) -> Path:
    found = sorted(wheels.glob("pip-*.whl"))
    if not found:
        raise PackError(f"no pip wheel was downloaded into {wheels}")
    return found[-1]
