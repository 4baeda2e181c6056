"""A STAND-IN for ``triton_python_backend_utils``, for unit tests of the runtimes only.

It is not Triton: it implements just the calls :mod:`builder.runtime.pipeline_model` and
:mod:`builder.runtime.torch_model` make (tensors, requests, responses, BLS, the logger), with
Triton's observable behaviour where it matters to them — ``as_numpy`` refuses a tensor in "GPU"
memory, which must go through dlpack; a BLS response carries an error instead of raising. BLS
requests run the models of the repository under test in process (the exported ONNX files
through onnxruntime), so a unit test checks the runtime against the models it really calls.
The end-to-end tests run the real server.

This module itself plays python_backend r24.10; :func:`generation` gives the names and
signatures another release's ``triton_python_backend_utils`` has (:data:`GENERATIONS`, read from
each branch's ``src/pb_stub.cc``), e.g. r22.12's ``TritonError`` without error codes.

:class:`GpuStandIn` STANDS IN FOR A GPU (none exists here, and torch is a CPU build): it makes
torch report a CUDA device and records every move of a module or tensor to and from it.
"""

from __future__ import annotations

import json
import struct
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.dlpack

TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class TritonError:
    """Codes as python_backend's ``c_python_backend_utils.TritonError`` (r24.10) has them."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED = 0, 1, 2, 3, 4, 5

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class MessageOnlyTritonError:
    """``TritonError`` before r23.09: ``py::init<std::string>()`` and ``message()``, no codes
    (r22.12 and r23.05 ``pb_stub.cc``)."""

    def __init__(self, message: str) -> None:
        self._message = message

    def message(self) -> str:
        return self._message


class Tensor:
    """A named tensor; ``on_gpu`` simulates device memory (only dlpack can read it)."""

    def __init__(self, name: str, array: np.ndarray, on_gpu: bool = False) -> None:
        self._name = name
        self._array = np.asarray(array)
        self._on_gpu = on_gpu

    def name(self) -> str:
        return self._name

    def is_cpu(self) -> bool:
        return not self._on_gpu

    def as_numpy(self) -> np.ndarray:
        if self._on_gpu:
            raise RuntimeError("Tensor is stored in GPU and cannot be converted to NumPy.")
        return self._array

    def to_dlpack(self) -> Any:
        return torch.utils.dlpack.to_dlpack(torch.from_numpy(np.array(self._array)))

    @classmethod
    def from_dlpack(cls, name: str, capsule: Any) -> Tensor:
        return cls(name, torch.utils.dlpack.from_dlpack(capsule).cpu().numpy())


class InferenceResponse:
    """As in Triton: built with ``error=``, read with ``has_error()`` and ``error()``."""

    def __init__(self, output_tensors: list[Tensor] | None = None,
                 error: TritonError | None = None) -> None:
        self.output_tensors = list(output_tensors or [])
        self._error = error

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


@dataclass
class Request:
    """What Triton hands ``execute``: named input tensors (in "GPU" memory if ``on_gpu``).

    For a decoupled model, ``sent`` records what its response sender sent (a response or
    ``None``, and the flags); the client cancels once ``cancel_after`` responses have come;
    each send takes ``send_s`` (the round trip to the server). ``request_parameters``: what
    ``parameters()`` returns, as JSON."""

    inputs: dict[str, np.ndarray]
    on_gpu: bool = False
    cancel_after: int | None = None
    send_s: float = 0.0
    request_parameters: dict = field(default_factory=dict)
    sent: list[tuple[InferenceResponse | None, int]] = field(default_factory=list)

    def parameters(self) -> str:
        return json.dumps(self.request_parameters)

    def is_cancelled(self) -> bool:
        return self.cancel_after is not None and len(self.sent) >= self.cancel_after

    def get_response_sender(self) -> ResponseSender:
        return ResponseSender(self)


class ResponseSender:
    """``InferenceResponseSender``: nothing may be sent after the final flag."""

    def __init__(self, request: Request) -> None:
        self.request = request

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if any(f & TRITONSERVER_RESPONSE_COMPLETE_FINAL for _, f in self.request.sent):
            raise RuntimeError("a response was sent after the final flag")
        time.sleep(self.request.send_s)
        self.request.sent.append((response, flags))

    def is_cancelled(self) -> bool:
        return self.request.is_cancelled()


def get_input_tensor_by_name(request: Request, name: str) -> Tensor | None:
    if name not in request.inputs:
        return None
    return Tensor(name, request.inputs[name], on_gpu=request.on_gpu)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors if t.name() == name), None)


class PreferredMemory:
    def __init__(self, kind: int, device: int) -> None:
        self.kind, self.device = kind, device


class InferenceResponseR2212(InferenceResponse):
    """r22.12 and r23.05: ``output_tensors`` has no default (``py::arg("output_tensors")
    .none(false)``); r24.10 defaults it to ``[]``."""

    def __init__(self, output_tensors: list[Tensor], error: Any = None) -> None:
        if output_tensors is None:
            raise TypeError("InferenceResponse(): output_tensors may not be None")
        super().__init__(output_tensors, error)


class Metric:
    """A counter, gauge or histogram of a :class:`MetricFamily`, as python_backend's custom
    metrics (r24.10: ``Metric(labels, buckets)``; a histogram is observed, not incremented)."""

    def __init__(self, family: MetricFamilyR2305, labels: dict[str, str],
                 buckets: list[float] | None = None) -> None:
        self.histogram = family.kind == getattr(family, "HISTOGRAM", None)
        if self.histogram != (buckets is not None):
            raise ValueError("TritonError: a histogram, and only a histogram, has buckets")
        self.family, self.labels, self._value = family, dict(labels), 0.0
        self.buckets = buckets

    def increment(self, value: float) -> None:
        if self.histogram:
            raise ValueError("TritonError: a histogram is observed, not incremented")
        if self.family.kind == MetricFamily.COUNTER and value < 0:
            raise ValueError("TritonError: increment must be non-negative for a counter")
        self._value += value
        MetricFamily.increments.append((self.family.name, self.labels, value))

    def observe(self, value: float) -> None:
        if not self.histogram:
            raise ValueError("TritonError: only a histogram is observed")
        MetricFamily.observations.append((self.family.name, self.labels, value))

    def value(self) -> float:
        return self._value


class MetricFamilyR2305:
    """Custom metrics as python_backend 23.05 has them: counters and gauges, ``Metric(labels)``;
    ``increments`` records every update, each of which is a message to the server in Triton."""

    COUNTER, GAUGE = 0, 1
    increments: list[tuple[str, dict[str, str], float]] = []
    observations: list[tuple[str, dict[str, str], float]] = []

    def __init__(self, name: str, description: str, kind: int) -> None:
        self.name, self.description, self.kind = name, description, kind

    def Metric(self, labels: dict[str, str]) -> Metric:  # noqa: N802 - python_backend's name
        return Metric(self, labels)


class MetricFamily(MetricFamilyR2305):
    """r24.10: histograms too (24.08 on), ``Metric(labels, buckets)``; ``observations``
    records every observation."""

    HISTOGRAM = 2

    def Metric(self, labels: dict[str, str],  # type: ignore[override]  # noqa: N802
               buckets: list[float] | None = None) -> Metric:
        return Metric(self, labels, buckets)


class Logger:
    messages: list[str] = []
    """Warnings."""
    infos: list[str] = []

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls.messages.append(message)

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.infos.append(message)


@dataclass
class BlsCall:
    model_name: str
    batch_size: int


class Models:
    """The models BLS requests reach: name → function(inputs) → outputs; records every call."""

    registry: dict[str, Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]] = {}
    calls: list[BlsCall] = []
    outputs_on_gpu = False
    preferred_memory: list[PreferredMemory | None] = []

    @classmethod
    def reset(cls) -> None:
        cls.registry, cls.calls, cls.outputs_on_gpu = {}, [], False
        cls.preferred_memory = []


class Unavailable(Exception):
    """Raised by a registered model: the request is refused as Triton refuses one that its
    queue policy rejects (``UNAVAILABLE``: "Request timeout expired")."""


class BlsRequest:
    """``InferenceRequest`` as python_backend binds it before r23.10: no ``is_cancelled``."""

    def __init__(self, model_name: str, requested_output_names: list[str], inputs: list[Tensor],
                 preferred_memory: PreferredMemory | None = None) -> None:
        self.model_name = model_name
        self.requested_output_names = requested_output_names
        self.inputs = {t.name(): t.as_numpy() for t in inputs}
        Models.preferred_memory.append(preferred_memory)

    def exec(self) -> InferenceResponse:
        Models.calls.append(BlsCall(self.model_name, len(next(iter(self.inputs.values())))))
        model = Models.registry.get(self.model_name)
        if model is None:
            return InferenceResponse(error=TritonError(
                f"Request for unknown model: '{self.model_name}' is not found"))
        try:
            outputs = model(self.inputs)
        except Unavailable as error:
            return InferenceResponse(error=TritonError(str(error), TritonError.UNAVAILABLE))
        except Exception as error:  # noqa: BLE001 - Triton reports model errors this way
            return InferenceResponse(error=TritonError(str(error)))
        return InferenceResponse(output_tensors=[
            Tensor(name, outputs[name], on_gpu=Models.outputs_on_gpu)
            for name in self.requested_output_names
        ])


class InferenceRequest(BlsRequest):
    """From r23.10 a request can tell that its client cancelled it."""

    def is_cancelled(self) -> bool:
        return False


class InferenceRequestR2212(BlsRequest):
    """r22.12: no ``preferred_memory`` argument (``PreferredMemory`` came in r23.04)."""

    def __init__(self, model_name: str, requested_output_names: list[str],
                 inputs: list[Tensor]) -> None:
        super().__init__(model_name, requested_output_names, inputs)


GENERATIONS: dict[str, dict[str, Any]] = {
    "r24.10": {},
    "r23.05": {"TritonError": MessageOnlyTritonError,
               "InferenceResponse": InferenceResponseR2212, "InferenceRequest": BlsRequest,
               "MetricFamily": MetricFamilyR2305},
    "r22.12": {"TritonError": MessageOnlyTritonError,
               "InferenceResponse": InferenceResponseR2212,
               "InferenceRequest": InferenceRequestR2212,
               "PreferredMemory": None, "TRITONSERVER_MEMORY_CPU": None, "MetricFamily": None},
}
"""How each release's ``triton_python_backend_utils`` differs from this module's (r24.10): a
name → its class there, or ``None`` where that release binds no such name. Read from
``src/pb_stub.cc`` of python_backend r22.12, r23.05 and r24.10 (the names the stub copies from
``c_python_backend_utils`` into ``triton_python_backend_utils``, and their ``py::init``)."""

API_NAMES = ("TritonError", "Tensor", "InferenceRequest", "InferenceResponse", "Logger",
             "PreferredMemory", "TRITONSERVER_MEMORY_CPU", "MetricFamily",
             "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
             "get_input_tensor_by_name", "get_output_tensor_by_name")


def generation(release: str) -> types.ModuleType:
    """A ``triton_python_backend_utils`` stand-in with the names of python_backend ``release``
    (a key of :data:`GENERATIONS`); the test helpers (``Request``, ``Models``) stay here."""
    module = types.ModuleType(f"triton_python_backend_utils stand-in ({release})")
    here = globals()
    for name in API_NAMES:
        value = GENERATIONS[release].get(name, here[name])
        if value is not None:
            setattr(module, name, value)
    return module


@dataclass
class GpuStandIn:
    """STANDS IN FOR A GPU: ``torch.cuda`` reports ``devices`` GPUs, and moving a tensor to
    ``cuda:N`` gives a copy marked as living there (``standin_device``).

    As with a real GPU, a marked tensor cannot become a NumPy array (``numpy()`` raises what
    torch raises for a CUDA tensor) until it is moved back with ``cpu()`` / ``to("cpu")``;
    ``moves`` records every move, ``("module"|"tensor", device)``. Install it with
    :meth:`install` on pytest's ``monkeypatch``. A module under test marks its outputs with its
    inputs' device, as a computation on a GPU leaves its results there.
    """

    devices: int = 1
    moves: list[tuple[str, str]] = field(default_factory=list)

    def install(self, monkeypatch: Any) -> GpuStandIn:
        real_to, real_cpu, real_numpy = torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.numpy
        real_module_to = torch.nn.Module.to
        stand_in = self

        def device_of(args: tuple, kwargs: dict) -> torch.device | None:
            for value in (*args, kwargs.get("device")):
                if isinstance(value, (str, torch.device)):
                    return torch.device(value)
            return None

        def tensor_to(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            device = device_of(args, kwargs)
            if device is not None and device.type == "cuda":
                if (device.index or 0) >= stand_in.devices:
                    raise RuntimeError(f"CUDA error: invalid device ordinal ({device})")
                moved = tensor.clone()
                moved.standin_device = str(device)
                stand_in.moves.append(("tensor", str(device)))
                return moved
            if device is not None and getattr(tensor, "standin_device", None):
                return tensor_cpu(tensor)
            return real_to(tensor, *args, **kwargs)

        def tensor_cpu(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if getattr(tensor, "standin_device", None):
                stand_in.moves.append(("tensor", "cpu"))
                return tensor.clone()  # a clone carries no mark: host memory
            return real_cpu(tensor, *args, **kwargs)

        def tensor_numpy(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> np.ndarray:
            if getattr(tensor, "standin_device", None):
                raise TypeError(f"can't convert {tensor.standin_device} device type tensor to "
                                f"numpy. Use Tensor.cpu() to copy the tensor to host memory first.")
            return real_numpy(tensor, *args, **kwargs)

        def module_to(module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
            device = device_of(args, kwargs)
            if device is not None and device.type == "cuda":
                stand_in.moves.append(("module", str(device)))
                for part in module.modules():  # as .to() moves every submodule
                    part.standin_device = str(device)
                return module
            return real_module_to(module, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "to", tensor_to)
        monkeypatch.setattr(torch.Tensor, "cpu", tensor_cpu)
        monkeypatch.setattr(torch.Tensor, "numpy", tensor_numpy)
        monkeypatch.setattr(torch.nn.Module, "to", module_to)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.devices)
        return self


def warm_up_requests(model_dir: Path, config) -> list[list[Request]]:
    """The requests of each ``model_warmup`` sample of ``config`` (a ``ModelConfig``), read from
    ``<model_dir>/warmup/`` as Triton reads them (``GenerateWarmupData``, core r24.10): a row
    per request, ``batch_size`` requests in one execution, a ``TYPE_STRING`` element as its
    4-byte little-endian length and its bytes."""
    from tritonclient.grpc import model_config_pb2 as mc

    from builder.pipeline.signature import numpy_dtype

    samples = []
    for sample in config.model_warmup:
        inputs = {}
        for name, given in sample.inputs.items():
            data = (Path(model_dir) / "warmup" / given.input_data_file).read_bytes()
            dims = [1, *given.dims] if config.max_batch_size > 0 else list(given.dims)
            if given.data_type == mc.TYPE_STRING:
                elements, offset = [], 0
                while offset < len(data):
                    (length,) = struct.unpack_from("<I", data, offset)
                    elements.append(data[offset + 4:offset + 4 + length])
                    offset += 4 + length
                array = np.empty(len(elements), dtype=object)
                array[:] = elements
            else:
                array = np.frombuffer(data, dtype=numpy_dtype(
                    mc.DataType.Name(given.data_type)).newbyteorder("<"))
            inputs[name] = array.reshape(dims)
        samples.append([Request(dict(inputs)) for _ in range(sample.batch_size)])
    return samples


def run_warm_up(model, model_dir: Path, config) -> None:
    """What Triton does after ``initialize`` and before the model is ready: each sample in one
    ``execute``; an error response fails the load."""
    for requests in warm_up_requests(model_dir, config):
        for response in model.execute(requests) or []:
            if response.has_error():
                raise RuntimeError(f"failed to run warmup sample: {response.error().message()}")
