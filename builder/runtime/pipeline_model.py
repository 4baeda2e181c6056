"""The pipeline model: Triton's python backend running a pipeline's DAG.

Copied into ``<pipeline>/1/model.py`` beside ``pipe.pickle`` (the pipeline, user code captured
by value) and ``pipe.versions.json`` (the Python and library versions it was pickled with).

``execute`` receives a dynamic batch of requests, each holding a batch of calls (one per element
of the batch dimension). It decodes every call's typed input tensors into Python values, runs all
calls through the DAG together — Python operators in process, model operators in one model call
for the rows of all calls where their shapes agree (:mod:`model_batching`) — and answers each
request with typed output tensors, or with an error response when one of its calls failed; the
other requests still get theirs. A model call is a BLS request, or, for the ONNX models the
config's ``in_process_models`` parameter names (CPU targets), an ONNX Runtime session in this
process. Each operator's time and rows go to the metrics endpoint (:class:`OperatorMetrics`).

Everything this module needs from ``triton_python_backend_utils`` goes through
:class:`TritonApi`, so the logic here runs, and is tested, without Triton. It imports nothing
from ``builder``: the serving environment need not have it installed.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import platform
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton: unit tests pass a stand-in to TritonPythonModel
    pb_utils = None
if TYPE_CHECKING:  # the copies beside model.py are these modules
    from . import drain, model_batching, model_calls, operator_metrics  # noqa: I001
    from . import request_size, stream_serving, tracing, warm_up
else:
    try:  # in Triton: beside model.py, which the stub imports as the module "<version>.model"
        from . import triton_builder_drain as drain
        from . import triton_builder_model_batching as model_batching
        from . import triton_builder_model_calls as model_calls
        from . import triton_builder_operator_metrics as operator_metrics
        from . import triton_builder_request_size as request_size
        from . import triton_builder_stream_serving as stream_serving
        from . import triton_builder_tracing as tracing
        from . import triton_builder_warm_up as warm_up
    except ImportError:  # in the builder's package: builder.runtime.drain & co
        from . import drain, model_batching, model_calls, operator_metrics  # noqa: I001
        from . import request_size, stream_serving, tracing, warm_up

BlsError = model_calls.BlsError

PIPELINE_FILE = "pipe.pickle"
VERSIONS_FILE = "pipe.versions.json"


class PipelineLoadError(RuntimeError):
    """``pipe.pickle`` cannot be loaded here (Python or library mismatch, missing package)."""


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
    ``is_cancelled``      no      no      yes     a stream runs to its end after its client
                                                  has gone (``request.is_cancelled``, r23.10)
    ====================  ======  ======  ======  =================================================

    Read from the python_backend branches r22.12, r23.05 and r24.10; the error codes came in
    r23.09 (``TritonError(message, code)`` with ``TritonError.INVALID_ARG`` & co), r22.12 and
    r23.05 bind ``TritonError(message)`` and ``message()`` alone.
    """

    logger: bool
    preferred_memory: bool
    custom_metrics: bool
    error_codes: bool
    cancellation: bool

    @classmethod
    def of(cls, pb: Any) -> PythonBackendApi:
        """The features ``pb`` (``triton_python_backend_utils``, or a stand-in) offers."""
        return cls(
            logger=hasattr(pb, "Logger"),
            preferred_memory=hasattr(pb, "PreferredMemory")
            and hasattr(pb, "TRITONSERVER_MEMORY_CPU"),
            custom_metrics=hasattr(pb, "MetricFamily"),
            error_codes=hasattr(getattr(pb, "TritonError", None), "INVALID_ARG"),
            cancellation=hasattr(getattr(pb, "InferenceRequest", None), "is_cancelled"),
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

    def error_message(self, response: Any) -> str | None:
        """The message of an error response; ``None`` for an answer."""
        return response.error().message() if response.has_error() else None

    def sender(self, request: Any) -> Any:
        """The response sender of a streamed request (a decoupled model's)."""
        return request.get_response_sender()

    def send(self, sender: Any, response: Any = None, *, final: bool = False) -> None:
        """Send one of a stream's responses; ``final`` ends it."""
        flags = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        sender.send(response, flags=flags)

    def parameters(self, request: Any) -> dict[str, Any]:
        """A request's parameters (gRPC's ``parameters`` map, the ``parameters`` object of
        HTTP's generate body); none on releases that do not bind them (r22.12)."""
        read = getattr(request, "parameters", None)
        return json.loads(read() or "{}") if callable(read) else {}

    def cancelled(self, sender: Any) -> bool:
        """Whether the client has cancelled the stream (never, on releases before r23.10)."""
        return self.features.cancellation and sender.is_cancelled()

    def log_warning(self, message: str) -> None:
        if self.features.logger:
            self.pb.Logger.log_warn(message)
        else:
            print(message, file=sys.stderr)

    def log_info(self, message: str) -> None:
        if self.features.logger:
            self.pb.Logger.log_info(message)
        else:
            print(message, file=sys.stderr)


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
        request_size.check_size(arrays, limit)
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
          times: Sequence[operator_metrics.OperatorTimes] | None = None,
          limit: int | None = None, trace: tracing.BatchTrace | None = None) -> list[Any]:
    """Run a dynamic batch of requests through the pipeline; one response per request.

    ``times`` accumulates each operator's time, rows, refusals and failures (see
    :class:`OperatorMetrics`); a request over ``limit`` bytes is refused; ``trace`` records
    which calls are each request's, and what each operator and model call did with them. A
    call that failed because an operator rejected its input (``InputError``) is the client's
    mistake (``INVALID_ARGUMENT``); any other failure the server's (``INTERNAL``)."""
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
        if trace is None:
            results = pipeline.run(calls, times)
        else:
            trace.requests = spans
            results = pipeline.run(calls, times, trace=trace)
    except Exception as error:  # noqa: BLE001 - a bug, not one call's failure: tell everyone
        message = f"pipeline failed: {type(error).__name__}: {error}"
        return [r if r is not None else api.error_response(message) for r in responses]
    for index, start, count in spans:
        own = results[start:start + count]
        failed = next((r for r in own if not r.ok), None)
        if failed is not None:
            where = f" (call {own.index(failed)} of the request's batch)" if count > 1 else ""
            responses[index] = api.error_response(f"{failed.error}{where}",
                                                  **failure_kind(failed.error))
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


def failure_kind(error: BaseException) -> dict[str, bool]:
    """How a failed call is answered: ``bad_request`` where an operator rejected its input
    (``builder.errors.InputError``, found by name along its classes: this module imports
    nothing from ``builder``), ``unavailable`` where a model it called refused the request for
    now; else neither, the server's fault."""
    return {"bad_request": any(cls.__name__ == "InputError" and cls.__module__ == "builder.errors"
                               for cls in type(error).__mro__),
            "unavailable": getattr(error.__cause__, "unavailable", False)}


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
        parameter = parameters.get(model_calls.IN_PROCESS_PARAMETER, {}).get("string_value")
        instances = sum(int(g.get("count", 1)) for g in config.get("instance_group", [])) or 1
        examples = {op.name: dict(zip(op.served.input_names, op.warmup_inputs))
                    for op in self.pipeline.model_ops()
                    if op.served is not None and getattr(op, "warmup_inputs", None)}
        self.sessions = model_calls.open_sessions(directory.parent.parent, parameter, instances,
                                                  self.api, examples)
        calls = model_calls.ModelCalls(self.api, self.sessions)
        self.tracing = tracing.PipelineTracing.create(
            self.api, args["model_name"], dict(os.environ),
            labels=[node.label for node in self.pipeline.plan.nodes], route=calls.route)
        warming = model_batching.BatchingRunner(warm_up.InProcessCalls(calls, self.sessions))
        for op in self.pipeline.model_ops():
            if op.served is None:
                raise PipelineLoadError(f"model operator {op.name!r} has no served model")
            op.bind(warming)
        self.warming = warm_up.wanted(dict(os.environ))
        self.warm_up = (warm_up.warm_up(self.pipeline, getattr(self.pipeline, "examples", ()))
                        if self.warming else warm_up.WarmUpReport())
        self.runner = model_batching.BatchingRunner(
            calls, observe=None if self.tracing is None else self.tracing.model_call)
        self.warm_ups = len(config.get("model_warmup", []))  # every execute before ready
        self.model_name = args["model_name"]
        if not self.warm_ups:
            self._warmed()
        self.metrics = operator_metrics.OperatorMetrics.create(
            self.api, args["model_name"], args["model_version"],
            [node.label for node in self.pipeline.plan.nodes])
        self.in_flight = drain.InFlight() if drain.supervised() else None
        self.streaming_threads: set[threading.Thread] = set()
        self.stream_slots = threading.BoundedSemaphore(stream_serving.STREAM_BATCHES)
        self.stream_loop = stream_serving.StreamLoop() if self.pipeline.admits_streams else None
        self.limit = request_size.request_limit(parameters, dict(os.environ), self.api)
        request_size.check_shared_memory(self.limit, self.api)

    def execute(self, requests: list) -> list | None:
        """Serve a dynamic batch (while the replica closes, refuse it: UNAVAILABLE), counted
        first and checked second (:class:`drain.InFlight`); a streaming pipeline answers
        through its senders (:meth:`_stream`); before ready, Triton's warm-up samples."""
        if self.warm_ups:
            return self._warm_up_sample(requests)
        if self.pipeline.streaming is not None:
            self._stream(requests)
            return None
        if self.in_flight is None:
            return self._serve(requests)
        self.in_flight.add(len(requests))
        try:
            if drain.closing():
                return [self.api.error_response(STOPPING, unavailable=True) for _ in requests]
            return self._serve(requests)
        finally:
            self.in_flight.add(-len(requests))

    def _warm_up_sample(self, requests: list) -> list:
        """One of Triton's warm-up samples (:mod:`warm_up`), served as requests are but
        uncounted; a call stopped at a model served over BLS is answered empty."""
        self.warm_ups -= 1
        self.warm_up.samples += 1
        responses = (serve(self.pipeline, self.api, requests, limit=self.limit) if self.warming
                     else [self.api.response({}) for _ in requests])
        for index, response in enumerate(responses):
            model = warm_up.stopped_at(self.api.error_message(response))
            if model is not None:
                self.warm_up.stopped_at.add(model)
                responses[index] = self.api.response({})
        if not self.warm_ups:
            self._warmed()
        return responses

    def _warmed(self) -> None:
        """The warm-up is over: model calls go to their models, and the log says so."""
        for op in self.pipeline.model_ops():
            op.bind(self.runner)
        if self.warming:
            self.api.log_info(f"pipeline model {self.model_name!r}: {self.warm_up.describe()}")

    def _serve(self, requests: list) -> list:
        """Serve a batch, counted in the metrics and traced where they are on (each request's
        spans made once it is answered: :mod:`tracing`); the warm-up's requests, neither."""
        parameters = [self.api.parameters(request) for request in requests]
        if warm_up.marked(parameters):
            return serve(self.pipeline, self.api, requests, limit=self.limit)
        trace = None if self.tracing is None else self.tracing.begin(parameters)
        try:
            if self.metrics is None:
                responses = serve(self.pipeline, self.api, requests, limit=self.limit, trace=trace)
            else:
                with self.metrics.lock:
                    responses = serve(self.pipeline, self.api, requests, self.metrics.times,
                                      self.limit, trace)
        finally:
            if self.tracing is not None:
                self.tracing.local.batch = None
        if trace is not None and self.tracing is not None:
            self.tracing.finish(trace, [self.api.error_message(r) for r in responses],
                                time.time_ns())
        return responses

    def _stream(self, requests: list) -> None:
        """Decode the batch here, then stream it on a thread of its own and return: the
        instance takes the next batch while this one streams (a long decode does not hold
        the streams that come after it). Counted in flight until its last stream ends. At most
        ``stream_serving.STREAM_BATCHES`` batches stream at once: the next waits here, so
        requests queue in Triton again, where the queue policy (the latency budget) refuses
        what would be late to its first item."""
        self.stream_slots.acquire()
        started = False
        try:
            started = self._start_streams(requests)
        finally:
            if not started:
                self.stream_slots.release()

    def _start_streams(self, requests: list) -> bool:
        """Whether a thread now streams the batch (it releases the slot when done)."""
        self._count(len(requests))
        try:
            if self.in_flight is not None and drain.closing():
                for request in requests:
                    self.api.send(self.api.sender(request),
                                  stream_serving.stream_error(self.api, STOPPING,
                                                              unavailable=True), final=True)
                streams = None
            else:
                inputs = self.pipeline.signature().inputs
                streams = stream_serving.accept_streams(self.api, requests, lambda request: (
                    decode_request(self.api, request, inputs, self.limit)))
        except BaseException:
            self._count(-len(requests))
            raise
        if streams is None or not streams.calls:
            self._count(-len(requests))
            return False
        count = len(requests)

        def done() -> None:  # the batch's last final response is sent
            self._count(-count)
            self.stream_slots.release()

        streams.done = done
        if self.stream_loop is not None and self.stream_loop.join(streams):
            return True  # the running loop takes it between two steps
        worker = threading.Thread(target=self._run_streams, args=(streams,),
                                  name="triton-builder-streams", daemon=True)
        self.streaming_threads.add(worker)
        worker.start()
        return True

    def _run_streams(self, streams: stream_serving.Streams) -> None:
        """Stream a batch, and where streams join a running loop (:attr:`stream_loop`), the
        batches that join it until none is left."""
        times = (None if self.metrics is None
                 else operator_metrics.new_times(len(self.metrics.times)))
        loop = self.stream_loop
        arrivals = None if loop is None else functools.partial(self._arrivals, loop, times)
        running: stream_serving.Streams | None = streams
        try:
            while running is not None:
                stream_serving.run_streams(self.pipeline, self.api, running, times,
                                           failure_kind, arrivals)
                self._add_times(times)
                running = None if loop is None else loop.next_or_stop()
        except BaseException as error:
            for batch in [] if loop is None else loop.stop():  # never left waiting
                for sender in batch.senders:
                    self.api.send(sender, stream_serving.stream_error(
                        self.api, f"pipeline failed: {type(error).__name__}: {error}"),
                        final=True)
                if batch.done is not None:
                    batch.done()
            raise
        finally:
            self.streaming_threads.discard(threading.current_thread())

    def _arrivals(self, loop: stream_serving.StreamLoop,
                  times: Sequence[operator_metrics.OperatorTimes] | None,
                  ) -> list[stream_serving.Streams]:
        """The batches that joined the running loop; the times of the steps before them are
        added to the metrics first."""
        joined = loop.arrivals()
        if joined:
            self._add_times(times)
        return joined

    def _add_times(self, times: Sequence[operator_metrics.OperatorTimes] | None) -> None:
        """Add a loop's operator times to the metrics, and start counting them again."""
        if times is not None and self.metrics is not None:  # kept only with metrics
            self.metrics.add(times)

    def _count(self, requests: int) -> None:
        if self.in_flight is not None:
            self.in_flight.add(requests)

    def finalize(self) -> None:
        for worker in list(self.streaming_threads):  # the streams in flight end first
            worker.join()
        if self.tracing is not None:
            self.tracing.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.in_flight is not None:
            self.in_flight.close()
