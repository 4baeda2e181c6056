"""What a bridged image needs before its environment is packed: stub, interpreter, packer.

:func:`builder.base.python_bridge.plan_python` decides *that* an image is bridged and by which
routes; this turns the plan into parts: the stub for the builder's Python (from the
``nvidia-pytriton`` wheel bundling the release's Triton, or compiled:
:mod:`builder.environment.stub_build`), the image the interpreter is copied from
(:func:`builder.environment.target.interpreter_target`) and the packer that carries it
(:class:`builder.environment.carried.CarriedInterpreterPacker`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import docker

from builder.base.cpu import REQUIREMENTS as CPU_BASE_REQUIREMENTS
from builder.base.cpu import requirements_for
from builder.base.python_bridge import PythonPlan, require_buildable
from builder.environment.carried import CarriedInterpreterPacker
from builder.environment.packers import Packer
from builder.environment.stub_build import compile_stub
from builder.environment.target import EnvironmentTarget, image_target, interpreter_target
from builder.tritonserver.wheel import wheel_stub

Log = Callable[[str], None]


@dataclass(frozen=True)
class BridgeParts:
    """What a bridged build needs before the environment is packed."""

    target: EnvironmentTarget
    """Where the environment's interpreter comes from (and packages are installed)."""
    packer: Packer | None
    """None: the caller's choice (a native plan that only brings its own stub)."""
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


def bridge_environment(client: docker.DockerClient, plan: PythonPlan, *,
                       triton_sources: str | os.PathLike | None = None,
                       on_log: Log | None = None) -> BridgeParts:
    """The stub of ``plan`` (from a wheel, or compiled on the release image from
    ``triton_sources`` or fetched sources) and, when bridged, the interpreter target and packer.

    For a native plan with a stub of its own the target is the release image (its python3)
    and the packer is left to the caller (``packer=None``).
    """
    require_buildable(plan)
    release = plan.release
    if plan.bridged:
        assert plan.interpreter.image is not None
        target = interpreter_target(client, plan.interpreter.image,
                                    python_version=plan.python_version,
                                    triton_version=release.triton_version)
    else:
        target = image_target(client, release.image)
    libraries: tuple[Path, ...] = ()
    if plan.stub.kind == "pytriton-wheel" and plan.stub.requirement:
        stub = wheel_stub(plan.stub.requirement, plan.python_version)
        path, libraries = stub.path, stub.libraries
    else:  # against the Python the environment carries (bridged) or the release's own
        path = compile_stub(client, branch=str(plan.stub.branch),
                            python_version=plan.python_version, build_image_name=release.image,
                            python_image=plan.interpreter.image if plan.bridged else None,
                            pybind11=plan.stub.pybind11, sources=triton_sources,
                            gpu=release.gpu, on_log=on_log)
    if not plan.bridged:
        return BridgeParts(target=target, packer=None, stub=path)
    parts = BridgeParts(target=target, packer=CarriedInterpreterPacker(libraries), stub=path)
    if release.gpu:
        return parts
    return replace(parts, backends=("python", "onnxruntime"),
                   requirements=cpu_backend_requirements(plan.python_version), unpacked=True)


def cpu_backend_requirements(python_version: str) -> tuple[str, ...]:
    """The pinned packages of the CPU base's onnxruntime backend, for ``python_version``."""
    return tuple(requirements_for(
        (resources.files("builder.envs") / CPU_BASE_REQUIREMENTS).read_text(),
        python_version).split())
