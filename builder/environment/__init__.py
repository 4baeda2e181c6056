"""Custom Python environments: one packed tarball per image, shared by its python models.

:func:`prepare_environment` is the stage's entry (:mod:`.prepare`). Its steps, in order:
the bridge's parts where the plan has a stub of its own (:mod:`builder.bridge`) →
:func:`image_target` or :func:`interpreter_target` (probe where the environment must run) →
:func:`load_spec` (``envs/`` files, extra requirements, the operators' own, and what the
repository needs) → torch for the release's CUDA (:mod:`.torch_for_cuda`) →
:func:`pack_environment` (venv-pack, conda-pack or the carried interpreter; checked, cached by
content) → :func:`attach_environment` (one file in the repository, ``EXECUTION_ENV_PATH``
everywhere).
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
from builder.environment.platform_wheels import MissingPlatformWheelError, require_platform_wheels
from builder.environment.prepare import (
    EnvironmentOptions,
    PreparedEnvironment,
    prepare_environment,
)
from builder.environment.spec import EnvironmentSpec, load_spec, requires
from builder.environment.tarball import EnvironmentTarball, pack_environment
from builder.environment.target import (
    EnvironmentTarget,
    host_target,
    image_target,
    interpreter_target,
)
from builder.environment.torch_for_cuda import PYTORCH_INDEX
from builder.environment.unpacking import ships_unpacked

__all__ = [
    "ships_unpacked",
    "ArchiveCheckError",
    "CondaPacker",
    "EnvironmentBuildError",
    "EnvironmentOptions",
    "EnvironmentSpec",
    "EnvironmentTarball",
    "EnvironmentTarget",
    "MissingPlatformWheelError",
    "PYTORCH_INDEX",
    "PackError",
    "PackageIndex",
    "PreparedEnvironment",
    "SpecError",
    "TargetError",
    "VenvPacker",
    "attach_environment",
    "host_target",
    "image_target",
    "interpreter_target",
    "load_spec",
    "pack_environment",
    "prepare_environment",
    "require_platform_wheels",
    "requires",
]
