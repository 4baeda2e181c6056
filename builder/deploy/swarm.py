"""Docker Swarm: a serving image as a stack of N replicas that heal and update without downtime.

The stack is a compose file (the format ``docker stack deploy`` reads), written here as data and
deployed with the Docker CLI — stacks are a CLI feature; the SDK has services but no stacks:

* ``replicas``, a ``restart_policy``, and a ``healthcheck`` — the image's own
  (:mod:`builder.runtime.health`: ready, and no dead python backend stub), so Swarm replaces a
  replica whose stub died instead of routing requests to it forever;
* ``update_config`` / ``rollback_config`` with ``order: start-first``: a new replica is started
  and healthy before an old one stops, one at a time, rolled back if the new one fails;
* ``/dev/shm`` as a tmpfs mount of ``shm_size`` (Swarm ignores compose's ``shm_size``), for the
  python backend's shared memory;
* a stop grace period that covers the image's drain (:mod:`builder.runtime.drain`): on SIGTERM
  a replica turns unhealthy at once, serves on while balancers drop it, answers the requests it
  holds, and refuses the rest with ``UNAVAILABLE``;
* locked down as far as a stack can say: a read-only root file system with ``/tmp`` a tmpfs,
  every capability dropped; the image's own unprivileged user;
* the three Triton ports, published through the routing mesh (``ingress``) by default; ``host``
  mode publishes each replica on its own host port (a random one when no port is given), for
  hosts without IPVS or a load balancer of your own;
* GPU images reserve GPUs as the generic resource ``NVIDIA-GPU`` (the nodes must advertise it:
  ``node-generic-resources`` in ``daemon.json``).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import docker
import yaml

from builder.deploy.serving import DeployableImage, DeployError, DeployRuntimeError, size_bytes
from builder.host_packages import ensure_program
from builder.runtime.supervisor.weights_lock import CACHE_DIR, CACHE_VOLUME

PublishMode = Literal["ingress", "host"]
SERVICE = "triton"
STACK = "triton"
"""The stack's name where none is given (``deploy swarm --name``)."""


@dataclass(frozen=True)
class SwarmOptions:
    """How the stack runs; defaults suit a real cluster (routing mesh, 15 s health checks)."""

    replicas: int = field(default=2, metadata={"help": "Replicas of the server."})
    shm_size: str = field(default="1g", metadata={
        "help": "/dev/shm of each replica (the python backend's)."})
    publish: PublishMode = field(default="ingress", metadata={
        "help": "'ingress' (routing mesh) or 'host' (each replica on its own host ports)."})
    ports: tuple[int | None, int | None, int | None] = (8000, 8001, 8002)
    """Published (http, grpc, metrics); None in host mode: a random host port per replica."""
    health_interval_s: int = field(default=15, metadata={
        "help": "Seconds between health checks."})
    health_timeout_s: int = 5
    health_retries: int = field(default=3, metadata={
        "help": "Failed checks before a replica is unhealthy."})
    start_period_s: int = 120
    """At least this; an image whose own start period is longer (environment archives to extract:
    :mod:`builder.image.startup`) keeps its own."""
    update_delay_s: int = field(default=5, metadata={
        "help": "Seconds between one replica's update and the next (a rolling update)."})
    """Between one replica's update (its successor healthy) and the next: the time to see the
    new version serve before another old replica goes (``docker service update
    --update-delay``)."""
    gpus_per_replica: int = 1
    stop_grace_period_s: int | None = None
    """How long Swarm waits after SIGTERM before SIGKILL; default: the image's whole stop (its
    drain, then the requests in flight: :attr:`DeployableImage.stop_seconds`), and never less."""
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.replicas, int) or self.replicas < 1:
            raise DeployError(f"replicas must be a positive integer, not {self.replicas!r}")
        if self.publish not in ("ingress", "host"):
            raise DeployError(f"publish must be 'ingress' or 'host', not {self.publish!r}")
        if self.publish == "ingress" and None in self.ports:
            raise DeployError("the routing mesh (ingress) needs a published port for each of "
                              "http, grpc and metrics")
        if self.publish == "host" and self.replicas > 1 and any(self.ports):
            raise DeployError("host mode with fixed ports runs one replica per node: leave the "
                              "ports unset (random per replica) or use the routing mesh")
        for value in (self.health_interval_s, self.health_timeout_s, self.health_retries):
            if not isinstance(value, int) or value < 1:
                raise DeployError(f"health check settings must be positive integers: {value!r}")
        if not isinstance(self.update_delay_s, int) or self.update_delay_s < 0:
            raise DeployError(f"the update delay must be a whole number of seconds, 0 or more, "
                              f"not {self.update_delay_s!r}")
        size_bytes(self.shm_size)


def stack_document(image: DeployableImage,
                   options: SwarmOptions = SwarmOptions()) -> dict[str, Any]:
    """The compose document of the stack (``version: "3.8"``), as data."""
    ports = []
    for target, published in zip((image.http_port, image.grpc_port, image.metrics_port),
                                 options.ports):
        port: dict[str, Any] = {"target": target, "protocol": "tcp", "mode": options.publish}
        if published is not None:
            port["published"] = published
        ports.append(port)
    deploy: dict[str, Any] = {
        "replicas": options.replicas,
        "restart_policy": {"condition": "any", "delay": "5s", "window": "30s"},
        "update_config": {"parallelism": 1, "order": "start-first",
                          "failure_action": "rollback", "monitor": "30s",
                          "delay": f"{options.update_delay_s}s"},
        "rollback_config": {"parallelism": 1, "order": "start-first"},
        "labels": dict(options.labels),
    }
    if image.gpu:
        deploy["resources"] = {"reservations": {"generic_resources": [
            {"discrete_resource_spec": {"kind": "NVIDIA-GPU",
                                        "value": options.gpus_per_replica}}]}}
    service = {
        "image": image.reference,
        "ports": ports,
        "volumes": [{"type": "tmpfs", "target": "/dev/shm",
                     "tmpfs": {"size": size_bytes(options.shm_size)}},
                    {"type": "tmpfs", "target": "/tmp"}],
        "read_only": True,
        "cap_drop": ["ALL"],
        "healthcheck": {
            "test": ["CMD", *image.health_command],
            "interval": f"{options.health_interval_s}s",
            "timeout": f"{options.health_timeout_s}s",
            "retries": options.health_retries,
            "start_period": f"{max(options.start_period_s, image.start_period_s)}s",
        },
        "stop_grace_period": f"{_grace(image, options)}s",
        "deploy": deploy,
    }
    document: dict[str, Any] = {"version": "3.8", "services": {SERVICE: service}}
    if image.weights_beside:  # a local volume: one cache per node, shared by its replicas
        service["volumes"] = [*service["volumes"],  # type: ignore[misc]
                              {"type": "volume", "source": CACHE_VOLUME, "target": CACHE_DIR}]
        document["volumes"] = {CACHE_VOLUME: {}}
    return document


def _grace(image: DeployableImage, options: SwarmOptions) -> int:
    if options.stop_grace_period_s is None:
        return image.stop_seconds
    if options.stop_grace_period_s < image.stop_seconds:
        raise DeployError(
            f"stop_grace_period_s={options.stop_grace_period_s} is shorter than the stop of "
            f"{image.reference} ({image.stop_seconds}s: it drains for {image.drain_s:g}s, then "
            f"answers the requests in flight): Swarm would kill it mid-drain")
    return options.stop_grace_period_s


def write_stack(document: dict[str, Any], path: str | os.PathLike) -> Path:
    path = Path(path)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def deploy_stack(stack_file: str | os.PathLike, name: str) -> None:
    """``docker stack deploy``: creates the stack, or updates it (a rolling update)."""
    _docker("stack", "deploy", "--compose-file", str(stack_file), "--prune", name)


def remove_stack(name: str, timeout: float = 120.0) -> None:
    """``docker stack rm``, repeated until the stack's networks are gone too.

    The CLI removes the services, then the networks; a network stays "in use by task" until the
    services' containers have stopped (Triton may take its exit timeout to finish requests in
    flight), and the CLI does not wait for them. A later attempt finds only the networks left.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            _docker("stack", "rm", name)
            return
        except DeployRuntimeError as error:
            if "in use by task" not in str(error) or time.monotonic() > deadline:
                raise
        time.sleep(1.0)


def check_swarm(client: docker.DockerClient) -> None:
    """Refuse early, with the command to run, when this engine is not a swarm manager."""
    swarm = client.info().get("Swarm") or {}
    if swarm.get("LocalNodeState") != "active" or not swarm.get("ControlAvailable"):
        raise DeployRuntimeError(
            "this Docker engine is not a swarm manager: run `docker swarm init` (or deploy from "
            "a manager node)")


@dataclass(frozen=True)
class Replica:
    """One running task of the service: its container, health and published host ports."""

    task_id: str
    container_id: str
    image: str
    health: str
    ports: dict[int, int]
    """container port → host port (host mode)."""


def replicas(client: docker.DockerClient, name: str) -> list[Replica]:
    """The running tasks of stack ``name`` on this node, with their containers' health."""
    found = []
    for container in client.containers.list(  # a replaced task's container may go meanwhile
            filters={"label": f"com.docker.swarm.service.name={name}_{SERVICE}"},
            ignore_removed=True):
        state = container.attrs.get("State") or {}
        ports = {}
        for key, bindings in ((container.attrs.get("NetworkSettings") or {}).get("Ports")
                              or {}).items():
            if bindings:
                ports[int(key.split("/")[0])] = int(bindings[0]["HostPort"])
        found.append(Replica(
            task_id=container.labels.get("com.docker.swarm.task.id", ""),
            container_id=container.id,
            image=((container.attrs.get("Config") or {}).get("Image") or "").split("@")[0],
            health=(state.get("Health") or {}).get("Status", "none"),
            ports=ports))
    return found


def wait_converged(client: docker.DockerClient, name: str, count: int, *, image: str | None = None,
                   timeout: float = 300.0) -> list[Replica]:
    """Wait until ``count`` replicas (of ``image`` when given) are healthy and nothing else runs."""
    deadline = time.monotonic() + timeout
    while True:
        running = replicas(client, name)
        healthy = [r for r in running if r.health == "healthy"
                   and (image is None or r.image == image)]
        if len(healthy) == count == len(running):
            return healthy
        if time.monotonic() > deadline:
            states = ", ".join(f"{r.container_id[:12]} {r.image} {r.health}" for r in running)
            raise DeployRuntimeError(
                f"stack {name}: {len(healthy)} of {count} replicas healthy after {timeout:.0f}s "
                f"({states or 'none running'}); see `docker service ps {name}_{SERVICE}`")
        time.sleep(0.5)


def deploy_swarm(image: DeployableImage, name: str, options: SwarmOptions = SwarmOptions(), *,
                 client: docker.DockerClient, stack_file: str | os.PathLike | None = None,
                 wait: float | None = 300.0) -> Path | None:
    """Write the stack file (to ``stack_file``, else a temporary one) and deploy it; with
    ``wait``, return once every replica is healthy. Returns the stack file written, if kept."""
    check_swarm(client)
    document = stack_document(image, options)
    if stack_file is not None:
        deploy_stack(write_stack(document, stack_file), name)
    else:
        with tempfile.TemporaryDirectory(prefix="triton-builder-stack-") as workdir:
            deploy_stack(write_stack(document, Path(workdir) / "stack.yml"), name)
    if wait:
        wait_converged(client, name, options.replicas, image=image.reference, timeout=wait)
    return Path(stack_file) if stack_file is not None else None


def _docker(*args: str) -> str:
    program = ensure_program("docker", "docker.io")
    result = subprocess.run([program, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise DeployRuntimeError(f"docker {' '.join(args)} failed: "
                                 f"{(result.stderr or result.stdout).strip()[-2000:]}")
    return result.stdout
