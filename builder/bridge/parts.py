"""The parts a plan needs before its environment is packed: the stub and the interpreter image.

:func:`builder.bridge.plan.plan_python` decides *that* an image is bridged and by which routes;
:func:`prepare_bridge` turns the plan into parts: the stub for the builder's Python (from the
``nvidia-pytriton`` wheel bundling the release's Triton, :mod:`builder.bridge.wheel_stub`, or
compiled, :mod:`builder.bridge.stub_build`), the libraries it loads from its wheel, and the image
the environment's interpreter is copied from. The environment stage makes its target and packer
from them (:func:`builder.environment.prepare.prepare_environment`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import docker

from builder.base.cpu import cpu_backend_requirements
from builder.base.releases import StubSource
from builder.bridge.plan import PythonPlan, require_buildable
from builder.bridge.stub_build import compile_stub
from builder.bridge.wheel_stub import wheel_stub
from builder.progress import Log


@dataclass(frozen=True)
class BridgeParts:
    """What a plan with a stub of its own needs before the environment is packed."""

    stub: Path
    """The python backend stub for the builder's Python, placed in the model directories."""
    libraries: tuple[Path, ...] = ()
    """Shared libraries the stub loads from beside it in its wheel; they travel in the
    environment's ``lib/`` with the carried interpreter."""
    interpreter_image: str | None = None
    """The image the environment's interpreter is copied from; None: the release's own python3
    (a native plan that only brings its own stub)."""
    backends: tuple[str, ...] = ("python",)
    """The backends whose models run on the stub: on the CPU base also its Python-based
    onnxruntime backend, whose packages then come from the environment (:attr:`requirements`)."""
    requirements: tuple[str, ...] = ()

    @property
    def bridged(self) -> bool:
        return self.interpreter_image is not None


def prepare_bridge(client: docker.DockerClient, plan: PythonPlan, *,
                   triton_sources: str | os.PathLike | None = None,
                   on_log: Log | None = None) -> BridgeParts:
    """The stub of ``plan`` (from a wheel, or compiled on the release image from
    ``triton_sources`` or fetched sources) and, when bridged, the interpreter image."""
    require_buildable(plan)
    release = plan.release
    libraries: tuple[Path, ...] = ()
    if plan.stub.kind is StubSource.WHEEL and plan.stub.requirement:
        stub = wheel_stub(plan.stub.requirement, plan.python_version)
        path, libraries = stub.path, stub.libraries
    else:  # against the Python the environment carries (bridged) or the release's own
        path = compile_stub(client, branch=str(plan.stub.branch),
                            python_version=plan.python_version, build_image_name=release.image,
                            python_image=plan.interpreter.image if plan.bridged else None,
                            pybind11=plan.stub.pybind11, sources=triton_sources,
                            gpu=release.gpu, on_log=on_log)
    if not plan.bridged:
        return BridgeParts(stub=path)
    if release.gpu:
        return BridgeParts(stub=path, libraries=libraries,
                           interpreter_image=plan.interpreter.image)
    return BridgeParts(stub=path, libraries=libraries, interpreter_image=plan.interpreter.image,
                       backends=("python", "onnxruntime"),
                       requirements=cpu_backend_requirements(
                           plan.python_version, plan.release.platform.machine))
