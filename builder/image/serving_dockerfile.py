"""The serving Dockerfile: a model repository on the Triton base that the releases table picks.

One parent template (``dockerfiles/serving.Dockerfile.j2``) fixes the layer order; the GPU and
CPU children only say what differs (a header with the driver a GPU host needs, the variables the
NVIDIA container runtime reads). Everything user-controlled — base image, user name, server
arguments, the model repository path — is checked here *and* filtered in the template, so a
hostile value is refused with a readable message before jinja2's last line of defence.

The build context the templates expect (written by :mod:`builder.image.context`)::

    environment/<absolute path>   environment tarballs, mirrored from / (COPY environment/ /)
    weights/<part>/models/<part>/ one model's weights, a layer per model, merged into the
                                  model repository
    runtime/opt/triton-builder/   the health check, the supervisor (the first process, heals
                                  dead stubs) and its package (builder/runtime/)
    code/models/<model>/...       configs and code, merged into the model repository last,
    code/opt/triton-builder/...   with the bill of materials (builder/image/sbom.py)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from builder.base.releases import Release
from builder.engine.dockerfile import DockerfileError, render, template_source
from builder.image.sbom import SBOM_PATH
from builder.image.startup import START_PERIOD_S
from builder.image.weights_beside import CACHE_CONTEXT
from builder.runtime.supervisor import DRAIN_S, locked_command
from builder.runtime.tracing import TRACE_HEADERS

PARENT_TEMPLATE = "serving.Dockerfile.j2"
DEFAULT_MODEL_REPOSITORY = "/models"
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
HEALING_METRICS_PORT = 8003
"""Where the supervisor serves ``triton_builder_stub_restarts_total`` (Prometheus text)."""
RUNTIME_DIR = "/opt/triton-builder"
HEALTH_SCRIPT = f"{RUNTIME_DIR}/health.py"
SUPERVISOR_SCRIPT = f"{RUNTIME_DIR}/supervisor.py"
RUNTIME_SOURCES = Path(__file__).parents[1] / "runtime"
RUNTIME_SCRIPTS = ("drain.py", "health.py", "warm_up.py")
"""The modules of :mod:`builder.runtime` the container itself runs (standard library only),
beside the supervisor's package (:data:`SUPERVISOR_PACKAGE`)."""
SUPERVISOR_PACKAGE = "supervisor"
"""The package of :mod:`builder.runtime.supervisor`, copied whole; its ``__main__`` is
:data:`SUPERVISOR_SCRIPT`, which imports it (a directory wins over a module of its name)."""
RUNTIME_SCRIPTS_CONTEXT = "runtime"
"""The context directory copied to ``/`` that holds :data:`RUNTIME_SCRIPTS` at
:data:`RUNTIME_DIR` under it."""

TRACE_HEADER_PATTERN = f"^({'|'.join(TRACE_HEADERS)})$"
"""The headers a traced image's Triton forwards into request parameters: W3C Trace Context's,
which the pipeline model reads as its spans' parent (:mod:`builder.runtime.tracing`)."""
PYTHON_BACKEND_SHM = {"shm-default-byte-size": 4 * 1024 * 1024,
                      "shm-growth-byte-size": 1024 * 1024}
"""The python backend's shared memory per stub, set in every image's command.

Each python model instance is a stub process with its own region in ``/dev/shm``. python_backend
r22.12 and r23.05 reserve 64 MB per stub by default (``src/python_be.cc``) — all of Docker's
default ``/dev/shm`` — so under a plain ``docker run IMAGE`` the second python model or instance
fails to load; r24.10 and later reserve 1 MB. 4 MiB is the smallest r22.12 and r23.05 accept
("shm-default-byte-size can't be smaller than 4 MiBs"; r24.10–r25.11: 1 MiB), and a region grows
by multiples of the growth size when a request needs more (1 MiB: r24.10's own default;
r22.12's 64 MB would not fit either). Both options exist under the same names in r22.12,
r23.05, r24.10, r24.12 and r25.11."""

MAX_DRAIN_S = 300
"""A drain longer than this is a stuck stop, not a drain."""
DEFAULT_USER = "1000:1000"
"""Who every image runs as unless ``user=`` says otherwise: uid and gid 1000, NGC's
``triton-server`` (and our CPU base's). Numeric, so that Kubernetes can verify
``runAsNonRoot`` and a base without that user in ``/etc/passwd`` still runs it; no ``RUN`` step
makes it (a ``useradd`` layer dates its files with the build's clock: two builds, two IDs)."""
ROOT = "root"
"""``user=ROOT`` runs the server as root, as images did before they were locked."""

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
    """Run as this user (created with ``uid`` if the base lacks it); None: :data:`DEFAULT_USER`;
    :data:`ROOT`: root."""
    uid: int = 1000
    server_args: tuple[str, ...] = field(default_factory=tuple)
    """Extra ``tritonserver`` flags, e.g. ``--log-verbose=1``."""
    python_models: str | None = None
    """How the python models run when not on the release's own stub (the bridge), for the
    header: the stub and environment themselves are files of the model repository."""
    drain_s: float = DRAIN_S
    tracing: bool = False
    """Whether the image traces requests: Triton forwards the clients' W3C trace headers into
    request parameters (:data:`TRACE_HEADER_PATTERN`), where the release can."""
    """How long a stopping container serves on after its readiness failed
    (:mod:`builder.runtime.drain`): the image's ``TRITON_BUILDER_DRAIN_S``, which ``docker run
    -e`` may change."""

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
        if isinstance(self.drain_s, bool) or not isinstance(self.drain_s, (int, float)) or not (
                0 <= self.drain_s <= MAX_DRAIN_S):
            raise DockerfileError(f"drain_s must be seconds from 0 to {MAX_DRAIN_S:g}: "
                                  f"{self.drain_s!r}")
        for arg in self.server_args:
            if not isinstance(arg, str) or not _SERVER_ARG.fullmatch(arg):
                raise DockerfileError(f"not a tritonserver flag (--name[=value]): {arg!r}")
        try:
            locked_command(list(self.server_args), "k" * 32)
        except ValueError as error:
            raise DockerfileError(str(error)) from None

    @property
    def run_as(self) -> str:
        """The ``USER`` of the image."""
        return self.user or DEFAULT_USER

    @property
    def creates_user(self) -> bool:
        """A named non-root user, made by a ``RUN`` step where the base lacks it."""
        return self.user not in (None, ROOT)

    @property
    def http_port(self) -> int:
        """The port the health check asks: 8000 unless ``--http-port=`` moves it."""
        for arg in self.server_args:
            name, _, value = arg.partition("=")
            if name == "--http-port" and value.isdigit():
                return int(value)
        return HTTP_PORT

    def server_command(self, release: Release) -> list[str]:
        """``tritonserver`` with explicit model control and every model loaded at start (what
        lets the supervisor reload one model) where ``release`` can lock the repository API
        (:attr:`Release.restricts_apis`) and ``server_args`` choose no other mode,
        :data:`PYTHON_BACKEND_SHM`, and for a traced image the trace headers forwarded (each
        unless ``server_args`` sets it). Explicit model
        control asked for on a release that cannot lock it is refused: any client could load
        code."""
        chosen = next((arg for arg in self.server_args
                       if arg.startswith("--model-control-mode")), None)
        if chosen is not None and chosen.endswith("explicit") and not release.restricts_apis:
            raise DockerfileError(
                f"{chosen} on Triton {release.triton_version} ({release.release}) opens the "
                f"repository API to every client, which could load its own code: that Triton "
                f"cannot restrict it over HTTP (Triton 2.40, release 23.11, and later can). Drop "
                f"the flag (a dead stub then heals by a restart of the server), or choose a "
                f"newer release")
        control = [] if chosen is not None or not release.restricts_apis \
            else ["--model-control-mode=explicit", "--load-model=*"]
        shm = [f"--backend-config=python,{key}={value}"
               for key, value in PYTHON_BACKEND_SHM.items()
               if not any(arg.startswith(f"--backend-config=python,{key}=")
                          for arg in self.server_args)]
        forward = [f"--{protocol}-header-forward-pattern={TRACE_HEADER_PATTERN}"
                   for protocol in ("http", "grpc")
                   if self.tracing and release.forwards_headers and not any(
                       arg.startswith(f"--{protocol}-header-forward-pattern")
                       for arg in self.server_args)]
        return ["tritonserver", f"--model-repository={self.model_repository}", *control, *shm,
                *forward, *self.server_args]

    def command(self, release: Release) -> list[str]:
        """The container's command: the supervisor, which runs the server as its child, and
        locks its administrative APIs behind a key where ``release`` can
        (``--lock-admin-apis``; ``$TRITON_BUILDER_ADMIN_KEY`` sets the key)."""
        lock = ["--lock-admin-apis"] if release.restricts_apis else []
        return ["python3", SUPERVISOR_SCRIPT, *lock, *self.server_command(release)]


def child_template(release: Release) -> str:
    if release.slim:
        return "serving-gpu-slim.Dockerfile.j2"
    return "serving-gpu.Dockerfile.j2" if release.gpu else "serving-cpu.Dockerfile.j2"


def templates_source(release: Release) -> str:
    """The text of both templates a render uses (part of the image's content hash)."""
    return template_source(PARENT_TEMPLATE) + template_source(child_template(release))


def healthcheck_command(http_port: int = HTTP_PORT, *, live: bool = False) -> list[str]:
    """The container's health check (:mod:`builder.runtime.health`): ready, and no dead python
    backend stub; ``live`` for a liveness probe. ``python3`` is in every Triton base (the python
    backend needs it); curl is not."""
    return ["python3", HEALTH_SCRIPT, f"--http-port={http_port}", *(["--live"] if live else [])]


def runtime_scripts() -> dict[str, str]:
    """The health check and the supervisor that every serving image carries: its path under
    :data:`RUNTIME_DIR` → text. The supervisor is its package's modules, and its
    ``__main__`` as ``supervisor.py``."""
    scripts = {name: (RUNTIME_SOURCES / name).read_text() for name in RUNTIME_SCRIPTS}
    package = RUNTIME_SOURCES / SUPERVISOR_PACKAGE
    for module in sorted(package.glob("*.py")):
        scripts[f"{SUPERVISOR_PACKAGE}/{module.name}"] = module.read_text()
    scripts[Path(SUPERVISOR_SCRIPT).name] = (package / "__main__.py").read_text()
    return scripts


def render_serving_dockerfile(
    release: Release,
    *,
    options: ServingOptions | None = None,
    stage: Stage = "full",
    has_environment: bool = True,
    weight_parts: Sequence[str] = (),
    weights_cache: str = "",
    payload_image: str | None = None,
    labels: Mapping[str, str] | None = None,
    start_period: int = START_PERIOD_S,
) -> str:
    """Render the Dockerfile for ``release``; ``payload_image`` is the FROM of stage "serving".

    ``weight_parts`` are the weights' layers in order (:meth:`ContextPlan.weight_parts`);
    ``weights_cache`` the node cache's directory of an image whose weights travel beside it;
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
        driver_floor=release.min_driver or "-",
        driver_floor_cuda=release.driver_cuda or "-",
        compute_capability=release.min_compute_capability or "-",
        user=options.user,
        create_user=options.creates_user,
        run_as=options.run_as,
        uid=options.uid,
        model_repository=options.model_repository,
        has_environment=has_environment,
        weight_parts=list(weight_parts),
        weights_cache=weights_cache,
        weights_cache_context=CACHE_CONTEXT,
        healthcheck=healthcheck_command(options.http_port),
        drain_s=f"{options.drain_s:g}",
        start_period=start_period,
        runtime_dir=RUNTIME_DIR,
        runtime_scripts_context=RUNTIME_SCRIPTS_CONTEXT,
        healing_metrics_port=HEALING_METRICS_PORT,
        sbom_path=SBOM_PATH,
        command=options.command(release),
        python_models=options.python_models,
        labels=dict(labels or {}),
    )


_LAYER_STEP = re.compile(r"^(COPY|RUN|ADD)\s+(\S+)", re.MULTILINE)
_COPIED_PARTS = {"environment/": "environment", RUNTIME_SCRIPTS_CONTEXT + "/": "runtime",
                 "code/": "code", CACHE_CONTEXT + "/": "weights cache"}


def layer_parts(*dockerfiles: str) -> list[str]:
    """What each step of ``dockerfiles`` that makes a layer holds, in order: ``environment``,
    ``weights of <model>``, ``runtime``, ``code`` (a ``RUN``: ``user``), read from the steps
    themselves, so the names cannot drift from the template. They become the comments of the
    image's history (:func:`builder.engine.image_config.restamp_image`), which ``inspect
    --layers`` prints beside each layer's size."""
    parts = []
    for instruction, source in _LAYER_STEP.findall("\n".join(dockerfiles)):
        if instruction == "RUN":
            parts.append("user")
        elif source.startswith("weights/"):
            parts.append(f"weights of {source.removeprefix('weights/').rstrip('/')}")
        else:
            parts.append(_COPIED_PARTS.get(source, source.rstrip("/")))
    return parts
