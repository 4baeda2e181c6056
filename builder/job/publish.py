"""Tagging the verified images and pushing them: one platform's image, or one per platform and
an OCI image index of them.

Tags are set only once every platform's image is verified, with interrupts held back, so they
all land or none does; a push confirms each digest with the registry.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import docker

from builder.engine import ImageReference, Platform, platform_references, registry_insecure
from builder.job.platform_build import ImageBuild
from builder.progress import Log, peak_memory, stderr_line, step_log
from builder.push import PushResult, push_image, push_index, push_lock_weights, tag_image


def tag_builds(client: docker.DockerClient, builds: dict[Platform, ImageBuild],
               references: Sequence[str], native: Sequence[Platform]) -> ImageBuild:
    """One platform's image tagged with every reference; several platforms' each tagged
    ``TAG-<architecture>`` (the engine holds one platform per tag), the engine's own platform's
    also under ``references`` themselves.

    Returns the image (of several: the engine's own platform's, else the first, with
    ``platform_images`` every platform's build, each with its own tags)."""
    references = list(references)
    if len(builds) == 1:
        (image,) = builds.values()
        tag_image(client, image.id, references)
        image.tags = references
        return image
    for target, image in builds.items():
        image.tags = (platform_references(references, target)
                      + (references if target in native[:1] else []))
        tag_image(client, image.id, image.tags)
    return replace(builds[native[0]] if native else next(iter(builds.values())), pushed={},
                   platform_images={target.name: image for target, image in builds.items()})


def publish(result: ImageBuild, builds: dict[Platform, ImageBuild], references: Sequence[str],
            *, client: docker.DockerClient, push: bool, started: float,
            on_log: Log | None) -> ImageBuild:
    """With ``push``: every reference pushed with its digest confirmed — of several
    platforms, each platform's tags, then under each reference one image index of them
    (``result.pushed``). Then the ``docker run`` of each image."""
    log_line = on_log or stderr_line
    if len(builds) == 1:
        if push:
            with step_log(f"pushing {', '.join(references)}", on_log) as log:
                for reference in references:
                    result.pushed[reference] = _push_one(client, result, reference,
                                                         next(iter(builds)), log)
        _finish(result, started, log_line)
        log_line(f"run it: {result.run_command}")
        return result
    if push:
        with step_log(f"pushing {', '.join(references)} for "
                      f"{', '.join(t.name for t in builds)}", on_log) as log:
            tagged = {target: platform_references(list(references), target)
                      for target in builds}
            for target, image in builds.items():
                for reference in tagged[target]:
                    image.pushed[reference] = push_image(client, reference, on_log=log)
            for position, reference in enumerate(references):
                manifests = {target: builds[target].pushed[tagged[target][position]]
                             for target in builds}
                result.pushed[reference] = push_index(client, reference, manifests,
                                                      on_log=log)
    _finish(result, started, log_line)
    for target, image in builds.items():
        log_line(f"run it ({target}): {image.run_command}")
    return result


def _push_one(client: docker.DockerClient, image: ImageBuild, reference: str,
              target: Platform, log: Log) -> PushResult:
    """``reference`` pushed; an image whose weights travel beside it: its models' artifacts
    first (to the reference's repository), then one index of the image and them under the
    tag, so that the tag names the weights the image's lock needs."""
    if image.weights_lock is None:
        return push_image(client, reference, on_log=log)
    ref = ImageReference.parse(reference)
    artifacts = push_lock_weights(ref.repository, image.weights_lock, image.weight_sources,
                                  insecure=registry_insecure(client, ref.registry), on_log=log)
    pushed = push_image(client, reference, on_log=log)
    return push_index(client, reference, {target: pushed}, artifacts=artifacts, on_log=log)


def _finish(result: ImageBuild, started: float, log_line: Log) -> None:
    """How long the build took and the most memory it held, on ``result`` and in the log."""
    result.seconds = time.monotonic() - started
    result.peak_memory_bytes = peak_memory()
    log_line(f"built in {result.seconds:.1f}s; peak memory {result.peak_memory_bytes / 1e9:.2f} "
             f"GB (the build process's RSS)")
