"""The serving Dockerfile: a model repository on the Triton base that the releases table picks.

One parent template (``dockerfiles/serving.Dockerfile.j2``) fixes the layer order; the GPU and
CPU children only say what differs (a header with the driver a GPU host needs, the variables the
NVIDIA container runtime reads). Everything user-controlled — base image, user name, server
arguments, the model repository path — is checked here *and* filtered in the template, so a
hostile value is refused with a readable message before jinja2's last line of defence.

The build context the templates expect (written by :mod:`builder.image.context`)::

    environment/<absolute path>   environment tarballs, mirrored from / (COPY environment/ /)
    weights/<model>/...           model weights, merged into the model repository
    health.py                     the health check (builder/runtime/health.py)
    models/<model>/...            configs and code, merged into the model repository last
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from builder.base.releases import Release
from builder.engine.dockerfile import DockerfileError, render, template_source
from builder.image.startup import START_PERIOD_S

PARENT_TEMPLATE = "serving.Dockerfile.j2"
DEFAULT_MODEL_REPOSITORY = "/models"
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
HEALTH_SCRIPT = "/opt/triton-builder/health.py"
HEALTH_RUNTIME = Path(__file__).parents[1] / "runtime" / "health.py"
HEALTH_SCRIPT_CONTEXT = "health.py"
"""Where the build context holds :mod:`builder.runtime.health` (copied to :data:`HEALTH_SCRIPT`)."""

Stage = Literal["full", "payload", "serving"]

# useradd's default NAME_REGEX: what a portable user name may be.
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_PATH = re.compile(r"/[A-Za-z0-9_./-]*")
_SERVER_ARG = re.compile(r"--[a-z][a-z0-9-]*(=[^\n\r]*)?")


@dataclass(frozen=True)
class ServingOptions:
    """How the container runs: where the repository lives, as whom, with which server flags."""

    model_repository: str = DEFAULT_MODEL_REPOSITORY
    user: str | None = None
    """Run as this non-root user (created with ``uid`` if the base lacks it)."""
    uid: int = 1000
    server_args: tuple[str, ...] = field(default_factory=tuple)
    """Extra ``tritonserver`` flags, e.g. ``--log-verbose=1``."""
    python_models: str | None = None
    """How the python models run when not on the release's own stub (the bridge), for the
    header: the stub and environment themselves are files of the model repository."""

    def __post_init__(self) -> None:
        if not _PATH.fullmatch(self.model_repository) or ".." in self.model_repository.split("/"):
            raise DockerfileError(
                f"model_repository must be an absolute path of plain characters: "
                f"{self.model_repository!r}")
        if self.user is not None and not _USER.fullmatch(self.user):
            raise DockerfileError(
                f"not a portable user name (lowercase letters, digits, '_' and '-', 32 at "
                f"most): {self.user!r}")
        if not isinstance(self.uid, int) or isinstance(self.uid, bool) or not (
                0 < self.uid < 2**31):
            raise DockerfileError(f"uid must be a positive integer: {self.uid!r}")
        for arg in self.server_args:
            if not isinstance(arg, str) or not _SERVER_ARG.fullmatch(arg):
                raise DockerfileError(f"not a tritonserver flag (--name[=value]): {arg!r}")

    @property
    def http_port(self) -> int:
        """The port the health check asks: 8000 unless ``--http-port=`` moves it."""
        for arg in self.server_args:
            name, _, value = arg.partition("=")
            if name == "--http-port" and value.isdigit():
                return int(value)
        return HTTP_PORT

    @property
    def command(self) -> list[str]:
        return ["tritonserver", f"--model-repository={self.model_repository}",
                *self.server_args]


def child_template(release: Release) -> str:
    return "serving-gpu.Dockerfile.j2" if release.gpu else "serving-cpu.Dockerfile.j2"


def templates_source(release: Release) -> str:
    """The text of both templates a render uses (part of the image's content hash)."""
    return template_source(PARENT_TEMPLATE) + template_source(child_template(release))


def healthcheck_command(http_port: int = HTTP_PORT, *, live: bool = False) -> list[str]:
    """The container's health check (:mod:`builder.runtime.health`): ready, and no dead python
    backend stub; ``live`` for a liveness probe. ``python3`` is in every Triton base (the python
    backend needs it); curl is not."""
    return ["python3", HEALTH_SCRIPT, f"--http-port={http_port}", *(["--live"] if live else [])]


def health_script_source() -> str:
    """The text of the health check script that every serving image carries."""
    return HEALTH_RUNTIME.read_text()


def render_serving_dockerfile(
    release: Release,
    *,
    options: ServingOptions | None = None,
    stage: Stage = "full",
    has_environment: bool = True,
    has_weights: bool = True,
    payload_image: str | None = None,
    labels: Mapping[str, str] | None = None,
    start_period: int = START_PERIOD_S,
) -> str:
    """Render the Dockerfile for ``release``; ``payload_image`` is the FROM of stage "serving".

    ``labels`` become one ``LABEL`` instruction at the end of the stage rendered;
    ``start_period`` is the health check's (:func:`builder.image.startup.health_start_period`)."""
    options = options or ServingOptions()
    if stage not in ("full", "payload", "serving"):
        raise DockerfileError(f"stage must be 'full', 'payload' or 'serving', not {stage!r}")
    if stage == "serving" and not payload_image:
        raise DockerfileError("the serving stage needs payload_image (the image it starts from)")
    return render(
        child_template(release),
        stage=stage,
        base_image=release.image,
        payload_image=payload_image or "",
        release=release.release,
        triton_version=release.triton_version,
        cuda=release.cuda or "cpu",
        python_version=release.python_version,
        ubuntu=release.ubuntu or "-",
        min_driver=release.safe_driver or "-",
        compute_capability=release.min_compute_capability or "-",
        user=options.user,
        uid=options.uid,
        model_repository=options.model_repository,
        has_environment=has_environment,
        has_weights=has_weights,
        healthcheck=healthcheck_command(options.http_port),
        start_period=start_period,
        health_script=HEALTH_SCRIPT,
        health_script_context=HEALTH_SCRIPT_CONTEXT,
        command=options.command,
        python_models=options.python_models,
        labels=dict(labels or {}),
    )
