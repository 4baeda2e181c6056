"""Triton's ``onnxruntime`` backend as a Python-based backend, on the ``onnxruntime`` wheel.

Triton loads a directory ``<backend-directory>/onnxruntime/`` holding only this ``model.py`` as
the backend of every model with ``backend: "onnxruntime"`` or ``platform: "onnxruntime_onnx"``.
The CPU images and the host-process server use it where NGC's C++ backend is not available, so
one model repository serves unchanged in both.

Like the C++ backend, it batches: the requests of one ``execute`` call whose non-batch shapes
agree are concatenated along the batch axis and run as one ``InferenceSession.run``.

On a ``KIND_GPU`` instance (the slim GPU images, with onnxruntime-gpu and NVIDIA's CUDA wheels
in the environment) the session runs on the instance's GPU with ONNX Runtime's CUDA execution
provider. ONNX Runtime falls back to the CPU, with a log line only, when that provider cannot
start: its library finds NVIDIA's wheels only once they are loaded (``preload_dlls``), and the
driver's ``libcuda.so.1`` only in a container run with GPUs. Such a model must not load as if it
were on the GPU: here it fails to load, naming the library that is missing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Dict  # noqa: UP035 - runs on the Python 3.8 stubs too

import numpy as np

Feeds = Dict[str, np.ndarray]  # noqa: UP006 - a runtime alias: dict[...] needs 3.9


@dataclass
class BatchResult:
    """The outputs of one request, or the error that stopped them (its outputs then empty)."""

    outputs: Feeds = field(default_factory=dict)
    error: str | None = None


def run_batched(session, feeds: Sequence[Feeds], output_names: Sequence[str],
                batching: bool) -> list[BatchResult]:
    """Run ``feeds`` (one dict per request) through ``session`` with as few runs as possible.

    With ``batching`` the requests are grouped by the shapes of their non-batch dimensions; each
    group is concatenated on axis 0, run once and split back by each request's batch size.
    Without it (``max_batch_size: 0``) every request runs on its own.
    """
    results = [BatchResult() for _ in feeds]
    groups: dict[tuple, list[int]] = {}
    for index, feed in enumerate(feeds):
        key = tuple((name, array.dtype.str, array.shape[1:] if batching else array.shape)
                    for name, array in sorted(feed.items()))
        groups.setdefault(key if batching else (index,), []).append(index)
    for members in groups.values():
        try:
            _run_group(session, [feeds[i] for i in members], output_names,
                       [results[i] for i in members])
        except Exception as error:  # noqa: BLE001 - every request of the group must answer
            for i in members:
                results[i] = BatchResult(error=f"onnxruntime: {error}")
    return results


def _run_group(session, feeds: list[Feeds], output_names: Sequence[str],
               results: list[BatchResult]) -> None:
    if len(feeds) == 1:
        outputs = session.run(list(output_names), feeds[0])
        results[0].outputs = dict(zip(output_names, outputs))
        return
    sizes = [len(next(iter(feed.values()))) for feed in feeds]
    merged = {name: np.concatenate([feed[name] for feed in feeds]) for name in feeds[0]}
    outputs = session.run(list(output_names), merged)
    bounds = np.cumsum(sizes)[:-1]
    for result in results:
        result.outputs = {}
    for name, output in zip(output_names, outputs):
        for result, part in zip(results, np.split(output, bounds)):
            result.outputs[name] = part


def session_options(parameters: dict, instances: int = 1) -> object:
    """ORT session options from the model's ``parameters`` (the C++ backend's names).

    Unless the parameters say otherwise: no spinning threads, and half the cores per instance
    for a run. Measured on 2 cores with the client on the machine: ORT's default spinning
    intra-op threads burn the CPU that the server, the other stubs and the client need, and one
    thread per run costs less CPU per row than two on small models.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    values = {key: value.get("string_value", "") for key, value in parameters.items()}
    options.intra_op_num_threads = int(values.get("intra_op_thread_count") or max(
        1, (os.cpu_count() or 1) // (2 * max(1, instances))))
    options.inter_op_num_threads = int(values.get("inter_op_thread_count") or 1)
    spinning = values.get("allow_spinning", "0")
    options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    options.add_session_config_entry("session.inter_op.allow_spinning", spinning)
    return options


CUDA_PROVIDER = "CUDAExecutionProvider"
CUDA_PROVIDER_LIBRARY = "libonnxruntime_providers_cuda.so"
CUDA_DRIVER_LIBRARY = "libcuda.so.1"


class CudaProviderError(RuntimeError):
    """A GPU instance whose session cannot run on the GPU."""


def providers(instance_kind: str, device_id: int = 0) -> list:
    """On a GPU instance the CUDA provider on the instance's device, then the CPU; else the CPU."""
    if instance_kind == "GPU":
        return [(CUDA_PROVIDER, {"device_id": device_id}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def cuda_provider_problem(driver: bool = True) -> str | None:
    """Why ONNX Runtime's CUDA provider cannot start here, naming the library; None if it can.

    NVIDIA's wheels are loaded first (``onnxruntime.preload_dlls``, 1.21 and later), as a GPU
    session needs them; then the provider's library itself, whose loader error names the first
    library it lacks; then (``driver``) the NVIDIA driver's ``libcuda.so.1``, which only a
    container run with GPUs has. Without ``driver`` it answers whether the environment holds
    every library, which a machine without a GPU can tell too.
    """
    import ctypes

    import onnxruntime as ort

    if CUDA_PROVIDER not in ort.get_available_providers():
        return (f"onnxruntime {ort.__version__} is not a GPU build (it has no {CUDA_PROVIDER}): "
                f"the environment needs onnxruntime-gpu")
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    library = os.path.join(os.path.dirname(ort.__file__), "capi", CUDA_PROVIDER_LIBRARY)
    try:
        ctypes.CDLL(library)
    except OSError as error:
        return f"{CUDA_PROVIDER_LIBRARY} cannot be loaded: {error}"
    if driver:
        try:
            ctypes.CDLL(CUDA_DRIVER_LIBRARY)
        except OSError as error:
            return (f"the NVIDIA driver's {CUDA_DRIVER_LIBRARY} cannot be loaded ({error}): run "
                    f"the container with GPUs (docker run --gpus=all, the NVIDIA container "
                    f"runtime)")
    return None


def require_cuda_provider(session, model: str) -> None:
    """Refuse a GPU instance's session that did not get the CUDA provider, saying why."""
    if CUDA_PROVIDER in session.get_providers():
        return
    problem = cuda_provider_problem() or ("ONNX Runtime could not start it on this device "
                                          "(its log above says why)")
    raise CudaProviderError(
        f"model {model!r} is KIND_GPU, but its ONNX Runtime session got only "
        f"{', '.join(session.get_providers())}, not {CUDA_PROVIDER}: {problem}")


def onnx_file(config: dict) -> str:
    """The model's ONNX file: ``default_model_filename``, else ``model.onnx``.

    This file also serves as a plain python model's ``1/model.py`` beside ``model.onnx`` (how
    the tests serve ONNX models on python backends older than Python-based backends, r23.05
    and before); Triton then fills ``default_model_filename`` with ``model.py``, this script.
    """
    filename = config.get("default_model_filename") or ""
    return "model.onnx" if not filename or filename.endswith(".py") else filename


class TritonPythonModel:
    """The backend's entry point: one ONNX Runtime session per model instance."""

    def initialize(self, args: dict) -> None:
        import onnxruntime as ort

        config = json.loads(args["model_config"])
        path = os.path.join(args["model_repository"], args["model_version"], onnx_file(config))
        kind = args.get("model_instance_kind", "CPU")
        if kind == "GPU":
            problem = cuda_provider_problem()
            if problem:
                raise CudaProviderError(f"model {args.get('model_name', path)!r} is KIND_GPU, "
                                        f"but ONNX Runtime's CUDA provider cannot start: "
                                        f"{problem}")
        self._session = ort.InferenceSession(
            path,
            sess_options=session_options(config.get("parameters", {}), sum(
                int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1),
            providers=providers(kind, int(args.get("model_instance_device_id", 0) or 0)),
        )
        if kind == "GPU":
            require_cuda_provider(self._session, args.get("model_name", path))
        self._batching = config.get("max_batch_size", 0) > 0
        self._inputs = [tensor["name"] for tensor in config["input"]]
        self._outputs = [tensor["name"] for tensor in config["output"]]

    def execute(self, requests: list) -> list:
        import triton_python_backend_utils as pb_utils

        feeds = [
            {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
             for name in self._inputs}
            for request in requests
        ]
        responses = []
        for result in run_batched(self._session, feeds, self._outputs, self._batching):
            if result.error is not None:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(result.error)))
            else:
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor(name, np.ascontiguousarray(array))
                    for name, array in result.outputs.items()
                ]))
        return responses
