"""Every requirement has a wheel for every platform of the build: checked before anything is
built, so a package that exists only for x86-64 is refused by name, not minutes into the arm64
half of a build whose amd64 half is done.

Environments are made of wheels only (nothing is compiled for the image: the host has neither
the target's compiler nor its libraries), so what counts is a wheel for the platform's machine
(``manylinux_*_aarch64``), the release's glibc and the environment's Python. pip answers that
without downloading the wheels — ``pip install --dry-run`` reads each wheel's metadata (PEP 658,
where the index serves it) — for the requirements the user gave and the operators'
``@requires``. torch and its companions are left to :mod:`builder.environment.torch_for_cuda`,
which chooses their build per target and refuses by name itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from builder.base.releases import Release
from builder.environment.errors import IndexUnreachableError, SpecError
from builder.environment.index import PackageIndex
from builder.environment.spec import EnvironmentSpec, load_spec
from builder.environment.target import platform_tags
from builder.environment.torch_for_cuda.choice import TORCH, TORCH_COMPANIONS

_NOT_FOUND = re.compile(r"No matching distribution found for ([^\s]+)")
_NO_VERSION = re.compile(r"Could not find a version that satisfies the requirement ([^\s]+)")


class MissingPlatformWheelError(SpecError):
    """A requirement has no wheel for a platform of the build (bad input: exit code 2)."""

    def __init__(self, message: str, requirement: str) -> None:
        super().__init__(message)
        self.requirement = requirement


def unavailable_requirement(pip_output: str) -> str | None:
    """The requirement pip found no distribution for, from its output (None: another failure)."""
    for pattern in (_NOT_FOUND, _NO_VERSION):
        found = pattern.search(pip_output)
        if found:
            return found.group(1)
    return None


def missing_wheel_message(requirement: str, where: str, release: Release, python_version: str,
                          tags: list[str]) -> str:
    """The refusal of ``requirement`` on ``release``'s platform, with what to do about it."""
    return (f"{requirement} ({where}) has no wheel for {release.platform} (Python "
            f"{python_version}, {release.platform.machine}, glibc {release.glibc}: "
            f"{tags[0]} or older) on the package index, and source distributions are not built "
            f"for the image: choose a version that publishes {release.platform.machine} "
            f"wheels, pass a directory of wheels you built for it as find_links, or leave "
            f"{release.platform} out of platforms")


def require_platform_wheels(release: Release, python_version: str, *,
                            env_specs: Iterable[str | os.PathLike[str]] = (),
                            requirements: Iterable[str] = (),
                            operators: Iterable[object] = (),
                            index: PackageIndex | None = None) -> None:
    """Refuse, naming it, the first requirement (of ``env_specs``, ``requirements`` and the
    operators' own) that has no wheel for ``release``'s platform; see the module's text."""
    spec = load_spec(tuple(env_specs), tuple(requirements), tuple(operators))
    if spec.conda:
        return  # conda environments are refused for other machines by their packer
    checked = [line for line in spec.requirements
               if canonicalize_name(Requirement(line).name) not in (TORCH, *TORCH_COMPANIONS)]
    if not checked:
        return
    index = index or PackageIndex()
    tags = platform_tags(release.glibc, release.platform.machine)
    with tempfile.TemporaryDirectory(prefix="triton-builder-wheels-") as workdir:
        listed = Path(workdir) / "requirements.txt"
        listed.write_text("".join(f"{line}\n" for line in checked))
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                   "--quiet", "--only-binary=:all:", "--implementation", "cp",
                   "--python-version", python_version,
                   *(argument for tag in tags for argument in ("--platform", tag)),
                   "--target", str(Path(workdir) / "target"), "--disable-pip-version-check",
                   "--progress-bar", "off", *index.pip_arguments(), "-r", str(listed)]
        result = subprocess.run(command, capture_output=True, text=True,
                                env=_pip_environment(index))
    if result.returncode == 0:
        return
    output = (result.stdout + result.stderr).strip()
    culprit = unavailable_requirement(output)
    if culprit is None:
        raise IndexUnreachableError(
            f"pip could not resolve the environment's wheels for {release.platform} (exit "
            f"{result.returncode}):\n{output[-3000:]}")
    line = next((line for line in checked
                 if canonicalize_name(Requirement(line).name)
                 == canonicalize_name(Requirement(culprit).name)), culprit)
    raise MissingPlatformWheelError(
        missing_wheel_message(line, _origin(spec, line), release, python_version, tags), line)


def _origin(spec: EnvironmentSpec, line: str) -> str:
    """Where ``line`` came from; a name none of them holds is a dependency of one."""
    if line in spec.requirements:
        return spec.where(line)
    return "a dependency of the environment's requirements"


def _pip_environment(index: PackageIndex) -> dict[str, str]:
    return {**os.environ, **index.environment()}
