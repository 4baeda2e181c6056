"""What every orchestrator needs to know about a serving image, read from the image itself.

Swarm stacks and Kubernetes manifests describe the same container: Triton's three ports, the
health signals (``/v2/health/ready`` for readiness; :mod:`builder.runtime.health` for a dead
python backend stub), the shared memory the stub needs, and whether the image wants GPUs (its
``ai.triton-builder.cuda`` label), and who it runs as (its ``USER``: not root, so that both
can run it with a read-only root file system and no capabilities). One description, two
renderings.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import docker
import docker.errors
from docker.models.images import Image

from builder.errors import TritonBuilderError
from builder.image.labels import PREFIX, SIGNATURE
from builder.image.serving_dockerfile import (
    DEFAULT_USER,
    GRPC_PORT,
    HEALTH_SCRIPT,
    HTTP_PORT,
    METRICS_PORT,
    SUPERVISOR_SCRIPT,
    healthcheck_command,
)
from builder.image.startup import START_PERIOD_S
from builder.runtime.supervisor import DRAIN_S, FINISH_S
from builder.runtime.supervisor import METRICS_PORT as SUPERVISOR_PORT
from builder.runtime.supervisor.weights_lock import CACHE_DIR

READY_PATH = "/v2/health/ready"
LIVE_PATH = "/v2/health/live"
METRICS_PATH = "/metrics"
_SIZE = re.compile(r"(\d+)([kmgKMG]?)(i?[bB]?)?")


class DeployError(TritonBuilderError, ValueError):
    """A deployment cannot be described: bad option, or an image that is not a serving image."""


class DeployRuntimeError(TritonBuilderError, RuntimeError):
    """Deploying failed: the engine refused the stack, or it did not converge in time."""


@dataclass(frozen=True)
class DeployableImage:
    """A serving image as orchestrators see it."""

    reference: str
    gpu: bool
    """The image was built on an NGC (CUDA) release: ask for GPUs."""
    http_port: int = HTTP_PORT
    grpc_port: int = GRPC_PORT
    metrics_port: int = METRICS_PORT
    start_period_s: int = START_PERIOD_S
    """The image's own health check start period: longer where it carries environment archives
    to extract at each start (:mod:`builder.image.startup`)."""
    user: str = DEFAULT_USER
    """The image's ``USER`` (``uid[:gid]`` or a name), never root."""
    drain_s: float = DRAIN_S
    """How long a stopping container serves on after its readiness failed (the image's
    ``TRITON_BUILDER_DRAIN_S``)."""
    supervisor_port: int = SUPERVISOR_PORT
    """The supervisor's readiness (503 at once when the container starts to stop) and metrics."""
    weights_beside: bool = False
    """Its weights travel beside it (its ``VOLUME`` is the node's weights cache): deployments
    give it a cache volume, so each digest is fetched once per node."""
    pipeline_model: str = "pipeline"
    """The Triton model the pipeline is served as (its signature label names it): what a
    client calls, and whose queue says how loaded a replica is."""

    def __post_init__(self) -> None:
        if self.user.split(":", 1)[0] in ("", "0", "root"):
            raise DeployError(
                f"{self.reference} runs as root: the manifests run it as a non-root user on a "
                f"read-only root file system; rebuild it with the default user (user=None)")

    @property
    def uid_gid(self) -> tuple[int, int | None] | None:
        """The numeric uid and gid of :attr:`user`, where it is given as numbers."""
        uid, _, gid = self.user.partition(":")
        if not uid.isdigit() or (gid and not gid.isdigit()):
            return None
        return int(uid), int(gid) if gid else None

    @property
    def stop_seconds(self) -> int:
        """The longest a stop takes: the drain, then the requests in flight (at most
        :data:`FINISH_S`), and a margin for the process to end. Grace periods cover it."""
        return math.ceil(self.drain_s + FINISH_S + 5)

    @property
    def drain_command(self) -> list[str]:
        """Starts the drain and returns when the container closes: a ``preStop`` hook."""
        return ["python3", SUPERVISOR_SCRIPT, "--drain"]

    @property
    def fetch_weights_command(self) -> list[str]:
        """Puts the weights that travel beside the image in its cache, then exits (0 when they
        are in place, 78 naming the operator and digest when not): an init container."""
        return ["python3", SUPERVISOR_SCRIPT, "--fetch-weights"]

    @property
    def health_command(self) -> list[str]:
        """Ready, and no dead stub: Docker's HEALTHCHECK, a Swarm health check."""
        return healthcheck_command(self.http_port)

    @property
    def liveness_command(self) -> list[str]:
        """Alive (not "ready": a server still loading is not restarted), and no dead stub."""
        return healthcheck_command(self.http_port, live=True)


def deployable_image(reference: str, *, gpu: bool | None = None,
                  client: docker.DockerClient | None = None) -> DeployableImage:
    """Describe ``reference``; ``gpu`` from its labels when the engine has it, else as given
    (default: CPU). Refuses an image that lacks our health check script when it can look."""
    from builder.engine.reference import ImageReference

    ImageReference.parse(reference)
    labels: dict[str, str] | None = None
    start_period_s = START_PERIOD_S
    user = DEFAULT_USER
    drain_s = DRAIN_S
    weights_beside = False
    if client is not None:
        try:
            image = client.images.get(reference)
        except docker.errors.ImageNotFound:
            image = None
        if image is not None:
            labels = image.labels or {}
            health = (image.attrs.get("Config") or {}).get("Healthcheck") or {}
            test = health.get("Test") or []
            start_period_s = max(START_PERIOD_S, (health.get("StartPeriod") or 0) // 10**9)
            user = (image.attrs.get("Config") or {}).get("User") or "root"
            drain_s = _drain_of(image.attrs.get("Config") or {})
            weights_beside = carries_weights_cache(image)
            if HEALTH_SCRIPT not in test:
                raise DeployError(
                    f"{reference} has no triton-builder health check ({HEALTH_SCRIPT}): "
                    "deploy images built by triton-builder (rebuild older ones)")
    if gpu is None:
        gpu = labels is not None and labels.get(PREFIX + "cuda", "cpu") != "cpu"
    return DeployableImage(reference=reference, gpu=gpu, start_period_s=start_period_s,
                           user=user, drain_s=drain_s, weights_beside=weights_beside,
                           pipeline_model=_pipeline_model(labels or {}))


def _pipeline_model(labels: dict[str, str]) -> str:
    """The first pipeline model the image's signature label names, else the default name."""
    try:
        pipelines = json.loads(labels[SIGNATURE]).get("pipelines") or {}
    except (KeyError, ValueError, AttributeError):
        pipelines = {}
    return next(iter(pipelines), DeployableImage.pipeline_model)


def carries_weights_cache(image: Image) -> bool:
    """Whether ``image``'s weights travel beside it: its ``VOLUME`` is the node's weights
    cache (:mod:`builder.image.weights_beside`)."""
    return CACHE_DIR in ((image.attrs.get("Config") or {}).get("Volumes") or {})


def _drain_of(config: dict) -> float:
    """The image's ``TRITON_BUILDER_DRAIN_S`` (images built before drains existed: the
    default, which their grace periods then cover too)."""
    for entry in config.get("Env") or []:
        name, _, value = entry.partition("=")
        if name == "TRITON_BUILDER_DRAIN_S":
            try:
                return float(value)
            except ValueError:
                break
    return DRAIN_S


def size_bytes(size: str) -> int:
    """``"1g"``, ``"512m"``, ``"2Gi"`` → bytes (powers of 1024, as ``docker run --shm-size``)."""
    found = _SIZE.fullmatch(str(size).strip())
    if not found:
        raise DeployError(f"not a size like 1g or 512m: {size!r}")
    number, unit = int(found.group(1)), found.group(2).lower()
    value = number * {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[unit]
    if value <= 0:
        raise DeployError(f"size must be positive: {size!r}")
    return value
