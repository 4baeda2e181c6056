"""The whole job, one step per stage: base → repository → environment → image → verify → push.

:func:`build_docker_image` is what users came for: the release's base image
(:mod:`builder.base`), the model repository (:mod:`builder.repository`), the one Python
environment packed against that base (:mod:`builder.environment`), the serving image
(:mod:`builder.image`), run and compared — over gRPC and HTTP — with the in-process pipeline on
its examples (:mod:`builder.verify`), and only then tagged and pushed (:mod:`builder.push`).
:func:`build_image_from_repository` is its second half, for a repository written before.

A new image stays untagged until verification passed: a failing build, a failing verification or
an interrupt (SIGINT or SIGTERM, :mod:`builder.interrupts`) never leaves a tag on a broken image,
and what the build made on the engine — the verification container, the new image and the layers
it made — is removed again (:class:`builder.engine.Leftovers`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import docker
from docker.models.images import Image

from builder.base import (
    BaseOptions,
    Release,
    ensure_base_image,
    pin_platform_variant,
    platform_image,
    resolve,
)
from builder.bridge import (
    BridgeOptions,
    PythonPlan,
    fit_base_python,
    plan_python,
    require_buildable,
)
from builder.client import DEFAULT_TIMEOUT, Client
from builder.engine import (
    DEFAULT_PLATFORM,
    Leftovers,
    Platform,
    UnknownPlatformError,
    docker_client,
    parse_platform,
    parse_platforms,
    platform_option,
    platform_references,
    require_platforms,
    tag_references,
)
from builder.environment import (
    PYTORCH_INDEX,
    EnvironmentOptions,
    PackageIndex,
    prepare_environment,
    require_platform_wheels,
    ships_unpacked,
)
from builder.errors import BuildError
from builder.image import (
    DRAIN_S,
    ImageOptions,
    PythonRuntime,
    ServingImage,
    build_serving_image,
    emulated_allowance,
)
from builder.interrupts import deferred_interrupts, interrupts_stop_once, scratch_directory
from builder.pipeline import Pipeline, check_row_independence
from builder.progress import Log, stderr_line, step_log, timed_step
from builder.push import PushResult, push_image, push_index, tag_image
from builder.repository import build_pipeline_model
from builder.verify import (
    Check,
    ContainerEndpoint,
    NothingToVerifyError,
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
    """What :func:`build_docker_image` made (or found, ``built=False``), verified, tagged and
    pushed: the :class:`~builder.image.serving_image.ServingImage` and what the later stages
    added."""

    tags: list[str] = field(default_factory=list)
    run_command: str = ""
    verification: Verification | None = None
    pushed: dict[str, PushResult] = field(default_factory=dict)
    """Each reference pushed → the digest the registry confirmed (of a multi-platform build's
    references: the image index's)."""
    seconds: float = 0.0
    platform_images: dict[str, ImageBuild] = field(default_factory=dict)
    """A multi-platform build: every platform's image (``linux/arm64`` → its build)."""


@interrupts_stop_once()
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
    platforms: Sequence[str] | None = None,
    no_verify_platforms: Sequence[str] = (),
    verify: bool = True,
    verify_calls: Sequence[tuple[Any, ...]] | None = None,
    tolerance: float = 1e-4,
    export_tolerance: float = 1e-4,
    user: str | None = None,
    drain_s: float = DRAIN_S,
    no_cache: bool = False,
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
    ``pipe(*call)`` within ``tolerance``; ``export_tolerance`` is the export's own check of each
    model operator against torch (and of its rows' independence). Other keyword arguments go
    to :func:`builder.repository.writer.build_pipeline_model` (``target`` and ``model_root``
    are the build's own, per platform, and refused).

    ``platforms`` (``("linux/amd64", "linux/arm64")``; default: linux/amd64) builds one image
    per platform, each on that platform's base with an environment of its machine's wheels,
    each verified — another platform than the engine's under emulation
    (:mod:`builder.engine.emulation`; refused before anything is built where the engine has
    none), ``no_verify_platforms`` skipped with a warning. The engine holds one platform per
    tag: each platform's image is tagged ``TAG-<architecture>`` and the engine's own platform's
    under the references themselves too; ``push`` pushes each platform's tags, then under each
    reference one OCI image index of them (:mod:`builder.push.image_index`), every digest
    confirmed by the registry.

    ``no_cache=True`` builds every layer of the image again, as ``docker build --no-cache``:
    nothing the engine holds from an earlier build of the same inputs is reused.

    Interrupted (Ctrl-C, or SIGTERM, which stops it the same way while it runs unless the
    caller handles SIGTERM), it removes what it made on the engine and sets no tag.

    The keywords are grouped once into each stage's option object (:class:`BaseOptions`,
    :class:`BridgeOptions`, :class:`EnvironmentOptions`, :class:`ImageOptions`,
    :class:`VerifyOptions`); ``options`` may hold such objects instead (each replaces its
    group's keywords, which must then be left at their defaults).
    """
    started = time.monotonic()
    owned = sorted(set(pipeline_options) & {"target", "model_root"})
    if owned:
        raise BuildError(
            f"build_docker_image chooses {' and '.join(f'{k}=' for k in owned)} itself, for "
            f"each platform: choose the release with cuda=, triton_version=, base_image= or "
            f"platforms= (build_pipeline_model takes them for a repository of your own)")
    chosen = _stage_options(options, {
        BaseOptions: dict(cuda=cuda, triton_version=triton_version, base_image=base_image,
                          base_python=base_python, slim=slim),
        BridgeOptions: dict(enabled=bridge, interpreter_image=interpreter_image,
                            compile_stub=compile_stub, triton_sources=triton_sources),
        EnvironmentOptions: dict(env_specs=tuple(env_specs), requirements=tuple(requirements),
                                 packer=packer, index=index, pytorch_index=pytorch_index),
        ImageOptions: dict(user=user, drain_s=drain_s, no_cache=no_cache),
        VerifyOptions: dict(enabled=verify, calls=verify_calls, tolerance=tolerance)})
    base_options, bridging, environment, image_options, verifying = (
        chosen[BaseOptions], chosen[BridgeOptions], chosen[EnvironmentOptions],
        chosen[ImageOptions], chosen[VerifyOptions])
    targets = parse_platforms(platforms)
    unverified = _unverified(targets, no_verify_platforms)
    references = tag_references(image_name, tags)
    calls = list(verifying.calls if verifying.calls is not None else
                 [tuple(call) for call in pipe.examples])
    if verifying.enabled and not calls:
        raise NothingToVerifyError(
            "verification needs at least one call: give the pipeline an example "
            "(pipe.with_example(...)) or pass verify_calls=[...], or verify=False")
    expected = [pipe(*call) for call in calls]
    check_row_independence(pipe, export_tolerance)
    operators = [node.op for node in pipe.nodes]
    plans = {}
    for target in targets:
        release = resolve(base_options.cuda, base_options.triton_version,
                          base_options.base_image, base_python=base_options.base_python,
                          platform=target, slim=base_options.slim)
        plans[target] = plan_python(release, options=bridging,
                                    conda=environment.packer == "conda")
        require_buildable(plans[target])
    if targets != (DEFAULT_PLATFORM,):
        for target in targets:
            require_platform_wheels(plans[target].release, plans[target].python_version,
                                    env_specs=environment.env_specs,
                                    requirements=environment.requirements,
                                    operators=operators, index=environment.index)
    client = client or docker_client()
    support = require_platforms(client, targets)
    log = on_log or stderr_line
    for target in unverified:
        log(f"warning: the {target} image will not be verified (--no-verify-platform "
            f"{target}): it is tagged and pushed without having answered once")
    multi = len(targets) > 1
    builds: dict[Platform, ImageBuild] = {}
    leftovers = Leftovers()
    try:
        with scratch_directory("triton-builder-") as workdir:
            for target in targets:
                plan = plans[target]
                where = f" for {target}" if multi else ""
                with timed_step(f"base image {plan.release.image}{where}", on_log):
                    plan = _on_platform(client, plan)
                    base = ensure_base_image(client, plan.release, on_log=on_log)
                release, plan = fit_base_python(plan, client, base.id)
                models = workdir / (target.architecture if multi else "") / "models"
                with timed_step(f"model repository (export, configs, pipe.pickle){where}",
                                on_log):
                    built = build_pipeline_model(pipe, models, format_priority, parallelism,
                                                 target=release, tolerance=export_tolerance,
                                                 **pipeline_options)
                with timed_step(f"python environment{where}", on_log):
                    prepared = prepare_environment(
                        client, built, plan, operators=operators, options=environment,
                        bridge=bridging, on_log=on_log)
                user = _user(image_options.user, release, plan.own_stub, on_log)
                timeout = (emulated_allowance(DEFAULT_TIMEOUT) if support[target].emulated
                           else DEFAULT_TIMEOUT)
                checks = [_pipeline_check(built.pipeline_model, pipe, calls, expected,
                                          verifying.tolerance, timeout=timeout)]
                name = (platform_references([image_name], target)[0] if multi
                        else image_name)
                checking = verifying if target not in unverified else replace(
                    verifying, enabled=False)
                with timed_step(f"image {name}" + (" (verified)" if checking.enabled else ""),
                                on_log):
                    builds[target] = _build_verified(
                        built.model_root, name, release, base, client=client,
                        options=replace(image_options, environment_python=plan.python_version,
                                        platforms=tuple(t.name for t in targets) if multi
                                        else (), user=user),
                        python_models=plan.describe() if plan.own_stub else None,
                        python_runtime=PythonRuntime(
                            stub=plan.stub, python_version=prepared.target.full_python_version,
                            interpreter_image=plan.interpreter.image if plan.bridged else None,
                            interpreter_image_id=(prepared.target.image_id if plan.bridged
                                                  else None)),
                        verifying=checking, checks=checks, shm_size=built.shm_size,
                        emulated=support[target].emulated,
                        native=support[target].native, leftovers=leftovers, on_log=on_log)
        native = [t for t in targets if support[t].native]
        with deferred_interrupts():
            result = (_tag(client, builds[targets[0]], references) if not multi
                      else _tag_platforms(client, builds, references, native))
    except BaseException:
        leftovers.remove(client)
        raise
    if not multi:
        return _push(result, references, client=client, push=push, started=started,
                     on_log=on_log)
    return _push_platforms(result, builds, references, client=client, push=push,
                           started=started, on_log=on_log)


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


def _unverified(targets: tuple[Platform, ...], names: Iterable[str]) -> tuple[Platform, ...]:
    """The platforms of ``names`` (``--no-verify-platform``), each one of ``targets``."""
    chosen = tuple(parse_platform(name) for name in names)
    stray = [str(p) for p in chosen if p not in targets]
    if stray:
        raise UnknownPlatformError(
            f"no_verify_platforms names {', '.join(stray)}, which this build is not for "
            f"(platforms: {', '.join(map(str, targets))})")
    return chosen


@interrupts_stop_once()
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
    leftovers = Leftovers()
    try:
        built = _build_verified(repository_dir, references[0], release, base_image,
                                client=client, options=image, verifying=verify, checks=checks,
                                leftovers=leftovers, on_log=on_log)
        with deferred_interrupts():
            _tag(client, built, references)
    except BaseException:
        leftovers.remove(client)
        raise
    return _push(built, references, client=client, push=push, started=started, on_log=on_log)


def _build_verified(
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
    emulated: bool = False,
    native: bool = True,
    leftovers: Leftovers,
    on_log: Log | None = None,
) -> ImageBuild:
    """The serving image built and verified, untagged (what it made goes into ``leftovers``,
    for the caller to remove where the build does not end tagged). ``emulated``: the image is
    another platform's than the engine's, so it runs under emulation and is given
    :func:`~builder.image.startup.emulated_allowance` to start; ``native``: it is the engine's
    own platform (its ``docker run`` needs no ``--platform``); ``shm_size`` the ``/dev/shm`` its
    requests need where Docker's default is too small (:attr:`BuildResult.shm_size`)."""
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
                timeout=timeout, on_log=log,
                repository_dir=repository_dir, owner=leftovers.owner, platform=platform)
    return ImageBuild(**vars(image), verification=verification,
                      run_command=docker_run_command(
                          image_name, gpus=release.gpu, shm_size=shm_size,
                          platform=platform if platform and not native else None))


def _tag(client: docker.DockerClient, image: ImageBuild, references: list[str]) -> ImageBuild:
    """Tag a verified image with every reference (the caller holds interrupts back, so the tags
    all land or the build's leftovers go)."""
    tag_image(client, image.id, references)
    image.tags = references
    return image


def _push(image: ImageBuild, references: list[str], *, client: docker.DockerClient,
          push: bool, started: float, on_log: Log | None) -> ImageBuild:
    """Push a tagged image under every reference with their digests confirmed."""
    if push:
        with step_log(f"pushing {', '.join(references)}", on_log) as log:
            for reference in references:
                image.pushed[reference] = push_image(client, reference, on_log=log)
    image.seconds = time.monotonic() - started
    (on_log or stderr_line)(f"run it: {image.run_command}")
    return image


def _tag_platforms(client: docker.DockerClient, builds: dict[Platform, ImageBuild],
                   references: list[str], native: list[Platform]) -> ImageBuild:
    """Every platform's image tagged ``TAG-<architecture>`` (the engine holds one platform per
    tag), the engine's own platform's also under ``references`` themselves.

    Returns the engine's own platform's build (else the first) with ``platform_images`` every
    platform's build (each with its own tags)."""
    for target, image in builds.items():
        image.tags = (platform_references(references, target)
                      + (references if target in native[:1] else []))
        tag_image(client, image.id, image.tags)
    return replace(builds[native[0]] if native else next(iter(builds.values())), pushed={},
                   platform_images={target.name: image for target, image in builds.items()})


def _push_platforms(result: ImageBuild, builds: dict[Platform, ImageBuild],
                    references: list[str], *, client: docker.DockerClient, push: bool,
                    started: float, on_log: Log | None) -> ImageBuild:
    """With ``push``, each platform's tags pushed and confirmed, then under each reference one
    image index of them (``result.pushed``)."""
    if push:
        with step_log(f"pushing {', '.join(references)} for "
                      f"{', '.join(t.name for t in builds)}", on_log) as log:
            tagged = {target: platform_references(references, target) for target in builds}
            for target, image in builds.items():
                for reference in tagged[target]:
                    image.pushed[reference] = push_image(client, reference, on_log=log)
            for position, reference in enumerate(references):
                manifests = {target: builds[target].pushed[tagged[target][position]]
                             for target in builds}
                result.pushed[reference] = push_index(client, reference, manifests,
                                                      on_log=log)
    result.seconds = time.monotonic() - started
    log_line = on_log or stderr_line
    for target, image in builds.items():
        log_line(f"run it ({target}): {image.run_command}")
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


def _pipeline_check(model: str, pipe: Pipeline, calls: list[tuple[Any, ...]],
                    expected: list[Any], tolerance: float,
                    timeout: float = DEFAULT_TIMEOUT) -> Check:
    """Every call over gRPC and HTTP must answer what the in-process pipeline answered, each
    within ``timeout`` seconds; then the calls and perturbed copies of them, in flight together
    (:mod:`builder.verify.concurrent`)."""

    def check(endpoint: ContainerEndpoint) -> None:
        for scheme, address in (("grpc", endpoint.grpc_url), ("http", endpoint.http_url)):
            with Client(f"{scheme}://{address}/{model}", timeout=timeout) as client:
                for call, reference in zip(calls, expected):
                    check_same(client(*call), reference, tolerance,
                               where=f"{model}{short_call(call)} over {scheme}")
        pairs = distinct_calls(pipe, calls, expected)
        concurrent_check(model, pairs, tolerance, timeout)(endpoint)

    return check
