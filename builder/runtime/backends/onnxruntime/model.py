"""Triton's ``onnxruntime`` backend as a Python-based backend, on the ``onnxruntime`` wheel.

Triton loads a directory ``<backend-directory>/onnxruntime/`` holding only this ``model.py`` as
the backend of every model with ``backend: "onnxruntime"`` or ``platform: "onnxruntime_onnx"``.
The CPU images and the host-process server use it where NGC's C++ backend is not available, so
one model repository serves unchanged in both.

Like the C++ backend, it batches: the requests of one ``execute`` call whose non-batch shapes
agree are concatenated along the batch axis and run as one ``InferenceSession.run``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Dict  # noqa: UP035 - runs on the Python 3.8 stubs too

import numpy as np

Feeds = Dict[str, np.ndarray]  # noqa: UP006 - a runtime alias: dict[...] needs 3.9


@dataclass
class BatchResult:
    """The outputs of one request, or the error that stopped them."""

    outputs: Feeds | None = None
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


def providers(instance_kind: str) -> list[str]:
    """CUDA first on a GPU instance when this onnxruntime build has it, CPU always."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    wanted = ["CUDAExecutionProvider"] if instance_kind == "GPU" else []
    return [p for p in wanted if p in available] + ["CPUExecutionProvider"]


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
        self._session = ort.InferenceSession(
            path,
            sess_options=session_options(config.get("parameters", {}), sum(
                int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1),
            providers=providers(args.get("model_instance_kind", "CPU")),
        )
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
