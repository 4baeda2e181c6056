"""What a bridged image needs before its environment is packed: stub, interpreter, packer.

:func:`builder.base.python_bridge.plan_python` decides *that* an image is bridged and by which
routes; this turns the plan into parts: the stub for the builder's Python (from the
``nvidia-pytriton`` wheel bundling the release's Triton), the image the interpreter is copied from
(:func:`builder.environment.target.interpreter_target`) and the packer that carries it
(:class:`builder.environment.carried.CarriedInterpreterPacker`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import docker

from builder.base.cpu import REQUIREMENTS as CPU_BASE_REQUIREMENTS
from builder.base.cpu import requirements_for
from builder.base.python_bridge import PythonPlan, require_buildable
from builder.environment.carried import CarriedInterpreterPacker
from builder.environment.packers import Packer
from builder.environment.target import EnvironmentTarget, interpreter_target
from builder.tritonserver.wheel import wheel_stub


@dataclass(frozen=True)
class BridgeParts:
    """What a bridged build needs before the environment is packed."""

    target: EnvironmentTarget
    """Where the environment's interpreter comes from (and packages are installed)."""
    packer: Packer
    stub: Path
    """The python backend stub for the builder's Python, placed in the model directories."""
    backends: tuple[str, ...] = ("python",)
    """The backends whose models run on the stub: on the CPU base also its Python-based
    onnxruntime backend, whose packages then come from the environment (:attr:`requirements`)."""
    requirements: tuple[str, ...] = ()
    unpacked: bool = False
    """Whether the environment goes in as a directory (see
    :func:`builder.environment.attach.attach_environment`): on the CPU base, whose two backends
    would extract it at the same time."""


def bridge_environment(client: docker.DockerClient, plan: PythonPlan) -> BridgeParts:
    """The interpreter target, packer and stub of a bridged ``plan``."""
    require_buildable(plan)
    assert plan.interpreter.image is not None and plan.stub.requirement is not None
    stub = wheel_stub(plan.stub.requirement, plan.python_version)
    path, libraries = stub.path, stub.libraries
    target = interpreter_target(client, plan.interpreter.image, python_version=plan.python_version,
                                triton_version=plan.release.triton_version)
    parts = BridgeParts(target=target, packer=CarriedInterpreterPacker(libraries), stub=path)
    if plan.release.gpu:
        return parts
    return replace(parts, backends=("python", "onnxruntime"),
                   requirements=cpu_backend_requirements(plan.python_version), unpacked=True)


def cpu_backend_requirements(python_version: str) -> tuple[str, ...]:
    """The pinned packages of the CPU base's onnxruntime backend, for ``python_version``."""
    return tuple(requirements_for(
        (resources.files("builder.envs") / CPU_BASE_REQUIREMENTS).read_text(),
        python_version).split())
