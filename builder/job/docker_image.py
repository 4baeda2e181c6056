"""The two entry points: a pipeline's image (:func:`build_docker_image`) and a repository's
(:func:`build_image_from_repository`), each as its ordered steps."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

import docker

from builder.base import BaseOptions, ensure_base_image, resolve
from builder.cache import build_scratch
from builder.engine import Leftovers, docker_client, require_platforms, tag_references
from builder.image import ImageOptions
from builder.interrupts import deferred_interrupts, interrupts_stop_once
from builder.job.build_options import BuildOptions, StageOptions, build_options
from builder.job.build_plan import plan_build
from builder.job.platform_build import ImageBuild, build_platform, build_verified
from builder.job.publish import publish, tag_builds
from builder.pipeline import Pipeline
from builder.progress import Log, stderr_line, step_log
from builder.verify import Check, VerifyOptions


@interrupts_stop_once()
def build_docker_image(
    pipe: Pipeline,
    image_name: str,
    options: BuildOptions | Sequence[StageOptions] | None = None,
    *,
    tags: Iterable[str] = (),
    push: bool = False,
    client: docker.DockerClient | None = None,
    on_log: Log | None = None,
    **keywords: Any,
) -> ImageBuild:
    """Build, verify and tag (and ``push``) the Triton serving image of ``pipe``.

    ``keywords`` are the fields of the stages' options, each documented there once
    (:mod:`builder.job.build_options`: ``cuda=``, ``slim=`` … of
    :class:`~builder.base.BaseOptions`; ``requirements=`` … of
    :class:`~builder.environment.EnvironmentOptions`; ``latency_budget_ms=``,
    ``max_request_bytes=``, ``export_tolerance=`` … of
    :class:`~builder.repository.RepositoryOptions`; ``user=``, ``no_cache=`` … of
    :class:`~builder.image.ImageOptions`; ``verify=``, ``tolerance=`` … of
    :class:`~builder.verify.VerifyOptions`; ``bridge=`` … of
    :class:`~builder.bridge.BridgeOptions`; ``platforms=``, ``no_verify_platforms=``);
    ``options`` may hold a :class:`BuildOptions` or some stages' objects instead.

    The steps: decide everything (:func:`~builder.job.build_plan.plan_build`: the in-process
    answers, the releases, the Python plans — bad input is refused here, before the engine is
    touched); build and verify each platform's image (:func:`build_platform`: base,
    repository, environment, image, its answers against the in-process ones, another platform
    than the engine's under emulation); tag them all (:func:`tag_builds`); push
    (:func:`publish`). Interrupted (Ctrl-C, or SIGTERM, which stops it the same way while it
    runs unless the caller handles SIGTERM), it removes what it made on the engine and sets no
    tag.
    """
    started = time.monotonic()
    chosen = build_options(options, **keywords)
    mismatch = chosen.tuning.machine_warning() if chosen.tuning else None
    if mismatch:
        (on_log or stderr_line)(mismatch)
    plan = plan_build(pipe, image_name, tags, chosen)
    client = client or docker_client()
    support = require_platforms(client, plan.targets)
    for target in plan.unverified:
        (on_log or stderr_line)(
            f"warning: the {target} image will not be verified (--no-verify-platform "
            f"{target}): it is tagged and pushed without having answered once")
    builds: dict[Any, ImageBuild] = {}
    leftovers = Leftovers()
    with build_scratch() as workdir:  # kept until a push sent weights
        try:
            for target in plan.targets:
                builds[target] = build_platform(pipe, plan, target, chosen, client=client,
                                                workdir=workdir, support=support[target],
                                                leftovers=leftovers, on_log=on_log)
            native = [t for t in plan.targets if support[t].native]
            with deferred_interrupts():
                result = tag_builds(client, builds, plan.references, native)
        except BaseException:
            leftovers.remove(client)
            raise
        return publish(result, builds, plan.references, client=client, push=push,
                       started=started, on_log=on_log)


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
        built = build_verified(repository_dir, references[0], release, base_image,
                               client=client, options=image, verifying=verify, checks=checks,
                               leftovers=leftovers, on_log=on_log)
        with deferred_interrupts():
            tag_builds(client, {release.platform: built}, references, [])
    except BaseException:
        leftovers.remove(client)
        raise
    return publish(built, {release.platform: built}, references, client=client, push=push,
                   started=started, on_log=on_log)
