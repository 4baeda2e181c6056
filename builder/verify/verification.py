"""Checking a built image the way a user will run it, before any tag points at it.

The image is started as users start it (the plainest ``docker run``: the three ports, Docker's own
``/dev/shm``, ``--gpus=all`` when the engine has GPUs), we wait until Triton says every model is
ready, then run checks against it: by default every model of the repository must be READY; callers
add :class:`InferenceCheck`\\ s (one request over gRPC *and* HTTP, compared with expected outputs)
or any callable taking a :class:`ContainerEndpoint` — the pipeline's signature and in-process
results drive those. On failure the container's log is part of the error; the container is always
removed, whatever the instant of an interrupt (:mod:`builder.engine.container_lifecycle`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import numpy as np

from builder.engine.ownership import BuildOwner
from builder.errors import TritonBuilderError
from builder.image.serving_dockerfile import DEFAULT_MODEL_REPOSITORY
from builder.progress import Log
from builder.runtime.supervisor import ADMIN_KEY_HEADER, ADMIN_KEY_VARIABLE, GATE_MODEL
from builder.runtime.supervisor.weights_lock import WeightFile
from builder.verify.container import (
    DEFAULT_SHM_SIZE,
    ContainerEndpoint,
    ContainerError,
    ServingContainer,
    gpus_available,
)
from builder.verify.equality import TOLERANCE
from builder.verify.placement import (
    Evidence,
    GpuPlacement,
    GpuPlacementError,
    check_ran_on_gpus,
    cpu_config_mounts,
    gpu_models,
    read_placement_evidence,
)
from builder.verify.weights_source import WeightsSource

LOG_TAIL_LINES = 80
VERIFICATION_LABEL = "ai.triton-builder.verification"


class NothingToVerifyError(TritonBuilderError, ValueError):
    """Verification was asked for without a call to send (bad input, refused before a build)."""


class VerificationError(TritonBuilderError, RuntimeError):
    """The image did not start, did not become ready, or answered wrongly; ``logs`` says why."""

    def __init__(self, message: str, logs: str = "") -> None:
        tail = "\n".join(logs.splitlines()[-LOG_TAIL_LINES:])
        super().__init__(f"{message}\n--- container log (last {LOG_TAIL_LINES} lines) ---\n{tail}"
                         if logs else message)
        self.logs = logs


Check = Callable[[ContainerEndpoint], None]
"""Raises (any exception) when the served answer is wrong."""


@dataclass(frozen=True)
class InferenceCheck:
    """One request to ``model`` over each protocol, compared with ``expected`` outputs."""

    model: str
    inputs: Mapping[str, np.ndarray]
    expected: Mapping[str, np.ndarray]
    rtol: float = 1e-5
    atol: float = 1e-6
    protocols: tuple[str, ...] = ("grpc", "http")

    def __call__(self, endpoint: ContainerEndpoint) -> None:
        for protocol in self.protocols:
            outputs = infer(endpoint, self.model, self.inputs, list(self.expected), protocol)
            for name, expected in self.expected.items():
                _compare(f"{self.model}.{name} over {protocol}", outputs[name],
                         np.asarray(expected), self.rtol, self.atol)


@dataclass
class Verification:
    """What a successful verification saw."""

    image: str
    gpus: bool
    seconds: float
    models: list[str] = field(default_factory=list)
    gpu_placement: GpuPlacement | None = None
    """For an image with ``KIND_GPU`` models: whether their placement was exercised, and how."""
    platform: str | None = None
    """Where the image was another platform's than the engine's: which (run under emulation)."""


def verify_image(
    client: docker.DockerClient,
    image: str,
    checks: Iterable[Check] = (),
    *,
    gpus: bool | None = None,
    shm_size: str | None = DEFAULT_SHM_SIZE,
    timeout: float = 180.0,
    on_log: Log | None = None,
    repository_dir: str | os.PathLike[str] | None = None,
    image_repository: str = DEFAULT_MODEL_REPOSITORY,
    owner: BuildOwner | None = None,
    platform: str | None = None,
    weights: Mapping[WeightFile, Path] | None = None,
) -> Verification:
    """Run ``image``, wait for readiness, run the default model check and ``checks``.

    ``repository_dir`` (the repository the image serves, at ``image_repository`` inside it)
    makes the check GPU-aware (:mod:`builder.verify.placement`): with GPUs each ``KIND_GPU``
    model must have run on one; without, those models are verified on the CPU and the result
    says their placement was not exercised. ``platform`` runs an image of another platform than
    the engine's (under emulation: give it a longer ``timeout``). ``weights`` (an image whose
    weights travel beside it: each locked file's source here) are served to the container by a
    registry of the build's own (:mod:`builder.verify.weights_source`), which its supervisor
    fetches them from into the node's cache, as from the user's registry after a push.

    The container is labelled with ``owner`` (the build's; default: a new one of this process)
    and named after it, so that the build's cleanup and ``triton-builder doctor`` find it.
    """
    started = time.monotonic()
    owner = owner or BuildOwner.here()
    on_gpu = gpu_models(repository_dir) if repository_dir is not None else []
    gpus = gpus_available(client) if gpus is None else gpus
    with tempfile.TemporaryDirectory(prefix="triton-builder-cpu-configs-") as workdir, \
            (WeightsSource(client, weights) if weights else contextlib.nullcontext()) as source:
        volumes = (cpu_config_mounts(repository_dir, on_gpu, Path(workdir), image_repository)
                   if repository_dir is not None and on_gpu and not gpus else {})
        admin_key = secrets.token_urlsafe(24)
        environment = {ADMIN_KEY_VARIABLE: admin_key}
        if source is not None:
            volumes.update(source.volumes)
            environment.update(source.environment)
        container = ServingContainer(client, image, gpus=gpus, shm_size=shm_size,
                                     labels={VERIFICATION_LABEL: "1"}, volumes=volumes or None,
                                     environment=environment, owner=owner,
                                     platform=platform)
        try:
            endpoint = container.start(timeout)
            models = _check_models_ready(endpoint, admin_key)
            baseline = (read_placement_evidence(endpoint, on_gpu) if on_gpu and gpus
                        else None)  # the models' warm-ups, counted before any check
            _check_repository_api_closed(endpoint)
            for check in checks:
                try:
                    check(endpoint)
                except Exception as error:  # noqa: BLE001 - any failed check fails verification
                    raise VerificationError(
                        f"{image} answered, but a check failed: {type(error).__name__}: {error}"
                    ) from error
            placement = _placement(endpoint, on_gpu, gpus, baseline)
            if placement is not None and on_log:
                on_log(placement.detail)
            return Verification(image=image, gpus=container.gpus,
                                seconds=time.monotonic() - started, models=models,
                                gpu_placement=placement, platform=platform)
        except (VerificationError, ContainerError, GpuPlacementError) as error:
            failure = VerificationError(str(error).split("\n--- container log")[0],
                                        container.logs())
            if on_log:
                on_log(str(failure))
            raise failure from error.__cause__
        finally:
            container.remove()


def _placement(endpoint: ContainerEndpoint, on_gpu: list[str], gpus: bool,
               baseline: Evidence | None) -> GpuPlacement | None:
    if not on_gpu:
        return None
    if not gpus:
        return GpuPlacement(tuple(on_gpu), False, (
            f"GPU placement was not exercised: this engine has no NVIDIA runtime, so "
            f"{', '.join(on_gpu)} (KIND_GPU) were verified on the CPU with KIND_CPU configs"))
    verdict = check_ran_on_gpus(endpoint, on_gpu, since=baseline)
    return GpuPlacement(tuple(on_gpu), True, f"GPU placement verified: {verdict.detail}",
                        evidence=verdict.evidence)


def infer(
    endpoint: ContainerEndpoint,
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    protocol: str = "grpc",
) -> dict[str, np.ndarray]:
    """One inference over ``protocol`` ("grpc" or "http"); BYTES tensors for object arrays."""
    if protocol == "grpc":
        import tritonclient.grpc as client_module

        url = endpoint.grpc_url
    elif protocol == "http":
        import tritonclient.http as client_module

        url = endpoint.http_url
    else:
        raise ValueError(f"protocol must be 'grpc' or 'http', not {protocol!r}")
    from tritonclient.utils import np_to_triton_dtype

    tensors = []
    for name, value in inputs.items():
        array = np.asarray(value)
        tensor = client_module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    requested = [client_module.InferRequestedOutput(name) for name in outputs]
    triton = client_module.InferenceServerClient(url)
    try:
        result = triton.infer(model, tensors, outputs=requested)
    finally:
        triton.close()
    return {name: result.as_numpy(name) for name in outputs}


def _check_models_ready(endpoint: ContainerEndpoint, admin_key: str) -> list[str]:
    """Every model of the repository index must be READY (readiness alone allows none).

    The index belongs to the repository API, which images lock: the container runs with an
    operator's key of the verification's own (``TRITON_BUILDER_ADMIN_KEY``), as an operator's
    tooling would, and the index lists each model that failed with Triton's reason. The image's
    ready gate (:mod:`builder.runtime.supervisor.ready_gate`) is not one of its models."""
    request = urllib.request.Request(f"http://{endpoint.http_url}/v2/repository/index",
                                     data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json",
                                              ADMIN_KEY_HEADER: admin_key})
    with urllib.request.urlopen(request, timeout=10) as response:
        index = json.load(response)
    index = [m for m in index if m.get("name") != GATE_MODEL]  # unloaded once ready opened
    if not index:
        raise VerificationError("Triton is ready but serves no model")
    broken = [f"{m.get('name')}: {m.get('state')} {m.get('reason', '')}".strip()
              for m in index if m.get("state") != "READY"]
    if broken:
        raise VerificationError("models not ready: " + "; ".join(broken))
    return sorted(m["name"] for m in index)


LOCK_PROBE = "triton-builder-lock-probe"
"""A model name no repository holds: what a load without the key asks for."""


def _check_repository_api_closed(endpoint: ContainerEndpoint) -> None:
    """A load without the key must be refused, over HTTP and gRPC: 403 / ``UNAVAILABLE``
    ("This protocol is restricted") where the image locks the API, "not allowed" where the
    release cannot lock it and the image keeps explicit model control off. Anything else —
    a load tried, even one that fails — means any client could load its own code."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    request = urllib.request.Request(
        f"http://{endpoint.http_url}/v2/repository/models/{LOCK_PROBE}/load", data=b"{}",
        method="POST", headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=10).close()
        answers = ["HTTP 200"]
    except urllib.error.HTTPError as error:
        answers = [f"HTTP {error.code} {error.read().decode(errors='replace')}"]
    with grpcclient.InferenceServerClient(endpoint.grpc_url) as client:
        try:
            client.load_model(LOCK_PROBE)
            answers.append("gRPC OK")
        except InferenceServerException as error:
            answers.append(f"gRPC {error.status()} {error.message()}")
    open_to = [answer for answer in answers
               if not (answer.startswith("HTTP 403") or "This protocol is restricted" in answer
                       or "not allowed" in answer)]
    if open_to:
        raise VerificationError(
            f"the repository API answers a client without the key: {'; '.join(open_to)[:300]} "
            f"(any client could load its own code)")


def _compare(what: str, actual: np.ndarray, expected: np.ndarray, rtol: float,
             atol: float) -> None:
    if actual is None:
        raise AssertionError(f"{what}: no output returned")
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {actual.shape}, expected {expected.shape}")
    if expected.dtype.kind in "fc":
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=what)


@dataclass(frozen=True)
class VerifyOptions:
    """``enabled=False`` tags the image unverified (a later build of the same inputs reuses it).

    ``calls`` are what a pipeline build sends (default: the pipeline's examples), each answer
    compared with ``pipe(*call)`` within ``tolerance``. ``gpus`` runs the container on GPUs
    (default: where the release is a GPU one and the engine has an NVIDIA runtime);
    ``timeout_s`` is how long to wait for readiness (default: 180 s plus the time the image's
    environment archives take to extract, :mod:`builder.image.startup`).
    """

    enabled: bool = field(default=True, metadata={"help": (
        "Run the image and compare its answers with the pipeline's in process.")})
    calls: Sequence[tuple[Any, ...]] | None = None
    tolerance: float = TOLERANCE
    gpus: bool | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.calls is not None:
            object.__setattr__(self, "calls", tuple(tuple(call) for call in self.calls))
