"""The release's base image on this engine: found, pulled from its registry, or — for our CPU
base — built here.

The environment is packed against this image (its Python, its glibc), so the base comes first in
a build; a base that can be neither found nor pulled is reported with what would help.
"""

from __future__ import annotations

from dataclasses import replace

import docker
import docker.errors
from docker.models.images import Image

from builder.base.cpu import OS_IMAGE_LABEL, build_cpu_base, cpu_base_tag
from builder.base.gpu_slim import build_slim_base, slim_base_tag
from builder.base.releases import Release
from builder.engine.platforms import DEFAULT_PLATFORM, Platform, image_platform_name
from builder.engine.reference import ImageReference
from builder.engine.registry import RegistryError, platform_variant_digest, registry_insecure
from builder.errors import TritonBuilderError
from builder.progress import Log


class BaseImageUnavailableError(TritonBuilderError, RuntimeError):
    """The release's base image is neither on the engine nor pullable."""


def ensure_base_image(client: docker.DockerClient, release: Release, *,
                      on_log: Log | None = None) -> Image:
    """The release's base image on this engine: found, built (our CPU and slim GPU bases) or
    pulled.

    The environment must be packed against this image (its Python, its glibc), so callers that
    pack one get the base here first.
    """
    log = on_log or (lambda line: None)
    if release.slim and release.image == slim_base_tag(release.python_version):
        return _slim_base(client, release, log)
    try:
        return _of_platform(client.images.get(release.image), release)
    except docker.errors.ImageNotFound:
        pass
    if not release.gpu and release.image == cpu_base_tag(release.python_version,
                                                         release.platform):
        built = build_cpu_base(client, python_version=release.python_version,
                               platform=release.platform, on_log=log)
        return client.images.get(built.id)
    if release.platform != DEFAULT_PLATFORM and "@" not in release.image:
        raise BaseImageUnavailableError(
            f"the base image {release.image} for {release.platform} is not on this engine, "
            f"which holds one platform per tag: pin it to that platform's variant first "
            f"(builder.base.pin_platform_variant), or pass that platform's image as base_image=")
    if "@" in release.image:
        return _of_platform(_pull_by_digest(client, release.image, log), release)
    base = ImageReference.parse(release.image)
    try:
        for chunk in client.api.pull(base.repository, tag=base.tag, stream=True, decode=True):
            if "error" in chunk or "errorDetail" in chunk:
                raise docker.errors.APIError((chunk.get("errorDetail") or {}).get("message")
                                             or chunk.get("error"))
            if chunk.get("status") and "progressDetail" not in chunk:
                log(f"{chunk.get('id', '')} {chunk['status']}".strip())
        return client.images.get(release.image)
    except docker.errors.APIError as error:
        host = release.image.split("/", 1)[0]
        raise BaseImageUnavailableError(
            f"the base image {release.image} is not on this engine and cannot be pulled "
            f"({error.explanation or error}); `docker login {host}` if it needs a login, or pass "
            f"base_image= (a mirror) or cuda=None (the CPU base)") from None


def _of_platform(image: Image, release: Release) -> Image:
    """``image``, refused where it is not the release's platform: a base of another
    architecture would build an image that fails with ``exec format error`` where it runs."""
    if not release.platform.matches(image.attrs):
        raise BaseImageUnavailableError(
            f"the base image {release.image} is {image_platform_name(image.attrs)}, but this "
            f"image is built for {release.platform}: pass a base of that platform (base_image=)")
    return image


def pin_platform_variant(client: docker.DockerClient, release: Release) -> Release:
    """``release`` on its platform's image, pinned by digest (``repo@sha256:…``) where that is
    not the engine's default platform and the base is a multi-platform tag of a registry (an
    NGC release, a mirror): the engine holds one platform per tag, so the variant is pulled by
    the digest the registry's index gives it, and the Dockerfile's FROM names that digest.

    Our CPU base (built per platform) and the default platform are left as they are."""
    if release.platform == DEFAULT_PLATFORM or (
            not release.gpu and release.image == cpu_base_tag(release.python_version,
                                                              release.platform)):
        return release
    return replace(release, image=platform_image(client, release.image, release.platform))


def platform_image(client: docker.DockerClient, image: str, platform: Platform) -> str:
    """``image`` where the engine holds it for ``platform`` already (or it is pinned by digest),
    else ``repo@sha256:…`` of ``platform``'s manifest in the index the registry serves for it."""
    if "@" in image:
        return image
    try:
        if platform.matches(client.images.get(image).attrs):
            return image
    except docker.errors.ImageNotFound:
        pass
    reference = ImageReference.parse(image)
    try:
        digest = platform_variant_digest(
            image, platform, insecure=registry_insecure(client, reference.registry))
    except RegistryError as error:
        raise BaseImageUnavailableError(
            f"cannot find the {platform} image of {image}: {error}") from None
    return f"{reference.repository}@{digest}"


def _pull_by_digest(client: docker.DockerClient, pinned: str, log: Log) -> Image:
    """``repo@sha256:…`` pulled (no tag of the engine moves), or found."""
    try:
        return client.images.get(pinned)
    except docker.errors.ImageNotFound:
        pass
    repository, digest = pinned.split("@", 1)
    try:
        for chunk in client.api.pull(repository, tag=digest, stream=True, decode=True):
            if "error" in chunk or "errorDetail" in chunk:
                raise docker.errors.APIError((chunk.get("errorDetail") or {}).get("message")
                                             or chunk.get("error"))
            if chunk.get("status") and "progressDetail" not in chunk:
                log(f"{chunk.get('id', '')} {chunk['status']}".strip())
        return client.images.get(pinned)
    except docker.errors.APIError as error:
        raise BaseImageUnavailableError(
            f"the base image {pinned} cannot be pulled ({error.explanation or error}); "
            f"`docker login {repository.split('/', 1)[0]}` if it needs a login") from None


def _slim_base(client: docker.DockerClient, release: Release, log: Log) -> Image:
    """The slim GPU base, by content rather than by tag (its onnxruntime backend is the one a
    build's checks run, so a new backend makes a new base), on the OS image the tagged one was
    built from where there is one (its label), else the default."""
    try:
        os_image = (client.images.get(release.image).labels or {}).get(OS_IMAGE_LABEL)
    except docker.errors.ImageNotFound:
        os_image = None
    built = build_slim_base(client, release.python_version, os_image=os_image, on_log=log)
    return client.images.get(built.id)
