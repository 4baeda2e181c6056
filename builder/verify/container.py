"""A serving container, started the way users start one: the plainest ``docker run`` — the
three Triton ports, ``--gpus=all`` where the engine has GPUs, and Docker's own 64 MB
``/dev/shm`` (the images size the python backend's regions to fit it, 4 MiB per stub:
:data:`builder.image.serving_dockerfile.PYTHON_BACKEND_SHM`).

Verification, ``triton-builder serve`` and the tests all need the same thing — run an image,
wait until Triton says it is ready, know where it listens, read its log when it fails — so it
lives here once. Creating, starting and removing it go through
:mod:`builder.engine.container_lifecycle`, so that an interrupt at any instant leaves no container
that nothing knows of.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass

import docker
import docker.errors
import docker.types

from builder.engine.container_lifecycle import create_container, remove_container
from builder.engine.ownership import BuildOwner
from builder.errors import TritonBuilderError
from builder.image.serving_dockerfile import GRPC_PORT, HTTP_PORT, METRICS_PORT
from builder.runtime.supervisor.weights_lock import CACHE_DIR, CACHE_VOLUME
from builder.tritonserver.host_process import triton_ready

DEFAULT_SHM_SIZE: str | None = None
"""Docker's default ``/dev/shm`` (64 MB)."""
TRITON_PORTS = (HTTP_PORT, GRPC_PORT, METRICS_PORT)


class ContainerError(TritonBuilderError, RuntimeError):
    """The container did not start or did not become ready; ``logs`` holds what it printed."""

    def __init__(self, message: str, logs: str = "") -> None:
        super().__init__(message)
        self.logs = logs


@dataclass(frozen=True)
class ContainerEndpoint:
    """A running container's published ports, as ``host:port``."""

    http_url: str
    grpc_url: str
    metrics_url: str
    container_id: str


class ServingContainer:
    """Run ``image``; ``with ServingContainer(client, image) as endpoint: ...`` removes it after.

    ``host_ports`` maps (http, grpc, metrics) to fixed host ports; by default each is a free
    port on 127.0.0.1, so parallel runs never collide. ``healthcheck`` overrides the image's
    (the Docker SDK's dict: ``test``, ``interval`` in ns, ``retries``, ...); ``environment``
    sets the container's variables (e.g. the supervisor's ``TRITON_BUILDER_HEAL_*``);
    ``read_only`` and ``tmpfs`` (path → mount options) harden it as ``docker run --read-only
    --tmpfs /tmp`` does; ``command`` replaces the image's; ``platform`` (``linux/arm64``) is the
    image's platform where it is not the engine's own (``docker run --platform``: it then runs
    under emulation). ``owner`` (a build's) labels the container with it and names it after the
    build, so that the build's cleanup and ``triton-builder doctor`` find it; without, it is the
    caller's to keep (``triton-builder serve --detach``).
    """

    def __init__(self, client: docker.DockerClient, image: str, *, gpus: bool | None = None,  # noqa: PLR0913 - options as keywords (issue 68: options objects)
                 shm_size: str | None = DEFAULT_SHM_SIZE,
                 host_ports: tuple[int, int, int] | None = None,
                 bind: str = "127.0.0.1", name: str | None = None,
                 labels: dict[str, str] | None = None,
                 healthcheck: dict | None = None,
                 volumes: dict[str, dict[str, str]] | None = None,
                 environment: dict[str, str] | None = None, read_only: bool = False,
                 tmpfs: dict[str, str] | None = None,
                 command: list[str] | None = None, platform: str | None = None,
                 owner: BuildOwner | None = None) -> None:
        self.client = client
        self.image = image
        self.gpus = gpus_available(client) if gpus is None else gpus
        self.owner = owner
        if name is None and owner is not None:
            name = owner.container_name("verify")
        self._options = dict(
            shm_size=shm_size, name=name, labels=labels or {}, healthcheck=healthcheck,
            volumes=volumes, environment=environment, read_only=read_only, tmpfs=tmpfs,
            command=command, **({"platform": platform} if platform else {}),
            device_requests=([docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
                             if self.gpus else None),
            ports={f"{port}/tcp": (bind, host_ports[i] if host_ports else None)
                   for i, port in enumerate(TRITON_PORTS)},
        )
        self.container: docker.models.containers.Container | None = None

    def start(self, timeout: float = 180.0) -> ContainerEndpoint:
        """Create and start the container, then wait until ``/v2/health/ready`` answers 200."""
        try:
            container = create_container(self.client, self.image, owner=self.owner,
                                         start=True, **self._options)
        except docker.errors.APIError as error:
            raise ContainerError(f"could not start {self.image}: {error.explanation or error}",
                                 self.logs()) from None
        self.container = container
        return self._wait_ready(container, timeout)

    def logs(self) -> str:
        if self.container is None:
            return ""
        try:
            return self.container.logs().decode(errors="replace")
        except docker.errors.APIError:
            return ""

    def remove(self) -> None:
        if self.container is not None:
            remove_container(self.client, self.container.id)
            self.container = None

    def __enter__(self) -> ContainerEndpoint:
        try:
            return self.start()
        except BaseException:
            self.remove()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.remove()

    def _wait_ready(self, container: docker.models.containers.Container,
                    timeout: float) -> ContainerEndpoint:
        deadline = time.monotonic() + timeout
        endpoint = None
        while time.monotonic() < deadline:
            container.reload()
            if container.status in ("exited", "dead"):
                code = container.attrs.get("State", {}).get("ExitCode")
                raise ContainerError(f"the container exited with code {code} while starting",
                                     self.logs())
            endpoint = endpoint or self._endpoint(container)
            if endpoint is not None and triton_ready(endpoint.http_url):
                return endpoint
            time.sleep(0.2)
        raise ContainerError(f"Triton was not ready after {timeout:.0f}s", self.logs())

    def _endpoint(self, container: docker.models.containers.Container) -> ContainerEndpoint | None:
        ports = container.ports or {}

        def url(port: int) -> str | None:
            bound = ports.get(f"{port}/tcp")
            if not bound:
                return None
            host = bound[0]["HostIp"] if bound[0]["HostIp"] not in ("", "0.0.0.0") else (
                "127.0.0.1")
            return f"{host}:{bound[0]['HostPort']}"

        http, grpc, metrics = (url(port) for port in TRITON_PORTS)
        if not (http and grpc):
            return None
        return ContainerEndpoint(http_url=http, grpc_url=grpc, metrics_url=metrics or "",
                        container_id=container.id)


def gpus_available(client: docker.DockerClient) -> bool:
    """Whether ``--gpus=all`` can work: the engine knows the NVIDIA runtime, or the host has
    ``nvidia-smi`` listing a GPU (the hook ``--gpus`` needs comes with the same toolkit)."""
    try:
        runtimes = client.info().get("Runtimes") or {}
    except docker.errors.APIError:
        runtimes = {}
    if "nvidia" in runtimes:
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def docker_run_command(image: str, *, gpus: bool = True,
                       shm_size: str | None = DEFAULT_SHM_SIZE,
                       platform: str | None = None, weights_cache: bool = False) -> str:
    """The command users copy to run the image (GPU form unless ``gpus=False``; ``platform``
    where it is not the engine's own; ``weights_cache``: the node's weights cache mounted, for
    an image whose weights travel beside it)."""
    parts = ["docker", "run", "--rm", *([f"--platform={platform}"] if platform else [])]
    if weights_cache:
        parts += ["-v", f"{CACHE_VOLUME}:{CACHE_DIR}"]
    if gpus:
        parts.append("--gpus=all")
    if shm_size:
        parts.append(f"--shm-size={shm_size}")
    for port in TRITON_PORTS:
        parts += ["-p", f"{port}:{port}"]
    parts.append(image)
    return shlex.join(parts)
