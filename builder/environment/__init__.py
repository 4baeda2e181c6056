"""Custom Python environments: one packed tarball per image, shared by its python models.

The steps of a build, in order: :func:`image_target` (probe the image the environment must
run in) → :func:`load_spec` (``envs/`` files, extra requirements, the operators' own) →
:func:`pack_environment` (venv-pack or conda-pack, checked, cached by content) →
:func:`attach_environment` (one file in the repository, ``EXECUTION_ENV_PATH`` everywhere).
"""

from builder.environment.attach import attach_environment
from builder.environment.errors import (
    ArchiveCheckError,
    EnvironmentBuildError,
    PackError,
    SpecError,
    TargetError,
)
from builder.environment.index import PackageIndex
from builder.environment.packers import CondaPacker, VenvPacker
from builder.environment.spec import EnvironmentSpec, load_spec, requires
from builder.environment.tarball import EnvironmentTarball, pack_environment
from builder.environment.target import EnvironmentTarget, host_target, image_target

__all__ = [
    "ArchiveCheckError",
    "CondaPacker",
    "EnvironmentBuildError",
    "EnvironmentSpec",
    "EnvironmentTarball",
    "EnvironmentTarget",
    "PackError",
    "PackageIndex",
    "SpecError",
    "TargetError",
    "VenvPacker",
    "attach_environment",
    "host_target",
    "image_target",
    "load_spec",
    "pack_environment",
    "requires",
]
