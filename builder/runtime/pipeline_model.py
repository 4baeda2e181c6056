"""The pipeline model: Triton's python backend running a pipeline's DAG.

Copied into ``<pipeline>/1/model.py`` beside ``pipe.pickle`` (the pipeline, user code captured
by value) and ``pipe.versions.json`` (the Python and library versions it was pickled with).

``execute`` receives a dynamic batch of requests, each holding a batch of calls (one per element
of the batch dimension). It decodes every call's typed input tensors into Python values, runs all
calls through the DAG together — Python operators in process, model operators in one model call
for the rows of all calls where their shapes agree — and answers each request with
typed output tensors, or with an error response when one of its calls failed; the other requests
still get their results. A model call is a BLS request, or, for the ONNX models the config's
``in_process_models`` parameter names (CPU targets), an ONNX Runtime session in this process.
How long each operator ran, and on how many rows, goes to the server's metrics endpoint
(:class:`OperatorMetrics`).

Everything this module needs from ``triton_python_backend_utils`` goes through
:class:`TritonApi`, so the logic here runs, and is tested, without Triton. It imports nothing
from ``builder``: the serving environment need not have it installed.
"""

from __future__ import annotations

import json
import os
import pickle
import platform
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton: unit tests pass a stand-in to TritonPythonModel
    pb_utils = None
try:  # in Triton: beside model.py, which the stub imports as the module "<version>.model"
    from . import triton_builder_drain as drain
except ImportError:  # in the builder's package: builder.runtime.drain
    from . import drain

PIPELINE_FILE = "pipe.pickle"
VERSIONS_FILE = "pipe.versions.json"


class PipelineLoadError(RuntimeError):
    """``pipe.pickle`` cannot be loaded here (Python or library mismatch, missing package)."""


class BlsError(RuntimeError):
    """A model operator's BLS request failed; ``unavailable`` where the model could not take it
    now (its queue full, or its latency budget spent: Triton's ``UNAVAILABLE``), which the
    pipeline's own answer then says too, so that the client may send it again."""

    def __init__(self, message: str, *, unavailable: bool = False) -> None:
        super().__init__(message)
        self.unavailable = unavailable


STOPPING = "the server is stopping: send the request again (to another replica)"
"""The answer to a request that comes while the replica closes (:mod:`builder.runtime.drain`)."""


# -- the python backend API of the release this model runs on -------------------------------
@dataclass(frozen=True)
class PythonBackendApi:
    """What ``triton_python_backend_utils`` offers in the release serving this model.

    The same ``model.py`` runs on every release an image can be built on, 22.12 to 25.xx, and
    the python backend binds more with each: the stub copies the names below from its
    ``c_python_backend_utils`` module into ``triton_python_backend_utils`` (``src/pb_stub.cc``
    of each branch). Each feature is found by the name that carries it, since nothing tells
    the model its release; where one is missing the model does without it, as listed:

    ====================  ======  ======  ======  =================================================
    feature               r22.12  r23.05  r24.10  without it
    ====================  ======  ======  ======  =================================================
    ``Logger``            yes     yes     yes     warnings go to stderr (the server's log)
    ``PreferredMemory``   no      yes     yes     BLS outputs may come in GPU memory: read them
                                                  through dlpack (``InferenceRequest`` has no
                                                  ``preferred_memory`` argument either)
    ``MetricFamily``      no      yes     yes     no per-operator metrics
    ``TritonError`` code  no      no      yes     a bad request is answered as a server error
                                                  (``INTERNAL``); its message says "bad request"
    ====================  ======  ======  ======  =================================================

    Read from the python_backend branches r22.12, r23.05 and r24.10; the error codes came in
    r23.09 (``TritonError(message, code)`` with ``TritonError.INVALID_ARG`` & co), r22.12 and
    r23.05 bind ``TritonError(message)`` and ``message()`` alone.
    """

    logger: bool
    preferred_memory: bool
    custom_metrics: bool
    error_codes: bool

    @classmethod
    def of(cls, pb: Any) -> PythonBackendApi:
        """The features ``pb`` (``triton_python_backend_utils``, or a stand-in) offers."""
        return cls(
            logger=hasattr(pb, "Logger"),
            preferred_memory=hasattr(pb, "PreferredMemory")
            and hasattr(pb, "TRITONSERVER_MEMORY_CPU"),
            custom_metrics=hasattr(pb, "MetricFamily"),
            error_codes=hasattr(getattr(pb, "TritonError", None), "INVALID_ARG"),
        )

    def missing(self) -> list[str]:
        """The features this release lacks, by name."""
        return [name for name, present in vars(self).items() if not present]


# -- the seam to Triton ----------------------------------------------------------------------
class TritonApi:
    """The few things the pipeline model does with ``triton_python_backend_utils``, in the
    form the release's python backend offers (:class:`PythonBackendApi`)."""

    def __init__(self, pb: Any) -> None:
        self.pb = pb
        self.features = PythonBackendApi.of(pb)

    def input_array(self, request: Any, name: str) -> np.ndarray | None:
        tensor = self.pb.get_input_tensor_by_name(request, name)
        return None if tensor is None else self.to_numpy(tensor)

    def to_numpy(self, tensor: Any) -> np.ndarray:
        """A Triton tensor as a host array: ``as_numpy`` on CPU, dlpack for GPU memory."""
        if tensor.is_cpu():
            return tensor.as_numpy()
        try:
            import torch.utils.dlpack
        except ImportError as error:
            raise BlsError(
                "a model returned a tensor in GPU memory and torch, needed to copy it to the "
                f"host through dlpack, is not installed ({error})"
            ) from None
        return torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).cpu().numpy()

    def infer(self, model_name: str, inputs: dict[str, np.ndarray],
              output_names: Sequence[str]) -> list[np.ndarray]:
        """One BLS request; its outputs in ``output_names`` order."""
        pb = self.pb
        options = {}
        if self.features.preferred_memory:  # ask for host memory; dlpack covers the rest
            options["preferred_memory"] = pb.PreferredMemory(pb.TRITONSERVER_MEMORY_CPU, 0)
        request = pb.InferenceRequest(
            model_name=model_name,
            requested_output_names=list(output_names),
            inputs=[pb.Tensor(name, np.ascontiguousarray(a)) for name, a in inputs.items()],
            **options,
        )
        response = request.exec()
        if response.has_error():
            error = response.error()
            unavailable = (self.features.error_codes
                           and error.code() == pb.TritonError.UNAVAILABLE)
            raise BlsError(f"model {model_name!r}: {error.message()}", unavailable=unavailable)
        arrays = []
        for name in output_names:
            tensor = pb.get_output_tensor_by_name(response, name)
            if tensor is None:
                raise BlsError(f"model {model_name!r} returned no output {name!r}")
            arrays.append(self.to_numpy(tensor))
        return arrays

    def response(self, outputs: dict[str, np.ndarray]) -> Any:
        """A response of ``outputs`` (the tensor makes a non-contiguous array contiguous)."""
        tensor = self.pb.Tensor
        return self.pb.InferenceResponse(output_tensors=[
            tensor(name, array) for name, array in outputs.items()])

    def error_response(self, message: str, *, bad_request: bool = False,
                       unavailable: bool = False) -> Any:
        """An error response; ``bad_request`` makes it the client's fault (gRPC
        ``INVALID_ARGUMENT``, HTTP 400), ``unavailable`` a refusal to retry (``UNAVAILABLE``,
        503), instead of the server's fault (``INTERNAL``, 500) where the release has error
        codes; before them every error is the server's."""
        error = self.pb.TritonError
        if self.features.error_codes and (bad_request or unavailable):
            code = error.INVALID_ARG if bad_request else error.UNAVAILABLE
            return self.pb.InferenceResponse(output_tensors=[], error=error(message, code))
        return self.pb.InferenceResponse(output_tensors=[], error=error(message))

    def log_warning(self, message: str) -> None:
        if self.features.logger:
            self.pb.Logger.log_warn(message)
        else:
            print(message, file=sys.stderr)


# -- model operators: BLS, or ONNX Runtime in this process ---------------------------------
IN_PROCESS_PARAMETER = "in_process_models"
"""The pipeline model's config parameter naming the model operators it runs itself: a JSON
object, model name → its ONNX file relative to the model repository."""


class ModelCalls:
    """One model call for a batch of rows: in this process where a session is open, else BLS.

    Why in process: on the CPU base the ``onnxruntime`` backend is itself a python backend, so a
    BLS call is a second stub process and two shared-memory round trips, which cost more CPU
    than these models' compute. The models stay in the repository for clients to call.
    """

    def __init__(self, api: TritonApi, sessions: dict[str, Any] | None = None) -> None:
        self.api = api
        self.sessions = {} if sessions is None else sessions

    def __call__(self, target: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        session = self.sessions.get(target.model_name)
        if session is None:
            return bls_call(self.api, target, inputs)
        try:
            return session.run(list(target.output_names), inputs)
        except Exception as error:  # noqa: BLE001 - reported like a failed BLS request
            raise BlsError(f"model {target.model_name!r} (in process): {error}") from None


def bls_call(api: TritonApi, target: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """One BLS request to ``target``'s model, in the shapes its config declares: a tensor with
    only the batch axis (``target.reshaped``) travels as ``[batch, 1]`` (Triton reshapes it
    to ``[batch]`` for the model, and its outputs back)."""
    reshaped = target.reshaped
    if not reshaped:
        return api.infer(target.model_name, inputs, target.output_names)
    sent = {name: array.reshape(len(array), 1) if name in reshaped else array
            for name, array in inputs.items()}
    outputs = api.infer(target.model_name, sent, target.output_names)
    return [output.reshape(len(output)) if name in reshaped else output
            for name, output in zip(target.output_names, outputs)]


HEAVY_RUN_S = 0.01
"""A model whose example runs longer than this (on the half of the cores a session gets first)
is compute-bound: its session is opened again with every core of its instance. Measured on
BERT-base, 2 CPUs: one thread 20 rows/s, two 32; the small models of the examples run in well
under a millisecond and stay on one thread, which costs them less CPU per row."""


def open_sessions(repository: Path, parameter: str | None, instances: int, api: TritonApi,
                  examples: dict[str, dict[str, np.ndarray]] | None = None) -> dict[str, Any]:
    """ONNX Runtime sessions for the models ``parameter`` names; ``{}`` without onnxruntime.

    Each session with an example runs it once before the model is ready: ONNX Runtime plans
    and allocates on a session's first run, which made the first request after ready several
    times slower than the next ones; and how long that run took says whether the model is
    heavy enough for every core (:data:`HEAVY_RUN_S`).
    """
    models = json.loads(parameter) if parameter else {}
    if not models:
        return {}
    try:
        import onnxruntime as ort
    except ImportError as error:
        api.log_warning(f"model operators {sorted(models)} go through BLS: onnxruntime cannot "
                        f"be imported in the pipeline model's environment ({error})")
        return {}
    sessions = {}
    for name, path in models.items():
        session = _session(ort, repository / path, instances, wide=False)
        feeds = (examples or {}).get(name)
        if feeds is not None and _warm(session, feeds, api, name) > HEAVY_RUN_S and (
                _threads(instances, wide=True) > _threads(instances, wide=False)):
            session = _session(ort, repository / path, instances, wide=True)
            _warm(session, feeds, api, name)
        sessions[name] = session
    return sessions


def _session(ort: Any, path: Path, instances: int, wide: bool) -> Any:
    return ort.InferenceSession(str(path), sess_options=cpu_session_options(ort, instances, wide),
                                providers=["CPUExecutionProvider"])


def _warm(session: Any, feeds: dict[str, np.ndarray], api: TritonApi, name: str) -> float:
    """One run on the example: its seconds (0 where it failed, which is only logged: requests
    would fail the same way, with their own error)."""
    started = time.perf_counter()
    try:
        session.run(None, feeds)
    except Exception as error:  # noqa: BLE001 - see above
        api.log_warning(f"model operator {name!r}: warm-up run failed: {error}")
        return 0.0
    return time.perf_counter() - started


def _threads(instances: int, wide: bool) -> int:
    return max(1, (os.cpu_count() or 1) // ((1 if wide else 2) * max(1, instances)))


def cpu_session_options(ort: Any, instances: int, wide: bool = False) -> Any:
    """No spinning threads, and half the cores per instance for each model run (``wide``: all
    of them, for a heavy model, :data:`HEAVY_RUN_S`).

    Measured on 2 cores: spinning intra-op threads burn the CPU that the server, the stubs and
    a local client need, and one thread per run costs less CPU per row than two on these
    small models. The other half of the cores is left to Triton's own processes.
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = _threads(instances, wide)
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


class BatchingRunner:
    """Runs model operators, one model call for the rows whose non-batch shapes agree."""

    def __init__(self, call: Callable[[Any, dict[str, np.ndarray]], list[np.ndarray]]) -> None:
        self.call = call

    def infer(self, op: Any, rows: Sequence[tuple[np.ndarray, ...]]) -> list[tuple]:
        target = op.served
        if target.max_batch_size == 0:  # a model that must see one row at a time
            return [tuple(self.call(target, dict(zip(target.input_names, row)))) for row in rows]
        if getattr(op, "pad_values", None) and len(rows) > 1:
            return self._padded(op, rows)
        if len(rows) == 1:  # a lone request: no grouping, no merging, no splitting
            (row,) = rows
            _check_row_size(row[0].shape[0], target.max_batch_size, op.name)
            return [tuple(self.call(target, dict(zip(target.input_names, row))))]
        results: list[Any] = [None] * len(rows)
        groups: dict[tuple, list[int]] = {}
        for index, row in enumerate(rows):
            key = tuple([(a.shape[1:], a.dtype) for a in row])
            groups.setdefault(key, []).append(index)
        for members in groups.values():
            sizes = [rows[i][0].shape[0] for i in members]
            for chunk in _chunks(members, sizes, target.max_batch_size, op.name):
                merged = {
                    name: rows[chunk[0]][k] if len(chunk) == 1 else
                    np.concatenate([rows[i][k] for i in chunk])
                    for k, name in enumerate(target.input_names)
                }
                outputs = self.call(target, merged)
                for index, row_outputs in zip(chunk, _split_rows(outputs, rows, chunk)):
                    results[index] = row_outputs
        return results


    def _padded(self, op: Any, rows: Sequence[tuple[np.ndarray, ...]]) -> list[tuple]:
        """Rows whose fixed axes agree in one call, padded to the longest along the varying
        ones, and each row's outputs cut back to its own lengths (the operator pads: its code
        travels in ``pipe.pickle``)."""
        target = op.served
        results: list[Any] = [None] * len(rows)
        groups: dict[tuple, list[int]] = {}
        for index, row in enumerate(rows):
            groups.setdefault(op.pad_key(row), []).append(index)
        for members in groups.values():
            for index in members:
                _check_row_size(rows[index][0].shape[0], target.max_batch_size, op.name)
            grouped = [rows[i] for i in members]
            for positions in op.pad_chunks(grouped, target.max_batch_size):
                chunk = [members[p] for p in positions]
                merged, lengths = op.pad([rows[i] for i in chunk])
                answered = self.call(target, dict(zip(target.input_names, merged)))
                cut = op.cut(answered, [rows[i][0].shape[0] for i in chunk], lengths)
                for index, row_outputs in zip(chunk, cut):
                    results[index] = row_outputs
        return results


def _split_rows(outputs: Sequence[np.ndarray], rows: Sequence[tuple],
                chunk: list[int]) -> list[tuple]:
    """The outputs of one model call, back into one tuple of arrays per row."""
    if all(rows[i][0].shape[0] == 1 for i in chunk):  # the usual case: slicing beats np.split
        return [tuple(output[p:p + 1] for output in outputs) for p in range(len(chunk))]
    bounds = np.cumsum([rows[i][0].shape[0] for i in chunk])[:-1]
    parts = [np.split(output, bounds) for output in outputs]
    return [tuple(part[p] for part in parts) for p in range(len(chunk))]


def _chunks(members: list[int], sizes: list[int], limit: int, name: str) -> list[list[int]]:
    """Consecutive rows whose batch sizes add up to at most the model's ``max_batch_size``."""
    chunks: list[list[int]] = []
    total = 0
    for index, size in zip(members, sizes):
        _check_row_size(size, limit, name)
        if not chunks or total + size > limit:
            chunks.append([])
            total = 0
        chunks[-1].append(index)
        total += size
    return chunks


def _check_row_size(size: int, limit: int, name: str) -> None:
    if size > limit:
        raise BlsError(
            f"model operator {name!r}: one row has batch size {size}, more than the "
            f"model's max_batch_size {limit}"
        )


# -- per-operator metrics --------------------------------------------------------------------
class OperatorMetrics:
    """How long each operator of the served pipeline ran, and on how many rows: Triton metrics.

    Counters on the server's metrics endpoint, labelled ``model``, ``version`` and
    ``operator`` (as errors name it): ``triton_builder_operator_duration_us``, the wall time in
    the operator (its model calls included), and ``triton_builder_operator_rows``. Triton's own
    metrics end at the pipeline model's execution; these say which operator its time goes to,
    and, over rows, what one row costs where batching amortises it and where it does not.
    ``triton_builder_operator_rejected`` counts the calls an operator refused as bad input
    (answered ``INVALID_ARGUMENT``), ``triton_builder_operator_failures`` those it failed
    (``INTERNAL``): an alert on failures is not woken by clients sending bad input.

    Every increment of a custom metric is a message from the stub to the server, so ``times``
    accumulates here (under ``lock``, held by ``execute``) and a thread of its own sends it
    every ``interval`` seconds, whether requests come or not, and once more when the model
    unloads. Releases before 23.05 have no custom metrics: :meth:`create` then returns ``None``.
    """

    DURATION = "triton_builder_operator_duration_us"
    ROWS = "triton_builder_operator_rows"
    REJECTED = "triton_builder_operator_rejected"
    FAILURES = "triton_builder_operator_failures"

    def __init__(self, api: TritonApi, labels: dict[str, str], operators: Sequence[str],
                 interval: float = 1.0) -> None:
        pb = api.pb
        counter = pb.MetricFamily.COUNTER
        self._families = (
            pb.MetricFamily(name=self.DURATION, kind=counter,
                            description="Wall time in each operator of a served pipeline"),
            pb.MetricFamily(name=self.ROWS, kind=counter,
                            description="Rows each operator of a served pipeline ran on"),
            pb.MetricFamily(name=self.REJECTED, kind=counter,
                            description="Calls an operator refused as bad input"),
            pb.MetricFamily(name=self.FAILURES, kind=counter,
                            description="Calls an operator failed (not bad input)"))
        self._metrics = [tuple(family.Metric(labels={**labels, "operator": operator})
                               for family in self._families) for operator in operators]
        self.times: list[list[float]] = [[0.0, 0, 0, 0] for _ in operators]
        """``[seconds, rows, rejected, failed]`` per operator, not yet sent (the executor adds
        to it)."""
        self.lock = threading.Lock()
        self.api, self.interval = api, interval
        self._stopped = threading.Event()
        self._sender = threading.Thread(target=self._send_every_interval, daemon=True,
                                        name="triton-builder-operator-metrics")
        self._sender.start()

    @classmethod
    def create(cls, api: TritonApi, model: str, version: str,
               operators: Sequence[str]) -> OperatorMetrics | None:
        if not api.features.custom_metrics:
            return None
        try:
            return cls(api, {"model": model, "version": version}, operators)
        except Exception as error:  # noqa: BLE001 - e.g. the server runs without metrics
            api.log_warning(f"no per-operator metrics: {error}")
            return None

    def send(self) -> None:
        """Add what was measured since the last send to the server's counters."""
        with self.lock:
            pending = [(metrics, (spent[0] * 1e6, *spent[1:]))
                       for metrics, spent in zip(self._metrics, self.times) if spent[1]]
            for spent in self.times:
                spent[:] = [0.0, 0, 0, 0]
        for metrics, amounts in pending:
            for metric, amount in zip(metrics, amounts):
                if amount:
                    metric.increment(amount)

    def close(self) -> None:
        """Stop the thread, send what is left, then release the metrics before their families
        (as Triton asks)."""
        self._stopped.set()
        self._sender.join()
        self.send()
        self._metrics.clear()
        self._families = ()

    def _send_every_interval(self) -> None:
        while not self._stopped.wait(self.interval):
            try:
                self.send()
            except Exception as error:  # noqa: BLE001 - the thread stops, serving goes on
                self.api.log_warning(f"per-operator metrics stopped: {error}")
                return


# -- loading the pipeline --------------------------------------------------------------------
def check_versions(record: dict[str, Any]) -> list[str]:
    """Compare the versions ``pipe.pickle`` was written with to this Python; return warnings.

    Raises :class:`PipelineLoadError` for what cannot work: another Python minor version
    (pickled code objects are version specific), or a library that is not installed.
    """
    built = record.get("python", "?")
    here = platform.python_version()
    if built.split(".")[:2] != here.split(".")[:2] or (
        record.get("implementation", sys.implementation.name) != sys.implementation.name
    ):
        raise PipelineLoadError(
            f"{PIPELINE_FILE} was written by Python {built} "
            f"({record.get('implementation', '?')}) and this server runs Python {here} "
            f"({sys.implementation.name}); pickled code loads only in the same Python minor "
            "version: build the pipeline with the Python of the serving environment"
        )
    warnings = []
    missing = []
    for distribution, version in sorted(record.get("libraries", {}).items()):
        try:
            installed = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            missing.append(f"{distribution}=={version}")
            continue
        if installed != version:
            warnings.append(
                f"{PIPELINE_FILE} was written with {distribution} {version}; this server has "
                f"{installed}"
            )
    if missing:
        raise PipelineLoadError(
            f"{PIPELINE_FILE} needs packages that are not installed in the serving "
            f"environment: {', '.join(missing)} (the versions it was written with)"
        )
    return warnings


def load_pipeline(directory: Path) -> tuple[Any, list[str]]:
    """Check versions, then unpickle the pipeline in ``directory``; return it and warnings."""
    directory = Path(directory)
    versions = directory / VERSIONS_FILE
    if not versions.exists():
        raise PipelineLoadError(f"{versions} is missing: rebuild the model repository")
    record = json.loads(versions.read_text())
    warnings = check_versions(record)
    try:
        with open(directory / PIPELINE_FILE, "rb") as file:
            pipeline = pickle.load(file)
    except Exception as error:  # noqa: BLE001 - explain with the recorded versions
        raise PipelineLoadError(
            f"cannot load {directory / PIPELINE_FILE}: {type(error).__name__}: {error} "
            f"(written by Python {record.get('python')} with {record.get('libraries')})"
        ) from error
    return pipeline, warnings


# -- the size of a request -------------------------------------------------------------------
MAX_REQUEST_PARAMETER = "max_request_bytes"
"""The pipeline model's config parameter: the largest request it serves, in bytes (written by
:mod:`builder.repository.request_limit`)."""
MAX_REQUEST_ENV = "TRITON_BUILDER_MAX_REQUEST_BYTES"
"""Sets the limit at run (``docker run -e``), over the config's."""


class RequestTooLargeError(ValueError):
    """A request's inputs are more bytes than the pipeline serves: the client's mistake."""


def tensor_bytes(array: np.ndarray) -> int:
    """The bytes of a tensor as it travels: its data, and for BYTES each element's 4-byte
    length prefix."""
    if array.dtype != object:
        return array.nbytes
    return sum(len(v) if isinstance(v, (bytes, bytearray)) else len(str(v).encode())
               for v in array.flat) + 4 * array.size


def request_limit(parameters: dict[str, Any], environ: dict[str, str],
                  api: TritonApi) -> int | None:
    """The limit: :data:`MAX_REQUEST_ENV` where set to a positive integer, else the config's
    parameter, else none (a repository written before limits existed)."""
    configured = parameters.get(MAX_REQUEST_PARAMETER, {}).get("string_value")
    for source, value in ((MAX_REQUEST_ENV, environ.get(MAX_REQUEST_ENV)),
                          (MAX_REQUEST_PARAMETER, configured)):
        if value in (None, ""):
            continue
        if str(value).isdigit() and int(value) > 0:
            return int(value)
        api.log_warning(f"{source}={value!r} is not a positive number of bytes: ignored")
    return None


def check_shared_memory(limit: int | None, api: TritonApi, path: str = "/dev/shm") -> None:
    """Warn where ``path`` is too small for requests at the limit: the python backend copies
    them there first, and fails them as server faults when it cannot."""
    if limit is None:
        return
    try:
        stat = os.statvfs(path)
    except OSError:
        return
    total = stat.f_frsize * stat.f_blocks
    if total < 2 * limit:
        api.log_warning(
            f"{path} holds {total / 2**20:.0f} MiB, too little for requests near the "
            f"{limit / 2**20:.3g} MiB limit: those fail in the python backend (INTERNAL, "
            f"'Failed to increase the shared memory pool size'). Give the container "
            f"--shm-size={-(-4 * limit // 2**20)}m, or lower {MAX_REQUEST_ENV}")


def _check_size(arrays: dict[str, np.ndarray], limit: int) -> None:
    size = sum(tensor_bytes(array) for array in arrays.values())
    if size > limit:
        raise RequestTooLargeError(
            f"the request's inputs are {size} bytes, over this pipeline's limit of {limit} "
            f"bytes ({limit / 2**20:.3g} MiB; max_request_bytes at build, {MAX_REQUEST_ENV} at "
            f"run)")


# -- requests <-> calls ----------------------------------------------------------------------
def decode_request(api: TritonApi, request: Any, inputs: dict[str, Any],
                   limit: int | None = None) -> list[tuple]:
    """A request's input tensors → one tuple of Python input values per call; a request over
    ``limit`` bytes is refused before any of it is decoded."""
    arrays = {}
    for name in inputs:
        array = api.input_array(request, name)
        if array is None:
            raise ValueError(f"input {name!r} is missing")
        arrays[name] = array
    if limit is not None:
        _check_size(arrays, limit)
    columns = []
    size = None
    for (name, spec), array in zip(inputs.items(), arrays.values()):
        try:
            values = spec.decode_batch(array)
        except Exception as error:  # noqa: BLE001 - a value the signature cannot read
            raise ValueError(f"input {name!r}: {error}") from None
        if size is not None and len(values) != size:
            raise ValueError(f"input {name!r} has batch size {len(values)}, others {size}")
        size = len(values)
        columns.append(values)
    return list(zip(*columns))  # equal lengths: checked above


def serve(pipeline: Any, api: TritonApi, requests: Sequence[Any],
          times: list[list[float]] | None = None, limit: int | None = None) -> list[Any]:
    """Run a dynamic batch of requests through the pipeline; one response per request.

    ``times`` accumulates each operator's time, rows, refusals and failures (see
    :class:`OperatorMetrics`); a request over ``limit`` bytes is refused. A call that failed
    because an operator rejected its input (``InputError``) is the client's mistake
    (``INVALID_ARGUMENT``); any other failure the server's (``INTERNAL``)."""
    signature = pipeline.signature()
    responses: list[Any] = [None] * len(requests)
    calls: list[tuple] = []
    spans: list[tuple[int, int, int]] = []
    for index, request in enumerate(requests):
        try:
            values = decode_request(api, request, signature.inputs, limit)
        except Exception as error:  # noqa: BLE001 - this request's error response
            responses[index] = api.error_response(f"bad request: {error}", bad_request=True)
            continue
        spans.append((index, len(calls), len(values)))
        calls.extend(values)
    try:
        results = pipeline.run(calls, times)
    except Exception as error:  # noqa: BLE001 - a bug, not one call's failure: tell everyone
        message = f"pipeline failed: {type(error).__name__}: {error}"
        return [r if r is not None else api.error_response(message) for r in responses]
    for index, start, count in spans:
        own = results[start:start + count]
        failed = next((r for r in own if not r.ok), None)
        if failed is not None:
            where = f" (call {own.index(failed)} of the request's batch)" if count > 1 else ""
            responses[index] = api.error_response(
                f"{failed.error}{where}", bad_request=_input_error(failed.error),
                unavailable=getattr(failed.error.__cause__, "unavailable", False))
            continue
        try:
            outputs = {
                name: spec.encode_batch([r.outputs[name] for r in own])
                for name, spec in signature.outputs.items()
            }
        except Exception as error:  # noqa: BLE001 - an output that does not fit its type
            responses[index] = api.error_response(f"output does not fit its type: {error}")
            continue
        responses[index] = api.response(outputs)
    return responses


def _input_error(error: BaseException) -> bool:
    """Whether a call's error is ``builder.errors.InputError``, found by name along its classes:
    this module imports nothing from ``builder``."""
    return any(cls.__name__ == "InputError" and cls.__module__ == "builder.errors"
               for cls in type(error).__mro__)


class TritonPythonModel:
    """The python backend's entry point for the pipeline model."""

    def initialize(self, args: dict[str, Any]) -> None:
        self.api = TritonApi(pb_utils)
        directory = Path(args["model_repository"]) / args["model_version"]
        self.pipeline, warnings = load_pipeline(directory)
        for warning in warnings:
            self.api.log_warning(warning)
        config = json.loads(args["model_config"])
        signature = self.pipeline.signature()
        expected = {t["name"] for t in config["input"]}, {t["name"] for t in config["output"]}
        if expected != (set(signature.inputs), set(signature.outputs)):
            raise PipelineLoadError(
                f"config.pbtxt declares inputs {sorted(expected[0])} and outputs "
                f"{sorted(expected[1])}, {PIPELINE_FILE} has {sorted(signature.inputs)} and "
                f"{sorted(signature.outputs)}: rebuild the model repository"
            )
        parameters = config.get("parameters", {})
        parameter = parameters.get(IN_PROCESS_PARAMETER, {}).get("string_value")
        instances = sum(int(g.get("count", 1)) for g in config.get("instance_group", [])) or 1
        examples = {op.name: dict(zip(op.served.input_names, op.warmup_inputs))
                    for op in self.pipeline.model_ops()
                    if op.served is not None and getattr(op, "warmup_inputs", None)}
        self.sessions = open_sessions(directory.parent.parent, parameter, instances, self.api,
                                      examples)
        runner = BatchingRunner(ModelCalls(self.api, self.sessions))
        for op in self.pipeline.model_ops():
            if op.served is None:
                raise PipelineLoadError(f"model operator {op.name!r} has no served model")
            op.bind(runner)
        self.metrics = OperatorMetrics.create(
            self.api, args["model_name"], args["model_version"],
            [node.label for node in self.pipeline.plan.nodes])
        self.in_flight = drain.InFlight() if drain.supervised() else None
        self.limit = request_limit(parameters, dict(os.environ), self.api)
        check_shared_memory(self.limit, self.api)

    def execute(self, requests: list) -> list:
        """Serve a dynamic batch; while the replica closes, refuse it (UNAVAILABLE) instead.
        The requests are counted first and checked second (:class:`drain.InFlight`)."""
        if self.in_flight is None:
            return self._serve(requests)
        self.in_flight.add(len(requests))
        try:
            if drain.closing():
                return [self.api.error_response(STOPPING, unavailable=True) for _ in requests]
            return self._serve(requests)
        finally:
            self.in_flight.add(-len(requests))

    def _serve(self, requests: list) -> list:
        if self.metrics is None:
            return serve(self.pipeline, self.api, requests, limit=self.limit)
        with self.metrics.lock:
            return serve(self.pipeline, self.api, requests, self.metrics.times, self.limit)

    def finalize(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.in_flight is not None:
            self.in_flight.close()
