"""The whole job, one step per stage: base → repository → environment → image → verify → push.

:func:`build_docker_image` is what users came for: the release's base image
(:mod:`builder.base`), the model repository (:mod:`builder.repository`), the one Python
environment packed against that base (:mod:`builder.environment`), the serving image
(:mod:`builder.image`), run and compared — over gRPC and HTTP — with the in-process pipeline on
its examples (:mod:`builder.verify`), and only then tagged and pushed (:mod:`builder.push`).
:func:`build_image_from_repository` is its second half, for a repository written before.

A new image stays untagged until verification passed: a failing build, a failing verification or
an interrupt never leaves a tag on a broken image, and the image is removed again.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import docker
from docker.models.images import Image

from builder.base import BaseOptions, Release, ensure_base_image, resolve
from builder.bridge import BridgeOptions, fit_base_python, plan_python, require_buildable
from builder.client import Client
from builder.engine import docker_client, tag_references
from builder.environment import (
    PYTORCH_INDEX,
    EnvironmentOptions,
    PackageIndex,
    prepare_environment,
)
from builder.image import (
    DRAIN_S,
    ImageOptions,
    PythonRuntime,
    ServingImage,
    build_serving_image,
    discard_image,
)
from builder.pipeline import Pipeline
from builder.progress import Log, stderr_line, step_log, timed_step
from builder.push import PushResult, push_image, tag_image
from builder.repository import build_pipeline_model
from builder.verify import (
    Check,
    ContainerEndpoint,
    NothingToVerifyError,
    Verification,
    VerifyOptions,
    check_same,
    docker_run_command,
    verify_image,
)


@dataclass
class ImageBuild(ServingImage):
    """What :func:`build_docker_image` made (or found, ``built=False``), verified, tagged and
    pushed: the :class:`~builder.image.serving_image.ServingImage` and what the later stages
    added."""

    tags: list[str] = field(default_factory=list)
    run_command: str = ""
    verification: Verification | None = None
    pushed: dict[str, PushResult] = field(default_factory=dict)
    seconds: float = 0.0


def build_docker_image(
    pipe: Pipeline,
    image_name: str,
    *,
    cuda: str | float | None = None,
    slim: bool = False,
    tags: Iterable[str] = (),
    triton_version: str | None = None,
    base_image: str | None = None,
    base_python: str | None = None,
    format_priority: Sequence[str] = ("onnx",),
    parallelism: int = 1,
    env_specs: Iterable[str | os.PathLike] = (),
    requirements: Iterable[str] = (),
    packer: str | None = None,
    index: PackageIndex | None = None,
    pytorch_index: str | None = PYTORCH_INDEX,
    bridge: bool = True,
    interpreter_image: str | None = None,
    compile_stub: bool = False,
    triton_sources: str | os.PathLike | None = None,
    verify: bool = True,
    verify_calls: Sequence[tuple[Any, ...]] | None = None,
    tolerance: float = 1e-4,
    user: str | None = None,
    drain_s: float = DRAIN_S,
    push: bool = False,
    options: Sequence[StageOptions] = (),
    client: docker.DockerClient | None = None,
    on_log: Log | None = None,
    **pipeline_options: Any,
) -> ImageBuild:
    """Build, verify and tag (and ``push``) the Triton serving image of ``pipe``.

    ``cuda`` picks the ``nvcr.io/nvidia/tritonserver`` release
    (:func:`~builder.base.releases.resolve`; ``None`` or ``"cpu"`` is the CPU base);
    ``triton_version`` / ``base_image`` override it; ``base_python`` picks the CPU base
    (3.11: Debian bookworm; 3.13: Debian trixie). ``slim=True`` builds for ``cuda`` on the slim
    GPU base instead of NGC's release (:func:`~builder.base.releases.slim_release`: the
    nvidia-pytriton wheel's Triton 2.51 on Debian, the CUDA libraries from NVIDIA's wheels in
    the environment, ONNX operators on onnxruntime-gpu).
    Where the release's Python is not this builder's, the python models are *bridged*
    (:mod:`builder.bridge`): a stub for this Python from the release's branch and
    an environment that carries this interpreter (taken from ``interpreter_image``, by default
    the official Python image on a glibc no newer than the release's). ``bridge=False``, or a
    release no bridge reaches, fails before anything is pulled or built. Stubs that no wheel
    bundles are compiled from the release's python_backend branch on the release image
    (``compile_stub=True`` forces that route); ``triton_sources`` is a directory of source
    tarballs for builders that reach no source host (default: fetched by the build).
    The environment holds what the pickled pipeline imports (pinned to the versions used here),
    ``env_specs`` (files in ``envs/``), ``requirements`` and the operators' own requirements;
    torch is resolved for the release's CUDA (a CPU build for the CPU base) from
    ``pytorch_index`` (PyTorch's per-CUDA indexes; ``None`` skips it) or, where that cannot be
    reached, from the package index by each wheel's metadata
    (:mod:`builder.environment.torch_for_cuda`).
    Verification sends ``verify_calls`` (default: the pipeline's examples) and compares with
    ``pipe(*call)`` within ``tolerance``. Other keyword arguments go to
    :func:`builder.repository.writer.build_pipeline_model`.

    The keywords are grouped once into each stage's option object (:class:`BaseOptions`,
    :class:`BridgeOptions`, :class:`EnvironmentOptions`, :class:`ImageOptions`,
    :class:`VerifyOptions`); ``options`` may hold such objects instead (each replaces its
    group's keywords, which must then be left at their defaults).
    """
    started = time.monotonic()
    chosen = _stage_options(options, {
        BaseOptions: dict(cuda=cuda, triton_version=triton_version, base_image=base_image,
                          base_python=base_python, slim=slim),
        BridgeOptions: dict(enabled=bridge, interpreter_image=interpreter_image,
                            compile_stub=compile_stub, triton_sources=triton_sources),
        EnvironmentOptions: dict(env_specs=tuple(env_specs), requirements=tuple(requirements),
                                 packer=packer, index=index, pytorch_index=pytorch_index),
        ImageOptions: dict(user=user, drain_s=drain_s),
        VerifyOptions: dict(enabled=verify, calls=verify_calls, tolerance=tolerance)})
    base_options, bridging, environment, image_options, verifying = (
        chosen[BaseOptions], chosen[BridgeOptions], chosen[EnvironmentOptions],
        chosen[ImageOptions], chosen[VerifyOptions])
    references = tag_references(image_name, tags)
    calls = list(verifying.calls if verifying.calls is not None else
                 [tuple(call) for call in pipe.examples])
    if verifying.enabled and not calls:
        raise NothingToVerifyError(
            "verification needs at least one call: give the pipeline an example "
            "(pipe.with_example(...)) or pass verify_calls=[...], or verify=False")
    expected = [pipe(*call) for call in calls]
    release = resolve(base_options.cuda, base_options.triton_version, base_options.base_image,
                      base_python=base_options.base_python, slim=base_options.slim)
    plan = plan_python(release, options=bridging, conda=environment.packer == "conda")
    require_buildable(plan)
    client = client or docker_client()
    with timed_step(f"base image {release.image}", on_log):
        base = ensure_base_image(client, release, on_log=on_log)
    release, plan = fit_base_python(plan, client, base.id)
    with tempfile.TemporaryDirectory(prefix="triton-builder-") as workdir:
        with timed_step("model repository (export, configs, pipe.pickle)", on_log):
            built = build_pipeline_model(pipe, Path(workdir) / "models", format_priority,
                                         parallelism, target=release, **pipeline_options)
        with timed_step("python environment", on_log):
            prepared = prepare_environment(client, built, plan,
                                           operators=[node.op for node in pipe.nodes],
                                           options=environment, bridge=bridging, on_log=on_log)
        checks = [_pipeline_check(built.pipeline_model, calls, expected, verifying.tolerance)]
        with timed_step(f"image {image_name}" + (" (verified)" if verifying.enabled else ""),
                        on_log):
            return _image_verify_push(
                built.model_root, references, release, base, client=client,
                options=replace(image_options, environment_python=plan.python_version),
                python_models=plan.describe() if plan.own_stub else None,
                python_runtime=PythonRuntime(
                    stub=plan.stub, python_version=prepared.target.full_python_version,
                    interpreter_image=plan.interpreter.image if plan.bridged else None,
                    interpreter_image_id=prepared.target.image_id if plan.bridged else None),
                verifying=verifying, checks=checks, push=push, started=started,
                on_log=on_log)


def build_image_from_repository(
    repository_dir: str | os.PathLike,
    *,
    image_name: str,
    tags: Iterable[str] = (),
    base: BaseOptions = BaseOptions(),
    image: ImageOptions = ImageOptions(),
    verify: VerifyOptions = VerifyOptions(),
    checks: Sequence[Check] = (),
    push: bool = False,
    client: docker.DockerClient | None = None,
    on_log: Log | None = None,
) -> ImageBuild:
    """The serving image of a model repository written before, as ``image_name`` (plus ``tags``).

    ``tags`` are full references or bare tags of ``image_name``'s repository. ``base`` chooses
    the release (:func:`builder.base.resolve`; by default the CPU base); ``image`` holds the
    labels, user, server flags and environment for
    :func:`builder.image.serving_image.build_serving_image` (``image.environment_python`` is the
    Python of a bridged repository's environment; default: the release's).
    ``verify`` runs the image with ``checks`` (:mod:`builder.verify.verification`) before any tag
    is set; ``push`` pushes every tag and confirms the digests with the registry.

    A GPU release is verified on GPUs where the engine has an NVIDIA runtime, and each
    ``KIND_GPU`` model must be seen running on one; elsewhere those models are verified on the
    CPU (their configs swapped for ``KIND_CPU`` ones in the verification container only) and
    ``verification.gpu_placement`` says that the placement was not exercised. An image
    tagged by an unverified build is reused as it is by a later build of the same inputs.
    """
    started = time.monotonic()
    references = tag_references(image_name, tags)
    release = resolve(base.cuda, base.triton_version, base.base_image,
                      base_python=base.base_python, slim=base.slim)
    client = client or docker_client()
    with step_log(f"base image {release.image}", on_log) as log:
        base_image = ensure_base_image(client, release, on_log=log)
    return _image_verify_push(repository_dir, references, release, base_image, client=client,
                              options=image, verifying=verify, checks=checks, push=push,
                              started=started, on_log=on_log)


def _image_verify_push(
    repository_dir: str | os.PathLike,
    references: list[str],
    release: Release,
    base: Image,
    *,
    client: docker.DockerClient,
    options: ImageOptions,
    verifying: VerifyOptions,
    checks: Sequence[Check],
    push: bool,
    started: float,
    python_models: str | None = None,
    python_runtime: PythonRuntime | None = None,
    on_log: Log | None = None,
) -> ImageBuild:
    """The stages after the environment."""
    image = build_serving_image(repository_dir, image_name=references[0], release=release,
                                base=base, options=options, python_models=python_models,
                                python_runtime=python_runtime, client=client, on_log=on_log)
    verification = None
    try:
        if image.built and verifying.enabled:
            with step_log(f"verifying {references[0]}", on_log) as log:
                timeout = (verifying.timeout_s if verifying.timeout_s is not None
                           else image.ready_timeout_s)
                verification = verify_image(client, image.id, checks, gpus=verifying.gpus,
                                            timeout=timeout, on_log=log,
                                            repository_dir=repository_dir)
        run_command = docker_run_command(references[0], gpus=release.gpu)
        tag_image(client, image.id, references)
    except BaseException:
        discard_image(client, image)
        raise
    result = ImageBuild(**vars(image), tags=references, run_command=run_command,
                        verification=verification)
    if push:
        with step_log(f"pushing {', '.join(references)}", on_log) as log:
            for reference in references:
                result.pushed[reference] = push_image(client, reference, on_log=log)
    result.seconds = time.monotonic() - started
    (on_log or stderr_line)(f"run it: {result.run_command}")
    return result


StageOptions = BaseOptions | BridgeOptions | EnvironmentOptions | ImageOptions | VerifyOptions


def _stage_options(given: Sequence[StageOptions],
                   keywords: dict[type, dict[str, Any]]) -> dict[type, Any]:
    """Each stage's options: the object the caller gave, or one made from its keywords.

    A keyword of a group whose object was given must be left at its default: two answers to one
    question are refused, naming the keyword, before anything is pulled or written.
    """
    chosen = {kind: kind(**values) for kind, values in keywords.items()}
    for option in given:
        kind = type(option)
        if kind not in keywords:
            raise TypeError(f"options: not a stage's options: {option!r}")
        clashing = [name for name in keywords[kind]
                    if getattr(chosen[kind], name) != getattr(kind(), name)]
        if clashing:
            raise ValueError(f"{', '.join(clashing)} given both as keywords and in "
                             f"{kind.__name__}: give each once")
        chosen[kind] = option
    return chosen


def _pipeline_check(model: str, calls: list[tuple[Any, ...]], expected: list[Any],
                    tolerance: float) -> Check:
    """Every call over gRPC and HTTP must answer what the in-process pipeline answered."""

    def check(endpoint: ContainerEndpoint) -> None:
        for scheme, address in (("grpc", endpoint.grpc_url), ("http", endpoint.http_url)):
            with Client(f"{scheme}://{address}/{model}") as client:
                for call, reference in zip(calls, expected):
                    check_same(client(*call), reference, tolerance,
                               where=f"{model}{_short(call)} over {scheme}")

    return check


def _short(call: tuple[Any, ...]) -> str:
    text = repr(call)
    return text if len(text) <= 60 else text[:57] + "...)"
