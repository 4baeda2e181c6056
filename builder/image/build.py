"""From a model repository to a verified, tagged (and pushed) serving image.

:func:`build_image_from_repository` is the image half of ``build_docker_image``: the pipeline half
writes a model repository (and packs an environment); this renders the Dockerfile for the chosen
Triton release, builds, checks the image by running it, and only then tags and pushes it.

Two builds, because the engine's legacy builder sends the whole context every time:

1. the *payload* image — base, environment tarball(s), weights — is built once per content and
   found again by its cache tag (:data:`PAYLOAD_REPOSITORY`), so gigabytes are neither sent to
   nor hashed by the engine again;
2. the *serving* image starts FROM the payload and adds the code and configs: a code-only change
   rebuilds this last, small layer, every layer below it is reused.

The build is skipped when an image tagged ``image_name`` carries the same content hash (all inputs
but ``created``). The new image stays untagged until verification passed: a failing build, a
failing verification or a failing push never leaves a tag on a broken image.
"""

from __future__ import annotations

import contextlib
import os
import re
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.images import Image

from builder.cache import content_hash
from builder.image.context import ENVIRONMENT_SUFFIXES, ContextPlan, plan_context
from builder.image.cpu_base import build_cpu_base, cpu_base_tag
from builder.image.docker_build import (
    CONTENT_HASH_LABEL,
    build_image,
    find_built,
    split_tag,
    validate_reference,
)
from builder.image.labels import (
    CREATED,
    PAYLOAD_HASH,
    STAGE,
    created_timestamp,
    hashed,
    repository_signature,
    serving_labels,
)
from builder.image.releases import Release, resolve
from builder.image.serving_dockerfile import (
    ServingOptions,
    render_serving_dockerfile,
    templates_source,
)
from builder.progress import BuildProgress, stderr_line
from builder.push.docker_push import PushResult, push_image
from builder.verify.check import Check, Verification, VerificationError, verify_image
from builder.verify.container import docker_run_command

Log = Callable[[str], None]
PAYLOAD_REPOSITORY = "triton-builder-cache/payload"


class BaseImageUnavailableError(RuntimeError):
    """The release's base image is neither on the engine nor pullable."""


class EnvironmentMismatchError(ValueError):
    """An environment tarball's Python is not the Python of the release's backend stub."""


@dataclass
class ImageBuild:
    """What :func:`build_image_from_repository` made (or found)."""

    id: str
    tags: list[str]
    built: bool
    """False when an image with the same content hash was reused."""
    release: Release
    content_hash: str
    labels: dict[str, str]
    run_command: str
    payload_id: str | None = None
    verification: Verification | None = None
    pushed: dict[str, PushResult] = field(default_factory=dict)
    seconds: float = 0.0


def build_image_from_repository(
    repository_dir: str | os.PathLike,
    *,
    image_name: str,
    tags: Iterable[str] = (),
    cuda: str | float | None = None,
    triton_version: str | None = None,
    base_image: str | None = None,
    environment: str | os.PathLike | None = None,
    labels: Mapping[str, str] | None = None,
    signature: Mapping[str, Any] | str | None = None,
    version: str | None = None,
    revision: str | None = None,
    user: str | None = None,
    server_args: Sequence[str] = (),
    verify: bool = True,
    checks: Sequence[Check] = (),
    gpus: bool | None = None,
    verify_timeout: float = 180.0,
    push: bool = False,
    client: docker.DockerClient | None = None,
    on_log: Log | None = None,
) -> ImageBuild:
    """Build the serving image of ``repository_dir`` as ``image_name`` (plus ``tags``).

    ``tags`` are full references or bare tags of ``image_name``'s repository. ``cuda``,
    ``triton_version`` and ``base_image`` choose the base (:func:`builder.image.releases.resolve`;
    ``cuda=None`` is the CPU base). ``environment`` is a packed environment tarball, placed at
    :func:`builder.image.context.environment_image_path`; tarballs inside the repository are
    found and layered on their own. ``signature`` (the pipeline's inputs and outputs) goes to the
    ``ai.triton-builder.signature`` label; without it, the models' configs are summarised.
    ``verify`` runs the image with ``checks`` (:mod:`builder.verify.check`) before any tag is set;
    ``push`` pushes every tag and confirms the digests with the registry.

    A GPU release is verified without GPUs where the engine has none (Triton's CPU fallback):
    models pinned to ``KIND_GPU`` then fail verification; pass ``verify=False`` there. An image
    tagged by a ``verify=False`` build is reused as it is by a later build of the same inputs.
    """
    started = time.monotonic()
    if client is None:
        from builder.engine import docker_client

        client = docker_client()
    references = _references(image_name, tags)
    release = resolve(cuda, triton_version, base_image)
    options = ServingOptions(user=user, server_args=tuple(server_args))
    environments = [Path(environment)] if environment else []
    plan = plan_context(repository_dir, environments=environments,
                        model_repository=options.model_repository)
    for entry in plan.layer("environment"):
        if entry.source is not None and entry.path.endswith(ENVIRONMENT_SUFFIXES):
            check_environment_python(entry.source, release)

    with _progress(f"base image {release.image}", on_log) as log:
        base = ensure_base_image(client, release, on_log=log)
    layers = {"has_environment": plan.has("environment"), "has_weights": plan.has("weights")}
    payload_hash = content_hash(
        render_serving_dockerfile(release, options=options, stage="payload", **layers),
        templates_source(release), base.id, plan.digest("environment", "weights"))
    payload_dockerfile = render_serving_dockerfile(
        release, options=options, stage="payload", **layers,
        labels={PAYLOAD_HASH: payload_hash, STAGE: "payload"})
    image_labels = serving_labels(
        release=release, image_name=references[0], base_digest=_base_digest(base),
        environment_hash=plan.digest("environment") if plan.has("environment") else "none",
        signature=signature if signature is not None else repository_signature(repository_dir),
        version=version, revision=revision, extra=labels)
    digest = content_hash(
        payload_hash, render_serving_dockerfile(release, options=options, stage="serving",
                                                payload_image="payload"),
        plan.digest("code"), hashed(image_labels))
    image_labels.update({CONTENT_HASH_LABEL: digest, PAYLOAD_HASH: payload_hash,
                         CREATED: created_timestamp()})
    run_command = docker_run_command(references[0], gpus=release.gpu)

    cached = find_built(client, references[0], digest)
    if cached is not None:
        _tag(client, cached.id, references)
        result = ImageBuild(id=cached.id, tags=references, built=False, release=release,
                            content_hash=digest, labels=dict(client.images.get(cached.id).labels),
                            run_command=run_command)
    else:
        with _progress(f"payload layers of {references[0]}", on_log) as log:
            payload_id = _payload_image(client, plan, payload_dockerfile, payload_hash, log)
        serving_dockerfile = render_serving_dockerfile(
            release, options=options, stage="serving", payload_image=payload_id,
            labels=image_labels)
        with _progress(f"building {references[0]}", on_log) as log, \
                tempfile.TemporaryDirectory(prefix="triton-builder-serving-") as workdir:
            context = plan.write(Path(workdir), ["code"])
            (context / "models").mkdir(exist_ok=True)
            (context / "Dockerfile").write_text(serving_dockerfile)
            built = build_image(client, context, [], on_log=log)
        verification = None
        if verify:
            with _progress(f"verifying {references[0]}", on_log) as log:
                try:
                    verification = verify_image(client, built.id, checks, gpus=gpus,
                                                timeout=verify_timeout, on_log=log)
                except VerificationError:
                    _remove_untagged(client, built.id, payload_id)
                    raise
        _tag(client, built.id, references)
        result = ImageBuild(id=built.id, tags=references, built=True, release=release,
                            content_hash=digest, labels=image_labels, run_command=run_command,
                            payload_id=payload_id, verification=verification)
    if push:
        with _progress(f"pushing {', '.join(references)}", on_log) as log:
            for reference in references:
                result.pushed[reference] = push_image(client, reference, on_log=log)
    result.seconds = time.monotonic() - started
    (on_log or stderr_line)(f"run it: {run_command}")
    return result


def check_environment_python(tarball: str | os.PathLike, release: Release) -> None:
    """Refuse an environment whose Python differs from the release's python backend stub."""
    found = environment_python(tarball)
    if found is not None and found != release.python_version:
        raise EnvironmentMismatchError(
            f"the environment {Path(tarball).name} has Python {found}, but {release.describe()} "
            f"runs the python backend on Python {release.python_version}: pack the environment "
            f"with Python {release.python_version}, or choose a release with Python {found}")


_PYTHON_IN_ARCHIVE = re.compile(r"(?:^|/)(?:lib/python|bin/python)(\d+\.\d+)(?:/|$)")


def environment_python(tarball: str | os.PathLike, *, members: int = 50_000) -> str | None:
    """The ``X.Y`` of ``lib/pythonX.Y`` in a packed environment (None if not seen early)."""
    try:
        with tarfile.open(tarball, "r|*") as archive:
            for count, member in enumerate(archive):
                found = _PYTHON_IN_ARCHIVE.search(member.name)
                if found:
                    return found.group(1)
                if count >= members:
                    return None
    except (tarfile.TarError, OSError, EOFError) as error:
        raise EnvironmentMismatchError(
            f"the environment {tarball} is not a readable tarball: {error}") from None
    return None


def _references(image_name: str, tags: Iterable[str]) -> list[str]:
    validate_reference(image_name)
    repository, _ = split_tag(image_name)
    references = [image_name]
    for tag in tags:
        reference = tag if ("/" in tag or ":" in tag) else f"{repository}:{tag}"
        validate_reference(reference)
        if reference not in references:
            references.append(reference)
    return references


def ensure_base_image(client: docker.DockerClient, release: Release, *,
                      on_log: Log | None = None) -> Image:
    """The release's base image on this engine: found, built (our CPU base) or pulled.

    The environment must be packed against this image (its Python, its glibc), so callers that
    pack one get the base here first.
    """
    log = on_log or (lambda line: None)
    try:
        return client.images.get(release.image)
    except docker.errors.ImageNotFound:
        pass
    if not release.gpu and release.image == cpu_base_tag(release.python_version):
        built = build_cpu_base(client, python_version=release.python_version, on_log=log)
        return client.images.get(built.id)
    repository, tag = split_tag(release.image)
    try:
        for chunk in client.api.pull(repository, tag=tag, stream=True, decode=True):
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


def _base_digest(image: Image) -> str:
    """The base's registry digest when it came from one, else its image ID (built here)."""
    for repo_digest in image.attrs.get("RepoDigests") or []:
        if "@" in repo_digest:
            return repo_digest.split("@", 1)[1]
    return image.id


def _payload_image(client: docker.DockerClient, plan: ContextPlan, dockerfile: str,
                   payload_hash: str, log: Log) -> str:
    """The payload image for ``payload_hash``: found by its cache tag, or built and tagged.

    A tag, not a label filter: images built FROM the payload inherit its labels, so only a tag
    names the payload itself. ``docker rmi`` on :data:`PAYLOAD_REPOSITORY` tags drops the cache.
    """
    reference = payload_reference(payload_hash)
    try:
        found = client.images.get(reference)
        if (found.labels or {}).get(PAYLOAD_HASH) == payload_hash:
            log(f"payload layers reused: {reference}")
            return found.id
    except docker.errors.ImageNotFound:
        pass
    with tempfile.TemporaryDirectory(prefix="triton-builder-payload-") as workdir:
        context = plan.write(Path(workdir), ["environment", "weights"])
        (context / "Dockerfile").write_text(dockerfile)
        built = build_image(client, context, [reference], on_log=log)
    return built.id


def payload_reference(payload_hash: str) -> str:
    """Where the payload (base + environment + weights) of a build is cached."""
    return f"{PAYLOAD_REPOSITORY}:{payload_hash}"


def _tag(client: docker.DockerClient, image_id: str, references: list[str]) -> None:
    """Point every reference at ``image_id``; drop the images they named before if that left
    them nameless (a rebuild loop would otherwise pile up ``<none>`` images)."""
    replaced = set()
    for reference in references:
        try:
            previous = client.images.get(reference).id
            if previous != image_id:
                replaced.add(previous)
        except docker.errors.ImageNotFound:
            pass
    image = client.images.get(image_id)
    for reference in references:
        repository, tag = split_tag(reference)
        image.tag(repository, tag)
    for previous in replaced:
        try:
            if not client.images.get(previous).tags:
                client.images.remove(previous)
        except docker.errors.APIError:
            pass  # in use by a container, or already gone: leave it to `docker image prune`


def _remove_untagged(client: docker.DockerClient, image_id: str, keep: str | None) -> None:
    """Drop a failed image and the build's intermediate images down to ``keep`` (the payload,
    a cache worth keeping) — unless something else already names the image."""
    try:
        image = client.images.get(image_id)
        if image.tags:
            return
        chain = [entry["Id"] for entry in image.history()
                 if entry.get("Id", "<missing>") != "<missing>"]
        for layer_id in chain:
            if layer_id == keep:
                break
            client.images.remove(layer_id, noprune=True)
    except docker.errors.APIError:
        pass


@contextlib.contextmanager
def _progress(title: str, on_log: Log | None) -> Iterator[Log]:
    if on_log is not None:
        yield on_log
        return
    with BuildProgress(title) as progress:
        yield progress
