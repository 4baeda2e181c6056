"""From a model repository (and a packed environment) to a serving image on the release's base.

:func:`build_serving_image` renders the Dockerfile for the chosen Triton release and builds it,
leaving the image untagged: verification (:mod:`builder.verify`) runs it first, and only then does
:mod:`builder.push` tag and push it (:mod:`builder.job` holds that order).

Two builds, because the engine's legacy builder sends the whole context every time:

1. the *payload* image — base, environment tarball(s), weights — is built once per content and
   found again by its cache tag (:data:`PAYLOAD_REPOSITORY`), so gigabytes are neither sent to
   nor hashed by the engine again;
2. the *serving* image starts FROM the payload and adds the code and configs: a code-only change
   rebuilds this last, small layer, every layer below it is reused.

The build is skipped when an image tagged ``image_name`` carries the same content hash (all inputs
but ``created``).
"""

from __future__ import annotations

import os
import re
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypedDict

import docker
import docker.errors
from docker.models.images import Image

from builder.base.releases import Release
from builder.cache import content_hash
from builder.engine.image_build import (
    CONTENT_HASH_LABEL,
    build_image,
    find_built,
    remove_images,
)
from builder.engine.image_config import restamp_image
from builder.engine.leftovers import Leftovers
from builder.engine.platforms import platform_option
from builder.engine.reference import ImageReference
from builder.environment.archive_check import archive_cuda_runtime
from builder.errors import TritonBuilderError
from builder.image.context import (
    ENVIRONMENT_SUFFIXES,
    ContextPlan,
    environment_directories,
    plan_context,
)
from builder.image.labels import (
    CREATED,
    OCI,
    PAYLOAD_HASH,
    STAGE,
    WEIGHTS_LABEL,
    created_timestamp,
    hashed,
    repository_signature,
    serving_labels,
)
from builder.image.os_packages import image_os_packages
from builder.image.ready_gate_model import READY_GATE_DIR, ready_gate_files
from builder.image.sbom import (
    SBOM_PATH,
    BaseImage,
    PythonRuntime,
    image_sbom,
    shipped_environments,
    shipped_stub,
)
from builder.image.serving_dockerfile import (
    RUNTIME_DIR,
    RUNTIME_SCRIPTS_CONTEXT,
    ServingOptions,
    layer_parts,
    render_serving_dockerfile,
    runtime_scripts,
    templates_source,
)
from builder.image.startup import (
    VERIFY_TIMEOUT_S,
    archive_bytes,
    health_start_period,
    verify_timeout,
)
from builder.image.weights_beside import (
    WEIGHTS_CHOICES,
    weights_beside,
    write_cache_directory,
    write_lock,
)
from builder.progress import Log, step_log
from builder.runtime.supervisor import DRAIN_S
from builder.runtime.supervisor.ready_gate import why_not_gated
from builder.runtime.supervisor.weights_lock import CACHE_DIR, WeightFile, WeightsLock

PAYLOAD_REPOSITORY = "triton-builder-cache/payload"


class PayloadLayers(TypedDict):
    """What the payload stage copies: the environment, and the weights' parts in order."""

    has_environment: bool
    weight_parts: tuple[str, ...]
    weights_cache: str
    """The node cache's directory, for an image whose weights travel beside it; else empty."""


class WeightsChoiceError(TritonBuilderError, ValueError):
    """``weights=`` is neither of :data:`~builder.image.weights_beside.WEIGHTS_CHOICES`."""


class EnvironmentMismatchError(TritonBuilderError, ValueError):
    """An environment tarball's Python is not the Python of the release's backend stub."""


@dataclass
class ServingImage:
    """A serving image: new and untagged (until verification passed), or ``built=False``: the
    image already tagged with the name, carrying the same content hash."""

    id: str
    release: Release
    content_hash: str
    labels: dict[str, str]
    built: bool
    payload_id: str | None = None
    """The cached payload below a new image: what a discarded build keeps."""
    weights_lock: WeightsLock | None = None
    """An image whose weights travel beside it: the lock it carries."""
    weight_sources: dict[WeightFile, Path] = field(default_factory=dict)
    """Each locked file's source on this machine (what verification serves, a push sends)."""
    ready_timeout_s: float = VERIFY_TIMEOUT_S
    """How long a container of it may take to be ready: longer where it carries environment
    archives, which the python backend extracts at every start (:mod:`builder.image.startup`)."""


@dataclass(frozen=True)
class ImageOptions:
    """The user's choices for :func:`builder.image.serving_image.build_serving_image`.

    ``labels`` are added to the image's own (``org.opencontainers.image.*`` and
    ``ai.triton-builder.*``); ``signature`` (the pipeline's inputs and outputs) becomes the
    ``ai.triton-builder.signature`` label (default: the models' configs summarised); ``version``
    and ``revision`` the OCI ones. ``user`` runs the server as that non-root user;
    ``server_args`` are extra ``tritonserver`` flags; ``drain_s`` how long a stopping
    container serves on after its readiness failed. ``environment`` is a packed environment
    placed beside the repository; ``environment_python`` the Python of the environments (default:
    the release's; the builder's for a bridged image).
    """

    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    signature: Mapping[str, Any] | str | None = None
    version: str | None = None
    revision: str | None = None
    user: str | None = field(default=None, metadata={"help": (
        "Run the server as this user (default: uid 1000; 'root' for root).")})
    server_args: tuple[str, ...] = ()
    drain_s: float = field(default=DRAIN_S, metadata={"help": (
        "How long a stopping container serves on after its readiness failed, in "
        "seconds.")})
    environment: str | os.PathLike | None = None
    environment_python: str | None = None
    platforms: tuple[str, ...] = ()
    """Every platform of a multi-platform build this image is one of (its label)."""
    weights: str = field(default="image", metadata={"help": (
        "Where the models' weights travel: 'image' (a layer per model, in the image) or "
        "'artifact' (beside it: an OCI artifact per model pushed to the image's repository, "
        "fetched by each container into its node's cache at start).")})
    tracing: bool = field(default=False, metadata={"help": (
        "Trace requests with OpenTelemetry: the SDK and its OTLP exporters in the "
        "environment, and the clients' traceparent forwarded to the pipeline model; spans "
        "go where OTEL_EXPORTER_OTLP_ENDPOINT says at docker run (none when unset).")})
    no_cache: bool = field(default=False, metadata={"help": (
        "Build every layer of the image again (docker build --no-cache): reuse "
        "nothing the engine holds from an earlier build, so that it cannot stand in for "
        "this one (a reproducibility check's second build).")})

    def __post_init__(self) -> None:
        if self.weights not in WEIGHTS_CHOICES:
            raise WeightsChoiceError(f"weights must be one of {', '.join(WEIGHTS_CHOICES)}, not "
                                     f"{self.weights!r}")
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels or {})))
        object.__setattr__(self, "server_args", tuple(self.server_args))


def build_serving_image(
    repository_dir: str | os.PathLike,
    *,
    image_name: str,
    release: Release,
    base: Image,
    options: ImageOptions = ImageOptions(),
    python_models: str | None = None,
    python_runtime: PythonRuntime | None = None,
    client: docker.DockerClient,
    leftovers: Leftovers,
    on_log: Log | None = None,
) -> ServingImage:
    """The serving image of ``repository_dir`` on ``base`` (the release's image), left untagged.

    ``options`` (:class:`ImageOptions`) are the user's: labels, user,
    server flags, an ``environment`` tarball placed at
    :func:`builder.image.context.environment_image_path` (tarballs inside the repository are
    found and layered on their own) and the environments' Python. ``python_models`` says how the
    python models run, in the Dockerfile's header; ``python_runtime`` says where their stub and
    interpreter came from, for the bill of materials (:mod:`builder.image.sbom`, written to
    :data:`~builder.image.sbom.SBOM_PATH`; without it the SBOM names the stub the repository
    carries, or the release's own).
    An image already tagged ``image_name`` with the same content hash is returned as it is.
    ``leftovers`` records each image the build makes as the engine makes it (the new image
    too, before it exists): the caller removes them if the build does not finish.
    """
    environment_python = options.environment_python
    serving = ServingOptions(user=options.user, server_args=options.server_args,
                             python_models=python_models, drain_s=options.drain_s,
                             tracing=options.tracing)
    environments = [Path(options.environment)] if options.environment else []
    plan = plan_context(repository_dir, environments=environments,
                        model_repository=serving.model_repository)
    lock: WeightsLock | None = None
    weight_sources: dict[WeightFile, Path] = {}
    if options.weights == "artifact":
        plan, lock, weight_sources = weights_beside(
            plan, ImageReference.parse(image_name).repository)
    archives = [entry.source for entry in plan.layer("environment")
                if entry.source is not None and entry.path.endswith(ENVIRONMENT_SUFFIXES)]
    for environment_path in [*archives, *environment_directories(Path(repository_dir))]:
        check_environment_python(environment_path, release, environment_python)
        check_environment_cuda(environment_path, release)
    start_period = health_start_period(archive_bytes(archives),
                                       lock.size if lock is not None else 0)
    ready_timeout_s = verify_timeout(archive_bytes(archives))

    layers: PayloadLayers = {"has_environment": plan.has("environment"),
                             "weight_parts": plan.weight_parts(),
                             "weights_cache": CACHE_DIR if lock is not None else ""}
    payload_hash = content_hash(  # the date too: it is every file's mtime in the layers
        render_serving_dockerfile(release, options=serving, stage="payload", **layers,
                                  start_period=start_period),
        templates_source(release), base.id, plan.digest("environment", "weights"),
        created_timestamp())
    payload_dockerfile = render_serving_dockerfile(
        release, options=serving, stage="payload", **layers, start_period=start_period,
        labels={PAYLOAD_HASH: payload_hash, STAGE: "payload"})
    image_labels = serving_labels(
        release=release, image_name=image_name, base_digest=_base_digest(base),
        environment_hash=plan.digest("environment") if plan.has("environment") else "none",
        signature=(options.signature if options.signature is not None
                   else repository_signature(repository_dir)),
        version=options.version, revision=options.revision, extra=options.labels,
        platforms=options.platforms)
    if lock is not None:
        image_labels[WEIGHTS_LABEL] = ",".join(sorted(file.digest for file in lock.unique()))
    sbom = image_sbom(
        title=image_labels[OCI + "title"], version=image_labels[OCI + "version"],
        release=release, base=BaseImage(release.image, base.id, _base_digest(base),
                                        dict(base.labels or {})),
        os_packages=image_os_packages(client, base.id),
        environments=shipped_environments(plan, environments), stub=shipped_stub(plan),
        runtime=python_runtime)
    gate = (ready_gate_files(repository_dir)
            if why_not_gated(serving.server_command(release)) is None else {})
    digest = content_hash(
        payload_hash, render_serving_dockerfile(release, options=serving, stage="serving",
                                                payload_image="payload",
                                                start_period=start_period),
        plan.digest("code"), *runtime_scripts().values(), sbom, hashed(image_labels),
        lock.to_json() if lock is not None else "", hashed(gate))
    image_labels.update({CONTENT_HASH_LABEL: digest, PAYLOAD_HASH: payload_hash,
                         CREATED: created_timestamp()})

    cached = None if options.no_cache else find_built(client, image_name, digest)
    if cached is not None:
        return ServingImage(id=cached.id, release=release, content_hash=digest,
                            labels=dict(client.images.get(cached.id).labels), built=False,
                            weights_lock=lock, weight_sources=weight_sources,
                            ready_timeout_s=ready_timeout_s)
    platform = platform_option(release.platform)
    with step_log(f"payload layers of {image_name}", on_log) as log:
        payload_id = _payload_image(client, plan, payload_dockerfile, payload_hash, log,
                                    platform, no_cache=options.no_cache,
                                    weights_cache=lock is not None)
    serving_dockerfile = render_serving_dockerfile(
        release, options=serving, stage="serving", payload_image=payload_id,
        start_period=start_period, labels=image_labels)
    with step_log(f"building {image_name}", on_log) as log, \
            tempfile.TemporaryDirectory(prefix="triton-builder-serving-") as workdir:
        context = plan.write(Path(workdir), ["code"])
        (context / "code").mkdir(exist_ok=True)
        scripts = context / RUNTIME_SCRIPTS_CONTEXT / RUNTIME_DIR.lstrip("/")
        scripts.mkdir(parents=True)
        for name, text in runtime_scripts().items():
            (scripts / name).parent.mkdir(parents=True, exist_ok=True)
            (scripts / name).write_text(text)
        sbom_file = context / "code" / SBOM_PATH.lstrip("/")
        sbom_file.parent.mkdir(parents=True, exist_ok=True)
        sbom_file.write_text(sbom)
        if lock is not None:
            write_lock(context / "code", lock)
        for name, text in gate.items():
            path = context / "code" / READY_GATE_DIR.lstrip("/") / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        (context / "Dockerfile").write_text(serving_dockerfile)
        built = build_image(client, context, [], platform=platform, on_log=log,
                            made=leftovers.images, nocache=options.no_cache)
        image_id = restamp_image(client, built.id, created=image_labels[CREATED],
                                 kept_history=len(client.api.history(base.id)),
                                 layer_names=layer_parts(payload_dockerfile, serving_dockerfile),
                                 made=leftovers.images)
        remove_images(client, [built.id])
        log(f"dated {image_labels[CREATED]} (the build's epoch): {image_id}")
    return ServingImage(id=image_id, release=release, content_hash=digest, labels=image_labels,
                        built=True, payload_id=payload_id, weights_lock=lock,
                        weight_sources=weight_sources, ready_timeout_s=ready_timeout_s)


def check_environment_python(tarball: str | os.PathLike, release: Release,
                             expected: str | None = None) -> None:
    """Refuse an environment whose Python differs from the stub's (``expected``, default: the
    release's own)."""
    found = environment_python(tarball)
    if found is not None and found != (expected or release.python_version):
        if expected and expected != release.python_version:
            raise EnvironmentMismatchError(
                f"the environment {Path(tarball).name} has Python {found}, but this image's "
                f"python models are bridged to Python {expected}: rebuild it")
        raise EnvironmentMismatchError(
            f"the environment {Path(tarball).name} has Python {found}, but {release.describe()} "
            f"runs the python backend on Python {release.python_version}: pack the environment "
            f"with Python {release.python_version}, or choose a release with Python {found}")


def check_environment_cuda(tarball: str | os.PathLike, release: Release) -> None:
    """Refuse an environment whose CUDA runtime the release's minimum driver cannot run."""
    runtime = archive_cuda_runtime(Path(tarball))
    if runtime is None or not release.gpu:
        return
    problem = release.cuda_runtime_problem(runtime.cuda)
    if problem:
        raise EnvironmentMismatchError(
            f"the environment {Path(tarball).name} carries {runtime.distribution}: {problem}. "
            f"Rebuild it for CUDA {release.cuda} (build_docker_image resolves torch for the "
            f"release), or choose a release whose CUDA is {runtime.cuda} or newer")


_PYTHON_IN_ARCHIVE = re.compile(r"(?:^|/)(?:lib/python|bin/python)(\d+\.\d+)(?:/|$)")


def environment_python(tarball: str | os.PathLike, *, members: int = 50_000) -> str | None:
    """The ``X.Y`` of ``lib/pythonX.Y`` in a packed environment (None if not seen early), or in
    an unpacked one (a directory)."""
    if Path(tarball).is_dir():
        for directory in sorted(Path(tarball).glob("lib/python3.*")):
            found = _PYTHON_IN_ARCHIVE.search(f"{directory.relative_to(tarball).as_posix()}/")
            if found:
                return found.group(1)
        return None
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


def _base_digest(image: Image) -> str:
    """The base's registry digest when it came from one, else its image ID (built here)."""
    for repo_digest in image.attrs.get("RepoDigests") or []:
        if "@" in repo_digest:
            return repo_digest.split("@", 1)[1]
    return image.id


def _payload_image(client: docker.DockerClient, plan: ContextPlan, dockerfile: str,
                   payload_hash: str, log: Log, platform: str | None = None, *,
                   no_cache: bool = False, weights_cache: bool = False) -> str:
    """The payload image for ``payload_hash``: found by its cache tag (unless ``no_cache``), or
    built and tagged.

    A tag, not a label filter: images built FROM the payload inherit its labels, so only a tag
    names the payload itself. ``docker rmi`` on :data:`PAYLOAD_REPOSITORY` tags drops the cache.
    """
    reference = payload_reference(payload_hash)
    try:
        found = None if no_cache else client.images.get(reference)
        if found is not None and (found.labels or {}).get(PAYLOAD_HASH) == payload_hash:
            log(f"payload layers reused: {reference}")
            return found.id
    except docker.errors.ImageNotFound:
        pass
    with tempfile.TemporaryDirectory(prefix="triton-builder-payload-") as workdir:
        context = plan.write(Path(workdir), ["environment", "weights"])
        if weights_cache:
            write_cache_directory(context)
        (context / "Dockerfile").write_text(dockerfile)
        built = build_image(client, context, [reference], platform=platform, on_log=log,
                            nocache=no_cache)
    return built.id


def payload_reference(payload_hash: str) -> str:
    """Where the payload (base + environment + weights) of a build is cached."""
    return f"{PAYLOAD_REPOSITORY}:{payload_hash}"
