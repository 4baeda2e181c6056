"""A torch module served by Triton's python backend: the ``python`` export format.

Copied into ``<model>/1/model.py`` beside ``module.pickle`` (the module, pickled by value with
cloudpickle). It is the fallback for modules that ONNX and TorchScript cannot express. Like the
framework backends it batches: the requests of one ``execute`` call are concatenated along the
batch axis when their other dimensions agree, and run as one forward pass. On a ``KIND_GPU``
instance the module runs on that GPU; tensors cross into and out of Triton through dlpack.

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
        import torch

        self._pb = pb_utils
        config = json.loads(args["model_config"])
        self._inputs = [tensor["name"] for tensor in config["input"]]
        self._outputs = [tensor["name"] for tensor in config["output"]]
        self._batching = config.get("max_batch_size", 0) > 0
        directory = Path(args["model_repository"]) / args["model_version"]
        with open(directory / MODULE_FILE, "rb") as file:
            module = pickle.load(file)
        if args.get("model_instance_kind") == "GPU":
            self._device = torch.device(f"cuda:{args.get('model_instance_device_id', 0)}")
        else:
            self._device = torch.device("cpu")
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
            for index, output in zip(members, outputs, strict=True):
                results[index] = output
        return [self._response(result) for result in results]

    # -- helpers ---------------------------------------------------------------------------
    def _input(self, request: Any, name: str) -> Any:
        import torch

        tensor = self._pb.get_input_tensor_by_name(request, name)
        if tensor is None:
            raise ValueError(f"missing input {name!r}")
        if tensor.is_cpu():
            value = torch.from_numpy(np.array(tensor.as_numpy()))
        else:
            value = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
        return value.to(self._device)

    def _forward(self, feeds: list[list[Any]]) -> list[list[Any]]:
        import torch

        sizes = [feed[0].shape[0] for feed in feeds]
        merged = [torch.cat(parts) for parts in zip(*feeds, strict=True)]
        with torch.no_grad():
            outputs = self._module(*merged)
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        split = [torch.split(output, sizes) for output in outputs]
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
        tensors = []
        for name, value in zip(self._outputs, result, strict=True):
            if value.is_cuda:
                import torch

                tensors.append(pb.Tensor.from_dlpack(
                    name, torch.utils.dlpack.to_dlpack(value.contiguous())))
            else:
                tensors.append(pb.Tensor(name, np.ascontiguousarray(value.numpy())))
        return pb.InferenceResponse(output_tensors=tensors)
