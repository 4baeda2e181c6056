"""The environment stage's one entry: from a written repository to its attached environment.

:func:`prepare_environment` derives what the environment must hold from the repository that
:func:`builder.repository.writer.build_pipeline_model` wrote (the versions ``pipe.pickle`` was
written with, the model operators' formats and placement) and from the user's options, gets the
bridge's parts where the plan has a stub of its own (:func:`builder.bridge.prepare_bridge`),
chooses torch for the release's CUDA (:mod:`builder.environment.torch_for_cuda`), packs, and
attaches the result to every python model of the repository.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import docker
from packaging.requirements import Requirement

from builder.base.cpu import cpu_backend_requirements
from builder.base.releases import Release, version_key
from builder.bridge import BridgeOptions, PythonPlan, prepare_bridge
from builder.environment.attach import ENVIRONMENT_DIRECTORY, attach_environment
from builder.environment.carried import CarriedInterpreterPacker
from builder.environment.cuda_libraries import check_cuda_libraries
from builder.environment.errors import TargetError
from builder.environment.index import PackageIndex
from builder.environment.spec import (
    EnvironmentSpec,
    load_spec,
    merge_specs,
    missing_requirements,
    requirements_spec,
)
from builder.environment.tarball import EnvironmentTarball, pack_environment
from builder.environment.target import EnvironmentTarget, image_target, interpreter_target
from builder.environment.torch_for_cuda import (
    PICKLE_SOURCE,
    PYTHON_MODEL_SOURCE,
    PYTORCH_INDEX,
    resolve_cuda_packages,
)
from builder.environment.torch_for_cuda.onnxruntime_gpu import (
    ONNX_OPERATOR_SOURCE,
    ONNXRUNTIME_GPU,
)
from builder.environment.unpacking import ships_unpacked
from builder.pipeline.serialization import VERSIONS_FILE
from builder.progress import Log, stderr_line
from builder.repository.export import EXPORT_FORMATS
from builder.repository.writer import BuildResult, BuiltModel
from builder.runtime.tracing import SDK_REQUIREMENTS

BLS_PREFERRED_MEMORY = (23, 4)
"""The first release whose BLS requests can ask for outputs in host memory (``PreferredMemory``)."""


TRACING_SOURCE = "the image's tracing (--tracing)"


@dataclass(frozen=True)
class EnvironmentOptions:
    """What the user adds to, or chooses for, the image's one Python environment."""

    env_specs: tuple[str | os.PathLike, ...] = field(default=(), metadata={"help": (
        "Environment spec files in envs/ (pip requirements .txt, conda .yml).")})
    requirements: tuple[str, ...] = field(default=(), metadata={"help": (
        "Extra pip requirements.")})
    packer: str | None = None
    """``"venv"`` or ``"conda"``; default: chosen by the spec."""
    index: PackageIndex | None = None
    pytorch_index: str | None = field(default=PYTORCH_INDEX, metadata={"help": (
        "PyTorch's wheel indexes (<url>/cu124, <url>/cpu); none to use only the "
        "package index, choosing torch by each wheel's CUDA runtime.")})


@dataclass(frozen=True)
class PreparedEnvironment:
    """The environment attached to a repository, and what it runs on."""

    tarball: EnvironmentTarball
    target: EnvironmentTarget
    models: list[str] = field(default_factory=list)
    """The models that run on it."""


def prepare_environment(
    client: docker.DockerClient,
    built: BuildResult,
    plan: PythonPlan,
    *,
    operators: Iterable[object] = (),
    options: EnvironmentOptions = EnvironmentOptions(),
    bridge: BridgeOptions = BridgeOptions(),
    tracing: bool = False,
    on_log: Log | None = None,
) -> PreparedEnvironment:
    """Make and attach the environment of ``built`` for ``plan`` (its release and Python).

    ``operators`` are the pipeline's own (their ``@requires`` pins join the environment);
    ``tracing`` adds the OpenTelemetry SDK and exporters (an image built ``--tracing``).
    """
    release = plan.release
    parts = (prepare_bridge(client, plan, triton_sources=bridge.triton_sources, on_log=on_log)
             if plan.own_stub else None)
    if parts is not None and parts.interpreter_image is not None:
        target = interpreter_target(client, parts.interpreter_image,
                                    python_version=plan.python_version,
                                    triton_version=release.triton_version)
    else:
        target = image_target(client, release.image)
    if target.machine != release.platform.machine:
        raise TargetError(
            f"{target.where} runs {target.machine} programs, but this environment is for "
            f"{release.platform} ({release.platform.machine}): pass that platform's image")
    spec = environment_spec(built, release, target.python_version, operators, options,
                            tracing)
    if parts is not None and parts.requirements:
        spec = merge_specs(spec, requirements_spec(
            missing_requirements(spec, parts.requirements),
            "the CPU base's onnxruntime backend, bridged"))
    resolution = resolve_cuda_packages(
        spec, release, python_version=target.python_version, platforms=target.platform_tags(),
        index=options.index, pytorch_index=options.pytorch_index, on_log=on_log or stderr_line)
    packer = (CarriedInterpreterPacker(parts.libraries) if parts is not None and parts.bridged
              else options.packer)
    tarball = pack_environment(resolution.spec, target, packer=packer, index=resolution.index,
                               compress=not ships_unpacked(release), on_log=on_log)
    models = attach_environment(built.model_root, tarball,
                                stub=parts.stub if parts else None,
                                backends=parts.backends if parts else
                                environment_backends(release),
                                unpacked=ships_unpacked(release))
    if release.slim and models and any(m.gpu and _served_on_slim(m)
                                       for m in built.models):
        check_cuda_libraries(target, built.model_root / models[0] / ENVIRONMENT_DIRECTORY)
    return PreparedEnvironment(tarball=tarball, target=target, models=models)


def environment_spec(built: BuildResult, release: Release, python_version: str,
                     operators: Iterable[object], options: EnvironmentOptions,
                     tracing: bool = False) -> EnvironmentSpec:
    """Everything the repository's python models import, each line with where it came from."""
    return merge_specs(
        requirements_spec(SDK_REQUIREMENTS if tracing else (), TRACING_SOURCE),
        load_spec(options.env_specs, options.requirements, operators),
        requirements_spec(_pickle_requirements(built.model_root / built.pipeline_model),
                          PICKLE_SOURCE),
        requirements_spec(_python_model_requirements(built.models), PYTHON_MODEL_SOURCE),
        requirements_spec(_in_process_requirements(built.models, python_version,
                                                   release.platform.machine),
                          "ONNX model operators run in the pipeline model"),
        requirements_spec(_onnx_backend_requirements(built.models, release),
                          ONNX_OPERATOR_SOURCE),
        _dlpack_requirements(release, [m.name for m in built.models if m.gpu]))


def environment_backends(release: Release) -> tuple[str, ...]:
    """The backends whose models run on the environment: the python backend's everywhere, and
    on the slim GPU base our Python-based onnxruntime backend's too (its image has no Python
    packages of its own: onnxruntime-gpu and numpy are the environment's)."""
    return ("python", "onnxruntime") if release.slim else ("python",)


def _onnx_backend_requirements(models: Sequence[BuiltModel], release: Release) -> list[str]:
    """onnxruntime-gpu where the slim GPU base serves ONNX model operators (its version is
    chosen for the CUDA by :mod:`builder.environment.torch_for_cuda.onnxruntime_gpu`)."""
    served = [m for m in models if _served_on_slim(m)]
    return [ONNXRUNTIME_GPU] if release.slim and served else []


def _served_on_slim(model: BuiltModel) -> bool:
    """Served by a backend that runs on the environment where the base is slim (not run in
    the pipeline model's own process)."""
    return EXPORT_FORMATS[model.format].served_from_environment_on_slim and not model.in_process


def _dlpack_requirements(release: Release, gpu_models: list[str]) -> EnvironmentSpec:
    """torch, for releases whose BLS hands GPU outputs to the pipeline model in GPU memory.

    Before 23.04 BLS requests cannot ask for host memory (``PreferredMemory``), so the outputs
    of a ``KIND_GPU`` model reach the pipeline model on the GPU, readable only through dlpack:
    the pipeline model reads them with torch (:mod:`builder.runtime.pipeline_model`).
    """
    needed = (release.ngc and version_key(release.release) < BLS_PREFERRED_MEMORY
              and gpu_models)
    return requirements_spec(
        ["torch"] if needed else [],
        f"Triton {release.release} BLS: GPU outputs of {', '.join(gpu_models)} read via dlpack")


def _python_model_requirements(models: Sequence[BuiltModel]) -> list[str]:
    """``python``-format model operators load their module with torch: the builder's torch."""
    if not any(EXPORT_FORMATS[model.format].needs_torch for model in models):
        return []
    import torch

    return [f"torch=={torch.__version__.split('+')[0]}"]


def _in_process_requirements(models: Sequence[BuiltModel], python_version: str,
                             machine: str = "x86_64") -> list[str]:
    """ONNX Runtime where the pipeline model runs model operators itself: the version the CPU
    base's onnxruntime backend runs (the same numerics, one pin when that backend is bridged)."""
    if not any(model.in_process for model in models):
        return []
    return [line for line in cpu_backend_requirements(python_version, machine)
            if Requirement(line).name == "onnxruntime"]


def _pickle_requirements(pipeline_dir: Path) -> list[str]:
    """Pins for what ``pipe.pickle`` imports, from the versions recorded beside it."""
    recorded = json.loads((pipeline_dir / "1" / VERSIONS_FILE).read_text())
    return [f"{name}=={version}" for name, version in sorted(recorded["libraries"].items())]
