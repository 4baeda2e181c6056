"""Checking a built image the way a user will run it, before any tag points at it.

The image is started as users start it (``--shm-size=1g``, the three ports, ``--gpus=all`` when
the engine has GPUs), we wait until Triton says every model is ready, then run checks against
it: by default every model of the repository must be READY; callers add
:class:`InferenceCheck`\\ s (one request over gRPC *and* HTTP, compared with expected outputs) or
any callable taking an :class:`Endpoint` — the pipeline's signature and in-process results drive
those. On failure the container's log is part of the error; the container is always removed.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import docker
import docker.errors
import docker.types
import numpy as np

from builder.serving import GRPC_PORT, HTTP_PORT, METRICS_PORT

DEFAULT_SHM_SIZE = "1g"
LOG_TAIL_LINES = 80


class VerificationError(RuntimeError):
    """The image did not start, did not become ready, or answered wrongly; ``logs`` says why."""

    def __init__(self, message: str, logs: str = "") -> None:
        tail = "\n".join(logs.splitlines()[-LOG_TAIL_LINES:])
        super().__init__(f"{message}\n--- container log (last {LOG_TAIL_LINES} lines) ---\n{tail}"
                         if logs else message)
        self.logs = logs


@dataclass(frozen=True)
class Endpoint:
    """A running container's published ports, as ``host:port``."""

    http_url: str
    grpc_url: str
    metrics_url: str
    container_id: str


Check = Callable[[Endpoint], None]
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

    def __call__(self, endpoint: Endpoint) -> None:
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


def verify_image(
    client: docker.DockerClient,
    image: str,
    checks: Iterable[Check] = (),
    *,
    gpus: bool | None = None,
    shm_size: str = DEFAULT_SHM_SIZE,
    timeout: float = 180.0,
    on_log: Callable[[str], None] | None = None,
) -> Verification:
    """Run ``image``, wait for readiness, run the default model check and ``checks``."""
    started = time.monotonic()
    use_gpus = gpus_available(client) if gpus is None else gpus
    device_requests = ([docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
                       if use_gpus else None)
    try:
        container = client.containers.create(
            image, shm_size=shm_size, device_requests=device_requests,
            ports={f"{p}/tcp": ("127.0.0.1", None) for p in (HTTP_PORT, GRPC_PORT, METRICS_PORT)},
            labels={"ai.triton-builder.verification": "1"},
        )
    except docker.errors.APIError as error:
        raise VerificationError(f"could not create a container of {image}: "
                                f"{error.explanation or error}") from None
    try:
        try:
            container.start()
        except docker.errors.APIError as error:
            raise VerificationError(f"could not start {image}: {error.explanation or error}",
                                    _logs(container)) from None
        endpoint = _wait_ready(container, timeout)
        models = _check_models_ready(endpoint)
        for check in checks:
            try:
                check(endpoint)
            except Exception as error:  # noqa: BLE001 - any failed check fails verification
                raise VerificationError(
                    f"{image} answered, but a check failed: {type(error).__name__}: {error}"
                ) from error
        return Verification(image=image, gpus=use_gpus, seconds=time.monotonic() - started,
                            models=models)
    except VerificationError as error:
        failure = error if error.logs else VerificationError(str(error), _logs(container))
        if on_log:
            on_log(str(failure))
        raise failure from error.__cause__
    finally:
        try:
            container.remove(force=True)
        except docker.errors.APIError:
            pass


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


def docker_run_command(image: str, *, gpus: bool = True, shm_size: str = DEFAULT_SHM_SIZE) -> str:
    """The command users copy to run the image (GPU form unless ``gpus=False``)."""
    parts = ["docker", "run", "--rm"]
    if gpus:
        parts.append("--gpus=all")
    parts.append(f"--shm-size={shm_size}")
    for port in (HTTP_PORT, GRPC_PORT, METRICS_PORT):
        parts += ["-p", f"{port}:{port}"]
    parts.append(image)
    return shlex.join(parts)


def infer(
    endpoint: Endpoint,
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


def _wait_ready(container, timeout: float) -> Endpoint:
    deadline = time.monotonic() + timeout
    endpoint = None
    while time.monotonic() < deadline:
        container.reload()
        if container.status in ("exited", "dead"):
            code = container.attrs.get("State", {}).get("ExitCode")
            raise VerificationError(f"the container exited with code {code} while starting",
                                    _logs(container))
        if endpoint is None:
            endpoint = _endpoint(container)
        if endpoint is not None:
            try:
                with urllib.request.urlopen(f"http://{endpoint.http_url}/v2/health/ready",
                                            timeout=2) as response:
                    if response.status == 200:
                        return endpoint
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
        time.sleep(0.5)
    raise VerificationError(f"Triton was not ready after {timeout:.0f}s", _logs(container))


def _endpoint(container) -> Endpoint | None:
    ports = container.ports or {}

    def url(port: int) -> str | None:
        bound = ports.get(f"{port}/tcp")
        return f"127.0.0.1:{bound[0]['HostPort']}" if bound else None

    http, grpc, metrics = url(HTTP_PORT), url(GRPC_PORT), url(METRICS_PORT)
    if not (http and grpc):
        return None
    return Endpoint(http_url=http, grpc_url=grpc, metrics_url=metrics or "",
                    container_id=container.id)


def _check_models_ready(endpoint: Endpoint) -> list[str]:
    """Every model of the repository index must be READY (readiness alone allows none)."""
    request = urllib.request.Request(f"http://{endpoint.http_url}/v2/repository/index",
                                     data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        index = json.load(response)
    if not index:
        raise VerificationError("Triton is ready but serves no model")
    broken = [f"{m.get('name')}: {m.get('state')} {m.get('reason', '')}".strip()
              for m in index if m.get("state") != "READY"]
    if broken:
        raise VerificationError("models not ready: " + "; ".join(broken))
    return sorted(m["name"] for m in index)


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


def _logs(container) -> str:
    try:
        return container.logs().decode(errors="replace")
    except docker.errors.APIError:
        return ""
