"""One platform's image: its base, the model repository, the environment, the verified image.

The stages in their order, for one platform of a :class:`~builder.job.build_plan.BuildPlan`.
The image stays untagged here: :mod:`builder.job.publish` tags it once every platform is
verified, and what the build made goes into ``leftovers`` for the caller to remove if it does
not get that far.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import docker
from docker.models.images import Image

from builder.base import Release, ensure_base_image, pin_platform_variant, platform_image
from builder.bridge import PythonPlan, fit_base_python
from builder.client import DEFAULT_TIMEOUT, Client, event_stream
from builder.engine import (
    DEFAULT_PLATFORM,
    Leftovers,
    Platform,
    PlatformSupport,
    platform_option,
    platform_references,
)
from builder.environment import prepare_environment, ships_unpacked
from builder.image import (
    ImageOptions,
    PythonRuntime,
    ServingImage,
    build_serving_image,
    emulated_allowance,
)
from builder.job.build_options import BuildOptions
from builder.job.build_plan import BuildPlan
from builder.pipeline import Pipeline
from builder.progress import Log, stderr_line, step_log, timed_step
from builder.push import PushResult
from builder.repository import build_pipeline_model
from builder.verify import (
    Check,
    ContainerEndpoint,
    Verification,
    VerifyOptions,
    check_same,
    concurrent_check,
    distinct_calls,
    docker_run_command,
    short_call,
    verify_image,
)


@dataclass
class ImageBuild(ServingImage):
    """What :func:`builder.job.build_docker_image` made (or found, ``built=False``), verified,
    tagged and pushed: the :class:`~builder.image.serving_image.ServingImage` and what the later
    stages added."""

    tags: list[str] = field(default_factory=list)
    run_command: str = ""
    verification: Verification | None = None
    pushed: dict[str, PushResult] = field(default_factory=dict)
    """Each reference pushed → the digest the registry confirmed (of a multi-platform build's
    references: the image index's)."""
    seconds: float = 0.0
    peak_memory_bytes: int = 0
    """The build process's peak RSS (:func:`builder.progress.peak_memory`), read at its end."""
    platform_images: dict[str, ImageBuild] = field(default_factory=dict)
    """A multi-platform build: every platform's image (``linux/arm64`` → its build)."""


def build_platform(pipe: Pipeline, plan: BuildPlan, target: Platform, options: BuildOptions,
                   *, client: docker.DockerClient, workdir: Path, support: PlatformSupport,
                   leftovers: Leftovers, on_log: Log | None = None) -> ImageBuild:
    """``target``'s image of ``pipe``, built and verified (unless ``target`` is one of the
    plan's unverified platforms), untagged."""
    where = f" for {target}" if plan.multi else ""
    with timed_step(f"base image {plan.python[target].release.image}{where}", on_log):
        python = _on_platform(client, plan.python[target])
        base = ensure_base_image(client, python.release, on_log=on_log)
    release, python = fit_base_python(python, client, base.id)
    models = workdir / (target.architecture if plan.multi else "") / "models"
    with timed_step(f"model repository (export, configs, pipe.pickle){where}", on_log):
        built = build_pipeline_model(pipe, models, options.repository, target=release)
    with timed_step(f"python environment{where}", on_log):
        prepared = prepare_environment(
            client, built, python, operators=[node.op for node in pipe.nodes],
            options=options.environment, bridge=options.bridge, tracing=options.image.tracing,
            on_log=on_log)
    image = replace(options.image, environment_python=python.python_version,
                    platforms=tuple(t.name for t in plan.targets) if plan.multi else (),
                    user=_user(options.image.user, release, python.own_stub, on_log))
    timeout = emulated_allowance(DEFAULT_TIMEOUT) if support.emulated else DEFAULT_TIMEOUT
    verifying = options.verify
    checks = [pipeline_check(built.pipeline_model, pipe, plan.calls, plan.expected,
                             verifying.tolerance, timeout=timeout)]
    name = platform_references([plan.image_name], target)[0] if plan.multi else plan.image_name
    if target in plan.unverified:
        verifying = replace(verifying, enabled=False)
    with timed_step(f"image {name}" + (" (verified)" if verifying.enabled else ""), on_log):
        return build_verified(
            built.model_root, name, release, base, client=client, options=image,
            python_models=python.describe() if python.own_stub else None,
            python_runtime=PythonRuntime(
                stub=python.stub, python_version=prepared.target.full_python_version,
                interpreter_image=python.interpreter.image if python.bridged else None,
                interpreter_image_id=prepared.target.image_id if python.bridged else None),
            verifying=verifying, checks=checks, shm_size=built.shm_size, support=support,
            leftovers=leftovers, on_log=on_log)


def build_verified(  # noqa: PLR0913 - options as keywords (issue 68: options objects)
    repository_dir: str | os.PathLike,
    image_name: str,
    release: Release,
    base: Image,
    *,
    client: docker.DockerClient,
    options: ImageOptions,
    verifying: VerifyOptions,
    checks: Sequence[Check],
    python_models: str | None = None,
    python_runtime: PythonRuntime | None = None,
    shm_size: str | None = None,
    support: PlatformSupport | None = None,
    leftovers: Leftovers,
    on_log: Log | None = None,
) -> ImageBuild:
    """The serving image built and verified, untagged (what it made goes into ``leftovers``,
    for the caller to remove where the build does not end tagged). ``support`` says whether
    the image runs emulated here (given :func:`~builder.image.startup.emulated_allowance` to
    start) and whether it is the engine's own platform (its ``docker run`` needs no
    ``--platform``); ``shm_size`` the ``/dev/shm`` its requests need where Docker's default is
    too small (:attr:`builder.repository.BuildResult.shm_size`)."""
    emulated = support is not None and support.emulated
    native = support is None or support.native
    image = build_serving_image(repository_dir, image_name=image_name, release=release,
                                base=base, options=options, python_models=python_models,
                                python_runtime=python_runtime, client=client,
                                leftovers=leftovers, on_log=on_log)
    platform = platform_option(release.platform)
    verification = None
    if image.built and verifying.enabled:
        with step_log(f"verifying {image_name}", on_log) as log:
            timeout = (verifying.timeout_s if verifying.timeout_s is not None
                       else image.ready_timeout_s)
            if emulated:
                timeout = emulated_allowance(timeout)
                log(f"{release.platform} runs under emulation here: allowing {timeout:.0f}s "
                    f"to be ready (instead of {image.ready_timeout_s:.0f}s) and "
                    f"{emulated_allowance(DEFAULT_TIMEOUT):.0f}s a request (instead of "
                    f"{DEFAULT_TIMEOUT:.0f}s)")
            verification = verify_image(
                client, image.id, checks, gpus=verifying.gpus, shm_size=shm_size,
                timeout=timeout, on_log=log, repository_dir=repository_dir,
                owner=leftovers.owner, platform=platform,
                weights=image.weight_sources if image.weights_lock is not None else None)
    return ImageBuild(**vars(image), verification=verification,
                      run_command=docker_run_command(
                          image_name, gpus=release.gpu, shm_size=shm_size,
                          platform=platform if platform and not native else None,
                          weights_cache=image.weights_lock is not None))


def pipeline_check(model: str, pipe: Pipeline, calls: Sequence[tuple[Any, ...]],
                   expected: Sequence[Any], tolerance: float,
                   timeout: float = DEFAULT_TIMEOUT) -> Check:
    """Every call over gRPC and HTTP must answer what the in-process pipeline answered, each
    within ``timeout`` seconds; then the calls and perturbed copies of them, in flight together
    (:mod:`builder.verify.concurrent`). A streaming pipeline's calls, collected, must be the
    items ``pipe.stream`` yields, over HTTP too where its calls travel there
    (:func:`builder.client.event_stream.carries`)."""
    http = pipe.streaming is None or event_stream.carries(pipe.signature())
    schemes = ("grpc", "http") if http else ("grpc",)

    def check(endpoint: ContainerEndpoint) -> None:
        addresses = {"grpc": endpoint.grpc_url, "http": endpoint.http_url}
        for scheme, address in ((s, addresses[s]) for s in schemes):
            with Client(f"{scheme}://{address}/{model}", timeout=timeout) as client:
                for call, reference in zip(calls, expected):
                    check_same(client(*call), reference, tolerance,
                               where=f"{model}{short_call(call)} over {scheme}")
        pairs = distinct_calls(pipe, list(calls), list(expected))
        concurrent_check(model, pairs, tolerance, timeout)(endpoint)

    return check


def _user(user: str | None, release: Release, own_stub: bool, on_log: Log | None) -> str | None:
    """Who the image runs as: ``user`` — but root by default where the release can only
    extract its environment from an archive at start and a stub of our own sits in the model
    directory: that stub cannot run before the extraction, and the python backend's ``chmod``
    of it then needs root (:mod:`builder.environment.stub_rpath`; 22.12 and 23.05 bridged)."""
    if user is None and own_stub and not ships_unpacked(release):
        (on_log or stderr_line)(
            f"the image runs as root: {release.describe()} extracts its environment at every "
            f"start, and its python backend must then make the bridged stub executable itself")
        return "root"
    return user


def _on_platform(client: docker.DockerClient, plan: PythonPlan) -> PythonPlan:
    """``plan`` with the images it takes from registries (the release's, a bridge's
    interpreter) pinned to its platform's variant by digest: the engine holds one platform per
    tag, so another platform's is pulled by digest (:func:`builder.base.platform_image`)."""
    release = pin_platform_variant(client, plan.release)
    interpreter = plan.interpreter
    if plan.bridged and interpreter.image and release.platform != DEFAULT_PLATFORM:
        interpreter = replace(interpreter, image=platform_image(client, interpreter.image,
                                                                release.platform))
    return replace(plan, release=release, interpreter=interpreter)
