"""The release's base image on this engine: found, pulled from its registry, or — for our CPU
base — built here.

The environment is packed against this image (its Python, its glibc), so the base comes first in
a build; a base that can be neither found nor pulled is reported with what would help.
"""

from __future__ import annotations

import docker
import docker.errors
from docker.models.images import Image

from builder.base.cpu import build_cpu_base, cpu_base_tag
from builder.base.gpu_slim import OS_IMAGE_LABEL, build_slim_base, slim_base_tag
from builder.base.releases import Release
from builder.engine.reference import ImageReference
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
        return client.images.get(release.image)
    except docker.errors.ImageNotFound:
        pass
    if not release.gpu and release.image == cpu_base_tag(release.python_version):
        built = build_cpu_base(client, python_version=release.python_version, on_log=log)
        return client.images.get(built.id)
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
