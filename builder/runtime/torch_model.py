"""A torch module served by Triton's python backend: the ``python`` export format.

Copied into ``<model>/1/model.py`` beside ``module.pickle`` (the module, pickled by value with
cloudpickle). It is the fallback for modules that ONNX and TorchScript cannot express. Like the
framework backends it batches: the requests of one ``execute`` call are concatenated along the
batch axis when their other dimensions agree, and run as one forward pass. On a ``KIND_GPU``
instance the module and each batch's inputs move to that instance's GPU (inputs Triton hands
over in GPU memory are read through dlpack), and the results come back to host memory before
they are answered: the pipeline model that called runs on the CPU, and before 23.04 BLS had no
way to ask for host memory, so a GPU tensor here would reach it as one only dlpack can read.

It imports nothing from ``builder``: the serving environment need not have it installed.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton: unit tests pass a stand-in to TritonPythonModel
    pb_utils = None

MODULE_FILE = "module.pickle"


class TritonPythonModel:
    """Load the module once per instance; run each dynamic batch as one forward pass."""

    def initialize(self, args: dict[str, Any]) -> None:

        self._pb = pb_utils
        config = json.loads(args["model_config"])
        self._inputs = [tensor["name"] for tensor in config["input"]]
        self._outputs = [tensor["name"] for tensor in config["output"]]
        self._batching = config.get("max_batch_size", 0) > 0
        directory = Path(args["model_repository"]) / args["model_version"]
        with open(directory / MODULE_FILE, "rb") as file:
            module = pickle.load(file)
        self._device = instance_device(args)
        self._module = module.to(self._device).eval()

    def execute(self, requests: list) -> list:
        results: list[Any] = [None] * len(requests)
        feeds: list[Any] = [None] * len(requests)
        for index, request in enumerate(requests):
            try:
                feeds[index] = [self._input(request, name) for name in self._inputs]
            except Exception as error:  # noqa: BLE001 - this request's error response
                results[index] = error
        groups: dict[tuple, list[int]] = {}
        for index, feed in enumerate(feeds):
            if feed is None:
                continue
            key = tuple((tuple(t.shape[1:]), str(t.dtype)) for t in feed) if self._batching else (
                index,)
            groups.setdefault(key, []).append(index)
        for members in groups.values():
            try:
                outputs = self._forward([feeds[i] for i in members])
            except Exception:  # noqa: BLE001 - retried alone so only the culprit fails
                outputs = [self._forward_alone(feeds[i]) for i in members]
            for index, output in zip(members, outputs):
                results[index] = output
        return [self._response(result) for result in results]

    # -- helpers ---------------------------------------------------------------------------
    def _input(self, request: Any, name: str) -> Any:
        import torch

        tensor = self._pb.get_input_tensor_by_name(request, name)
        if tensor is None:
            raise ValueError(f"missing input {name!r}")
        if tensor.is_cpu():
            return torch.from_numpy(np.array(tensor.as_numpy()))
        return torch.utils.dlpack.from_dlpack(tensor.to_dlpack())

    def _forward(self, feeds: list[list[Any]]) -> list[list[Any]]:
        import torch

        sizes = [feed[0].shape[0] for feed in feeds]
        merged = [torch.cat(parts).to(self._device) for parts in zip(*feeds)]
        with torch.no_grad():
            outputs = self._module(*merged)
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        split = [torch.split(output.cpu(), sizes) for output in outputs]
        return [[parts[i] for parts in split] for i in range(len(feeds))]

    def _forward_alone(self, feed: list[Any]) -> Any:
        try:
            return self._forward([feed])[0]
        except Exception as error:  # noqa: BLE001 - becomes this request's error response
            return error

    def _response(self, result: Any) -> Any:
        pb = self._pb
        if isinstance(result, Exception):
            return pb.InferenceResponse(
                output_tensors=[], error=pb.TritonError(f"{type(result).__name__}: {result}")
            )
        if len(result) != len(self._outputs):
            return pb.InferenceResponse(output_tensors=[], error=pb.TritonError(
                f"the module returned {len(result)} outputs, the model declares "
                f"{len(self._outputs)}"))
        return pb.InferenceResponse(output_tensors=[
            pb.Tensor(name, np.ascontiguousarray(value.numpy()))
            for name, value in zip(self._outputs, result)
        ])


def instance_device(args: dict[str, Any]) -> Any:
    """The torch device of this model instance: its GPU for ``KIND_GPU``, else the CPU.

    A GPU instance whose environment has a CPU-only torch would fail at the first request with
    an obscure CUDA error; it fails here instead, saying what to rebuild.
    """
    import torch

    if args.get("model_instance_kind") != "GPU":
        return torch.device("cpu")
    device = torch.device(f"cuda:{args.get('model_instance_device_id', 0)}")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"this instance of {args.get('model_name', 'the model')} is KIND_GPU on {device}, "
            f"but torch {torch.__version__} in its environment sees no CUDA device (a CPU "
            f"build, or a CUDA runtime the driver cannot run): rebuild the image for the "
            f"release's CUDA, or give the operator op_config={{'device': 'cpu'}}"
        )
    return device
