"""Serving speed, side by side in one run: served pipeline vs eager, raw ONNX Runtime, PyTriton.

For the text-embedding and image-classification pipelines, at 1, 8 and 32 requests in flight
(gRPC clients on this machine, see :class:`LoadClient`), medians of ``--runs``:

* (a) the pipeline served by ``build_pipeline_model``'s repository on the host ``tritonserver``,
  and by the CPU image ``build_docker_image`` makes of it;
* (b) eager ``pipeline(x)`` in process, one call after another;
* (c) raw ONNX Runtime (default session) on batches of 32 and 64, with the same pre- and
  post-processing written out by hand: what the hardware does without any server;
* (d) NVIDIA PyTriton (same Triton 2.51) serving the same work as one ``@batch`` callable
  (pre-processing, one ONNX Runtime run on the batch with the session options of our pipeline
  model, post-processing), in its own process;
* beside them, a hand-written python-backend ``model.py`` doing the same work one request at a
  time (``benchmarks/handwritten_model.py``), on the same host server: what users write today.

Every served answer is compared with the in-process result. Achieved batch sizes and queue time
come from Triton's metrics; CPU per request from ``/proc`` for each process involved (client,
server, stubs). The pipeline model's overhead is its p50 at concurrency 1 minus the p50 of
calling its ONNX model directly (inputs prepared beforehand) on the same server, measured by
turns with the hand-written model's, which splits it into the work's own cost as served and the
pipeline model's. A sweep of the
pipeline model's dynamic batching settings and instance counts follows (``--no-sweep`` skips
it). The table, a PNG chart and the sweep go into ``BENCHMARKS.md``.

    python benchmarks/bench_serving.py [--requests 2000] [--runs 3] [--quick] [--no-image]
                                       [--no-sweep] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import multiprocessing
import os
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.report import BENCHMARKS, machine, publish  # noqa: E402
from builder import build_docker_image, build_pipeline_model  # noqa: E402
from builder.repository.batching import default_batching  # noqa: E402
from builder.repository.model_config import read_config, write_config  # noqa: E402
from builder.runtime.model_calls import cpu_session_options  # noqa: E402
from builder.tritonserver.host_process import TritonServer, free_ports, triton_ready  # noqa: E402
from builder.verify.equality import check_same  # noqa: E402
from pipelines import image_classification, text_embedding  # noqa: E402
from pipelines.imaging import decode_image  # noqa: E402
from tests.support.example_inputs import TEXTS, images  # noqa: E402

SECTION = "## Serving speed: served pipeline vs eager, raw ONNX Runtime and PyTriton"
COMMAND = "python benchmarks/bench_serving.py"
CHART = ROOT / "benchmarks" / "serving_throughput.png"
CONCURRENCY = (1, 8, 32)
ORT_BATCHES = (32, 64)
TOLERANCE = 1e-4
IMAGE_PREFIX = "triton-builder-bench/serving-"
SERVED = "served: host tritonserver"
EAGER = "eager pipeline(x), one at a time"
PYTRITON = "PyTriton, one @batch callable"
HANDWRITTEN = "hand-written model.py, one ONNX Runtime run per request"
HANDWRITTEN_MODEL = "handwritten"
ORT64 = "raw ONNX Runtime, batches of 64"


# -- the two workloads, and their pre/post written out for raw ONNX Runtime and PyTriton ------
@dataclass
class Workload:
    """A pipeline, its inputs, and its model operator's pre/post as plain functions.

    ``encode`` and ``finish`` take several items at once, as the pipeline's operators do when
    served: its vectorized operators (``call_batch``) see all of them together. ``by_hand``
    does one item's whole work as a hand-written ``model.py`` would: the plain functions, one
    ONNX Runtime run (``session``, its input ``names``).
    """

    key: str
    title: str
    pipeline: Any
    items: list
    model: str
    encode: Callable[[Sequence[Any]], list[tuple[np.ndarray, ...]]]
    finish: Callable[[Sequence[tuple[np.ndarray, ...]], Sequence[tuple[np.ndarray, ...]]], list]
    by_hand: Callable[[Any, Sequence[str], Any], Any]
    expected: list = field(default_factory=list)
    parallelism: int = 1

    @property
    def input_name(self) -> str:
        return self.pipeline.inputs[0]

    def items_of(self, tensor: np.ndarray) -> list:
        """A request's input tensor (``[batch, 1]``, bytes) → the pipeline's input values."""
        return [v.decode() if self.key == "text" else bytes(v) for v in tensor[:, 0]]

    def answer(self, results: Sequence[Any]) -> dict[str, np.ndarray]:
        """In-process results → the output tensors the served pipeline answers with."""
        outputs = list(self.pipeline.outputs)
        signature = self.pipeline.signature()
        columns = [results] if len(outputs) == 1 else list(zip(*results))
        answer = {}
        for name, column in zip(outputs, columns):
            if signature.outputs[name].dtype == "TYPE_STRING":
                answer[name] = np.array([[s.encode() for s in row] for row in column],
                                        dtype=np.bytes_)
            else:
                answer[name] = np.stack(column)
        return answer


def _text_workload(count: int) -> Workload:
    tokenizer = text_embedding.Tokenizer()
    items = [TEXTS[i % len(TEXTS)] + f" #{i}" for i in range(count)]

    def by_hand(session: Any, names: Sequence[str], text: str) -> np.ndarray:
        ids, mask = tokenizer(text)
        (hidden,) = session.run(None, dict(zip(names, (ids[None], mask[None]))))
        return text_embedding.mean_pool.function(hidden, mask[None])[0]

    return Workload("text", "text embedding", text_embedding.pipeline, items, "text_encoder",
                    encode=lambda texts: [tokenizer(text) for text in texts],
                    finish=lambda outputs, encoded: text_embedding.mean_pool.call_batch(
                        [(o[0], e[1]) for o, e in zip(outputs, encoded)]),
                    by_hand=by_hand)


def _image_workload(count: int) -> Workload:
    """Served with two instances of the pipeline model (``parallelism=2``): one instance runs
    the example's pure-Python PNG decoding on one core and bounds the throughput (the sweep
    measures one against two)."""
    pool = images()
    top_k = image_classification.TopK(image_classification.LABELS, k=3)

    def by_hand(session: Any, names: Sequence[str], data: bytes) -> tuple:
        pixels = image_classification.preprocess.function(decode_image(data)[None])
        (logits,) = session.run(None, {names[0]: pixels})
        return top_k(logits[0])

    return Workload("image", "image classification", image_classification.pipeline,
                    [pool[i % len(pool)] for i in range(count)], "image_classifier",
                    encode=lambda data: [(pixels,) for pixels in
                                         image_classification.preprocess.call_batch(
                                             [(decode_image(d),) for d in data])],
                    finish=lambda outputs, encoded: top_k.call_batch([(o[0],) for o in outputs]),
                    by_hand=by_hand, parallelism=2)


WORKLOADS: dict[str, Callable[[int], Workload]] = {"text": _text_workload,
                                                  "image": _image_workload}


def run_batch(session: Any, workload: Workload, items: Sequence[Any]) -> list:
    """Pre-process the items, one ONNX Runtime run for all of them, post-process them."""
    encoded = workload.encode(items)
    names = [i.name for i in session.get_inputs()]
    feeds = {name: np.stack([e[k] for e in encoded]) for k, name in enumerate(names)}
    outputs = session.run(None, feeds)
    return workload.finish([tuple(o[i] for o in outputs) for i in range(len(items))], encoded)


# -- measuring ------------------------------------------------------------------------------
@dataclass
class Measure:
    """One row at one concurrency: medians over the runs."""

    rate: float
    p50_ms: float
    p99_ms: float
    batch: dict[str, float] = field(default_factory=dict)
    queue_ms: float | None = None
    cpu_ms: dict[str, float] = field(default_factory=dict)
    operators_us: dict[str, float] = field(default_factory=dict)
    """Operator → µs of wall time per request in it, from the pipeline model's own metrics."""


def _median_measure(runs: list[Measure]) -> Measure:
    middle = sorted(runs, key=lambda m: m.rate)[len(runs) // 2]
    return Measure(statistics.median(m.rate for m in runs),
                   statistics.median(m.p50_ms for m in runs),
                   statistics.median(m.p99_ms for m in runs),
                   middle.batch, middle.queue_ms, middle.cpu_ms, middle.operators_us)


def _percentiles(latencies: Sequence[float]) -> tuple[float, float]:
    ms = np.asarray(latencies) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


async def _drive(call: Callable[[Any], Any], items: Sequence[Any], concurrency: int,
                 processes: Processes | None = None,
                 ) -> tuple[float, list[float], list, dict[str, float]]:
    """``concurrency`` workers sending ``items`` one request each; seconds, latencies, answers
    and, with ``processes``, CPU ms per request of each process over the timed part only."""
    results: list = [None] * len(items)
    latencies = [0.0] * len(items)
    indices = iter(range(len(items)))

    async def worker() -> None:
        for index in indices:
            started = time.perf_counter()
            results[index] = await call(items[index])
            latencies[index] = time.perf_counter() - started

    for item in items[:concurrency]:  # connections up, first-call costs paid
        await call(item)
    before = processes.snapshot() if processes else {}
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - started
    after = processes.snapshot() if processes else {}
    return seconds, latencies, results, _difference(after, before, len(items))


class Processes:
    """CPU time of the client and of process trees (a server and its stubs), from ``/proc``."""

    def __init__(self, roots: Sequence[int], prefix: str = "") -> None:
        self.roots = list(roots)
        self.prefix = prefix
        self.tick = os.sysconf("SC_CLK_TCK")

    def snapshot(self) -> dict[str, float]:
        times = {"client (benchmark process)": self._seconds(os.getpid())}
        children = _children_by_parent()
        stack = list(self.roots)
        while stack:
            pid = stack.pop()
            stack.extend(children.get(pid, ()))
            seconds = self._seconds(pid)
            if seconds is None:
                continue
            label = f"{self.prefix}{_label(pid)}"
            times[label] = times.get(label, 0.0) + seconds
        return times

    def _seconds(self, pid: int) -> float | None:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / self.tick


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    return children


def _label(pid: int) -> str:
    """``tritonserver``, ``stub <model>`` (the python backend's per-instance process), or comm."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    if comm.startswith("triton_python"):  # argv[1]: <repository>/<model>/<version>/<file>
        parts = Path(argv[1].decode(errors="replace")).parts if len(argv) > 1 else ()
        return f"stub {parts[-3]}" if len(parts) >= 3 and parts[-2].isdigit() else "stub"
    return comm


def _difference(after: dict[str, float], before: dict[str, float],
                requests: int) -> dict[str, float]:
    return {label: (seconds - before.get(label, 0.0)) * 1000 / requests
            for label, seconds in after.items() if seconds - before.get(label, 0.0) > 0}


def _statistics(metrics_url: str, models: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """Per model: (inferences, executions, queue µs, requests), from Triton's Prometheus metrics.

    Metrics rather than the statistics API: PyTriton restricts that API to its own clients.
    """
    from prometheus_client.parser import text_string_to_metric_families

    names = ("nv_inference_count", "nv_inference_exec_count", "nv_inference_queue_duration_us",
             "nv_inference_request_success")
    text = _metrics_text(metrics_url)
    found = {model: [0.0] * len(names) for model in models}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")  # the parser names counters so
            model = sample.labels.get("model")
            if name in names and model in found:
                found[model][names.index(name)] += sample.value
    return {model: tuple(values) for model, values in found.items()}


def _metrics_text(metrics_url: str, wait: float = 15.0) -> str:
    """Triton's metrics page; a container is ready a moment before its metrics port answers."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10) as response:
                return response.read().decode()
        except (urllib.error.URLError, ConnectionError, http.client.HTTPException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


OPERATOR_METRICS_LAG_S = 1.2
"""The pipeline model sends its operator metrics once a second: wait this long to see them."""


def _operator_counters(metrics_url: str, model: str) -> dict[str, tuple[float, float]]:
    """Operator → (µs, rows) so far, from the pipeline model's ``triton_builder_operator_*``."""
    from prometheus_client.parser import text_string_to_metric_families

    from builder.runtime.operator_metrics import OperatorMetrics

    counters: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(_metrics_text(metrics_url)):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in (OperatorMetrics.DURATION, OperatorMetrics.ROWS) and (
                    sample.labels.get("model") == model):
                slot = counters.setdefault(sample.labels["operator"], [0.0, 0.0])
                slot[name == OperatorMetrics.ROWS] += sample.value
    return {operator: (us, rows) for operator, (us, rows) in counters.items()}


async def _served_once(make_client: Callable[[], LoadClient], items: Sequence[Any],
                       concurrency: int, processes: Processes | None,
                       ) -> tuple[float, list[float], list, dict[str, float]]:
    client = make_client()
    requests = client.prepare(items)
    async with client:
        seconds, latencies, responses, cpu = await _drive(client, requests, concurrency,
                                                          processes)
    return seconds, latencies, [client.answer(r) for r in responses], cpu


def measure_served(make_client: Callable[[], LoadClient],
                   to_result: Callable[[Any], Any], workload: Workload, items: Sequence[Any],
                   expected: Sequence[Any], concurrency: int, runs: int, metrics_url: str,
                   models: Sequence[str], processes: Processes | None,
                   operators: bool = False) -> Measure:
    """``runs`` timed runs at one concurrency; every answer checked. With ``operators``, the
    time per request in each operator of the pipeline model ``models[0]``, from its metrics."""
    measures = []
    if operators:  # each run's counters after it are the next run's before
        time.sleep(OPERATOR_METRICS_LAG_S)
        operators_before = _operator_counters(metrics_url, models[0])
    for _ in range(runs):
        stats_before = _statistics(metrics_url, models)
        seconds, latencies, results, cpu = asyncio.run(
            _served_once(make_client, items, concurrency, processes))
        stats_after = _statistics(metrics_url, models)
        operators_us = {}
        if operators:
            time.sleep(OPERATOR_METRICS_LAG_S)
            requests = stats_after[models[0]][3] - stats_before[models[0]][3]
            operators_after = _operator_counters(metrics_url, models[0])
            for operator, (us, _) in operators_after.items():
                operators_us[operator] = (
                    us - operators_before.get(operator, (0.0, 0.0))[0]) / max(requests, 1)
            operators_before = operators_after
        for item, got, want in zip(items, results, expected):
            check_same(to_result(got), want, TOLERANCE, where=f"{workload.key} {item!r:.40}")
        batch, queue_ms = {}, None
        for model in models:
            inferences, executions, queue_us, queued = (
                a - b for a, b in zip(stats_after[model], stats_before[model]))
            if executions:
                batch[model] = inferences / executions
            if model == models[0] and queued:
                queue_ms = queue_us / queued / 1e3
        p50, p99 = _percentiles(latencies)
        measures.append(Measure(len(items) / seconds, p50, p99, batch, queue_ms, cpu,
                                operators_us))
    return _median_measure(measures)


def measure_pipeline(workload: Workload, grpc_url: str, metrics_url: str,
                     models: Sequence[str], concurrency: int, runs: int,
                     processes: Processes | None = None, model: str = "pipeline",
                     operators: bool = False) -> Measure:
    """The served pipeline (or PyTriton's ``model`` doing its work) at one concurrency, every
    answer compared with the in-process one."""
    outputs = list(workload.pipeline.outputs)
    return measure_served(
        _pipeline_client(workload, grpc_url, model),
        lambda got: _model_result(got, outputs), workload, workload.items, workload.expected,
        concurrency, runs, metrics_url, models, processes, operators)


def measure_eager(workload: Workload, items: Sequence[Any], runs: int) -> Measure:
    pipeline = workload.pipeline
    measures = []
    for _ in range(runs):
        latencies = []
        started = time.perf_counter()
        for item in items:
            begun = time.perf_counter()
            pipeline(item)
            latencies.append(time.perf_counter() - begun)
        seconds = time.perf_counter() - started
        measures.append(Measure(len(items) / seconds, *_percentiles(latencies)))
    return _median_measure(measures)


def measure_ort(workload: Workload, onnx_path: Path, batch: int, items: Sequence[Any],
                expected: Sequence[Any], runs: int) -> Measure:
    """Raw ONNX Runtime, default session options; latency is the batch's."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    chunks = [items[i:i + batch] for i in range(0, len(items), batch)]
    run_batch(session, workload, chunks[0])
    measures = []
    for _ in range(runs):
        latencies, results = [], []
        started = time.perf_counter()
        for chunk in chunks:
            begun = time.perf_counter()
            results.extend(run_batch(session, workload, chunk))
            latencies.append(time.perf_counter() - begun)
        seconds = time.perf_counter() - started
        for item, got, want in zip(items, results, expected):
            check_same(got, want, TOLERANCE, where=f"onnxruntime {item!r:.40}")
        measures.append(Measure(len(items) / seconds, *_percentiles(latencies)))
    return _median_measure(measures)


# -- the load generator ---------------------------------------------------------------------
class LoadClient:
    """The load generator: Triton's gRPC service through gRPC's asyncio stub, one request of
    batch size one per item, the same for every served row.

    As perf_analyzer does, the requests are serialized before the clock starts; the responses
    are decoded (tritonclient's ``InferResult``) and checked after it stops. On one machine the
    load generator's CPU is taken from the server being measured, so it does nothing else while
    timed. On the text pipeline at 32 in flight, measured side by side: 0.063-0.083 ms of CPU
    a request, against 0.115-0.12 ms for tritonclient's asyncio client building its
    ``InferInput`` objects per request; the builder's ``AsyncClient``, with its codec and
    checks, costs about 0.04 ms more than tritonclient's.
    """

    def __init__(self, grpc_url: str, model: str,
                 inputs: Callable[[Any], list[tuple[str, np.ndarray]]],
                 outputs: Sequence[str]) -> None:
        self.grpc_url, self.model, self.inputs, self.outputs = grpc_url, model, inputs, outputs

    def prepare(self, items: Sequence[Any]) -> list:
        """One serialized ``ModelInferRequest`` per item."""
        from tritonclient.grpc import service_pb2
        from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor

        requests = []
        for item in items:
            request = service_pb2.ModelInferRequest(model_name=self.model)
            for name, array in self.inputs(item):
                request.inputs.add(name=name, datatype=np_to_triton_dtype(array.dtype),
                                   shape=array.shape)
                request.raw_input_contents.append(
                    serialize_byte_tensor(array).item() if array.dtype == np.object_
                    else np.ascontiguousarray(array).tobytes())
            for name in self.outputs:
                request.outputs.add(name=name)
            requests.append(request.SerializeToString())
        return requests

    async def __aenter__(self) -> LoadClient:
        import grpc

        self.channel = grpc.aio.insecure_channel(self.grpc_url)
        # bytes in, bytes out: serializing and decoding stay outside the timed part
        self.infer = self.channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=None, response_deserializer=None)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.channel.close()

    async def __call__(self, request: bytes) -> bytes:
        return await self.infer(request)

    def answer(self, response: bytes) -> dict[str, np.ndarray]:
        """Each output of one response, without its batch dimension."""
        from tritonclient.grpc import InferResult, service_pb2

        result = InferResult(service_pb2.ModelInferResponse.FromString(response))
        return {name: result.as_numpy(name)[0] for name in self.outputs}


def _pipeline_client(workload: Workload, grpc_url: str,
                     model: str = "pipeline") -> Callable[[], LoadClient]:
    """Requests as the pipeline model (or PyTriton's model) takes them: one value, ``[1, 1]``."""

    def inputs(item: Any) -> list[tuple[str, np.ndarray]]:
        value = item.encode() if isinstance(item, str) else item
        return [(workload.input_name, np.array([[value]], dtype=np.object_))]

    return lambda: LoadClient(grpc_url, model, inputs, list(workload.pipeline.outputs))


def _model_result(outputs: dict[str, np.ndarray], names: Sequence[str]) -> Any:
    """An answer in the pipeline's result structure (strings decoded)."""
    values = []
    for name in names:
        array = outputs[name]
        if array.dtype == object or array.dtype.kind == "S":
            values.append([v.decode() if isinstance(v, bytes) else str(v) for v in array])
        else:
            values.append(array)
    return values[0] if len(values) == 1 else tuple(values)


# -- PyTriton, in its own process -----------------------------------------------------------
def _pytriton_serve(key: str, onnx_path: str, ports: tuple[int, int, int], ready: Any,
                    stop: Any) -> None:
    """Serve ``key``'s work as one ``@batch`` callable with PyTriton until ``stop`` is set."""
    import onnxruntime as ort
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    workload = WORKLOADS[key](0)
    # the session options of our pipeline model: the comparison is of the serving, not of ORT's
    session = ort.InferenceSession(onnx_path, sess_options=cpu_session_options(ort, 1),
                                   providers=["CPUExecutionProvider"])
    signature = workload.pipeline.signature()

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        items = workload.items_of(inputs[workload.input_name])
        return workload.answer(run_batch(session, workload, items))

    out_tensors = [Tensor(name=name, dtype=np.bytes_ if spec.dtype == "TYPE_STRING"
                          else np.float32, shape=spec.served_dims)
                   for name, spec in signature.outputs.items()]
    http, grpc, metrics = ports
    config = TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)
    with Triton(config=config) as triton:
        triton.bind(model_name=f"pytriton_{key}", infer_func=infer,
                    inputs=[Tensor(name=workload.input_name, dtype=np.bytes_, shape=(1,))],
                    outputs=out_tensors,
                    config=ModelConfig(max_batch_size=64, batcher=DynamicBatcher()))
        triton.run()
        ready.set()
        stop.wait()


class PyTritonServer:
    """PyTriton in a child process (its callable must not share the client's interpreter)."""

    def __init__(self, key: str, onnx_path: Path) -> None:
        self.key = key
        self.onnx_path = onnx_path
        self.ports = tuple(free_ports(3))
        context = multiprocessing.get_context("spawn")
        self.ready, self.stop = context.Event(), context.Event()
        self.process = context.Process(target=_pytriton_serve, daemon=True, args=(
            key, str(onnx_path), self.ports, self.ready, self.stop))

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports[1]}"

    def __enter__(self) -> PyTritonServer:
        # PyTriton's 3.11 stub links a libpython: this interpreter's own, not Debian's.
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
            d for d in (libdir, os.environ.get("LD_LIBRARY_PATH", "")) if d)
        self.process.start()
        if not self.ready.wait(180) or not triton_ready(f"127.0.0.1:{self.ports[0]}"):
            self.__exit__()
            raise RuntimeError("PyTriton did not become ready")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        self.process.join(60)
        if self.process.is_alive():
            self.process.kill()


# -- the run --------------------------------------------------------------------------------
@dataclass
class Results:
    workload: Workload
    rows: dict[str, dict[int, Measure]] = field(default_factory=dict)
    overhead: list[tuple[float, float, float]] = field(default_factory=list)
    """p50 in ms at concurrency 1 of the pipeline, the hand-written model and the pipeline's
    model called directly, measured by turns (one tuple a round)."""
    prepost_p50_ms: float | None = None
    prepost_paused_p50_ms: float | None = None
    """The same with the CPU idle between calls for as long as a direct model call takes."""
    paired: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """Ratio ("a/b", "a/d") → (served, other) req/s of each pair: see :func:`measure_paired`."""

    def paired_ratio(self, ratio: str) -> float | None:
        pairs = self.paired.get(ratio)
        return statistics.median(a / b for a, b in pairs) if pairs else None

    @property
    def overhead_ms(self) -> float | None:
        """The pipeline model's overhead: median over the rounds of pipeline minus model p50."""
        return statistics.median(p - d for p, _, d in self.overhead) if self.overhead else None

    @property
    def handwritten_overhead_ms(self) -> float | None:
        """The same for the hand-written model: what the work itself costs as served."""
        return statistics.median(h - d for _, h, d in self.overhead) if self.overhead else None

    @property
    def own_overhead_ms(self) -> float | None:
        """The pipeline model's own share: median over the rounds of pipeline minus
        hand-written p50."""
        return statistics.median(p - h for p, h, _ in self.overhead) if self.overhead else None

    @property
    def direct_p50_ms(self) -> float:
        return statistics.median(d for _, _, d in self.overhead)


PAIRS = 7


def side_by_side_setup(doc: str, pairs: int) -> tuple[argparse.Namespace, Any, Workload]:
    """What a side-by-side benchmark of the text-embedding image starts with: its command line
    (``--pairs``, ``--requests``, ``--no-write``), the engine, the workload with every answer
    expected from the in-process pipeline."""
    from builder.engine import ensure_engine

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=pairs)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--no-write", action="store_true")
    arguments = parser.parse_args()
    workload = WORKLOADS["text"](arguments.requests)
    workload.expected = [workload.pipeline(item) for item in workload.items]
    return arguments, ensure_engine(), workload


def measure_paired(*measures: Callable[[], float], pairs: int = PAIRS) -> list[tuple[float, ...]]:
    """Measurements by turns, ``pairs`` rounds: the served pipeline and what a goal compares
    it with (eager or PyTriton req/s at the top concurrency; the hand-written model's and its
    model's p50 at 1). One tuple a round, in the order given.

    This machine's speed drifts by tens of percent from one minute to the next (a virtual
    machine among others), more than the goals' margins; the rows of the tables are measured
    minutes apart. Each goal is judged on the back-to-back rounds.
    """
    measured = []
    for index in range(pairs):
        values: list[float] = [0.0] * len(measures)
        for k in range(len(measures)):  # each round starts elsewhere: no order favours one
            position = (index + k) % len(measures)
            values[position] = measures[position]()
        measured.append(tuple(values))
    return measured


def _served_rows(workload: Workload, grpc_url: str, metrics_url: str, label: str,
                 models: Sequence[str], processes: Processes, args: argparse.Namespace,
                 results: Results, model: str = "pipeline") -> None:
    """The row ``label`` at each concurrency: ``model`` answering for the pipeline; the
    operator metrics only where it is the pipeline model (they are its own)."""
    row = results.rows.setdefault(label, {})
    for concurrency in CONCURRENCY:
        row[concurrency] = measure_pipeline(workload, grpc_url, metrics_url, models,
                                            concurrency, args.runs, processes, model,
                                            operators=model == "pipeline")
        print(f"{workload.key} {label} c={concurrency}: {row[concurrency].rate:.0f} req/s",
              flush=True)


def _direct_model_p50(workload: Workload, grpc_url: str, onnx_path: Path) -> float:
    """p50 of the pipeline's ONNX model called directly, concurrency 1, inputs ready."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    items = workload.items[:max(200, len(workload.items) // 4)]
    encoded = workload.encode(items)

    def client() -> LoadClient:
        return LoadClient(grpc_url, workload.model,
                          lambda arrays: [(n, a[None]) for n, a in zip(names, arrays)], outputs)

    _, latencies, answers, _ = asyncio.run(_served_once(client, encoded, 1, None))
    for arrays, answer, want in zip(encoded, answers, workload.expected):
        got = workload.finish([tuple(answer[n] for n in outputs)], [arrays])[0]
        check_same(got, want, TOLERANCE, where=f"{workload.model} directly")
    return _percentiles(latencies)[0]


def _prepost_p50(workload: Workload, onnx_path: Path, pause_s: float = 0.0) -> float:
    """p50 of the pipeline's own Python operators for one call, in process, model excluded;
    with ``pause_s``, the CPU idles that long before each call, as between requests served one
    at a time."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    latencies = []
    for item in workload.items:
        if pause_s:
            time.sleep(pause_s)
        started = time.perf_counter()
        encoded = workload.encode([item])[0]
        between = time.perf_counter()
        outputs = session.run(None, {n: a[None] for n, a in zip(names, encoded)})
        resumed = time.perf_counter()
        workload.finish([tuple(o[0] for o in outputs)], [encoded])
        latencies.append(between - started + time.perf_counter() - resumed)
    return _percentiles(latencies)[0]


def _add_handwritten(root: Path, pipeline_model: str, workload: Workload,
                     onnx_path: Path) -> None:
    """``benchmarks/handwritten_model.py`` as a model of the repository at ``root``, with the
    pipeline model's inputs, outputs, dynamic batching and instance count."""
    config = read_config(root / pipeline_model)
    config.name = HANDWRITTEN_MODEL
    config.parameters.clear()
    del config.model_warmup[:]  # the pipeline model's examples as requests: not the user's
    for key, value in {"workload": workload.key, "model": str(onnx_path),
                       "root": str(ROOT)}.items():
        config.parameters[key].string_value = value
    version = root / HANDWRITTEN_MODEL / "1"
    version.mkdir(parents=True)
    shutil.copyfile(ROOT / "benchmarks" / "handwritten_model.py", version / "model.py")
    write_config(config, root / HANDWRITTEN_MODEL)


def run_workload(workload: Workload, args: argparse.Namespace, workdir: Path,
                 client: Any) -> Results:
    results = Results(workload)
    workload.expected = [workload.pipeline(item) for item in workload.items]
    results.rows[EAGER] = {
        1: measure_eager(workload, workload.items, args.runs)}
    built = build_pipeline_model(workload.pipeline, workdir / f"{workload.key}-models",
                                 parallelism=workload.parallelism)
    onnx_path = built.model_root / workload.model / "1" / "model.onnx"
    for size in ORT_BATCHES:
        results.rows[f"raw ONNX Runtime, batches of {size}"] = {
            size: measure_ort(workload, onnx_path, size, workload.items, workload.expected,
                              args.runs)}
    _add_handwritten(built.model_root, built.pipeline_model, workload, onnx_path)
    models = [built.pipeline_model, workload.model]
    top, pairs = max(CONCURRENCY), 1 if args.quick else PAIRS
    with TritonServer(built.model_root) as server, \
            PyTritonServer(workload.key, onnx_path) as pytriton:
        assert server._process is not None
        metrics_url = f"127.0.0.1:{server.metrics_port}"
        _served_rows(workload, server.grpc_url, metrics_url, SERVED,
                     models, Processes([server._process.pid]), args, results)
        _served_rows(workload, server.grpc_url, metrics_url, HANDWRITTEN,
                     [HANDWRITTEN_MODEL], Processes([server._process.pid]), args, results,
                     HANDWRITTEN_MODEL)
        name = f"pytriton_{workload.key}"
        pytriton_metrics = f"127.0.0.1:{pytriton.ports[2]}"
        _served_rows(workload, pytriton.grpc_url, pytriton_metrics, PYTRITON, [name],
                     Processes([pytriton.process.pid], "pytriton "), args, results, name)

        def served() -> float:
            return measure_pipeline(workload, server.grpc_url, metrics_url, models, top, 1).rate

        def eager() -> float:
            return measure_eager(workload, workload.items, 1).rate

        def pytriton_rate() -> float:
            return measure_pipeline(workload, pytriton.grpc_url, pytriton_metrics, [name], top,
                                    1, model=name).rate

        for ratio, other in (("a/b", eager), ("a/d", pytriton_rate)):
            results.paired[ratio] = measure_paired(served, other, pairs=pairs)
            print(f"{workload.key} paired {ratio} at {top}: {results.paired_ratio(ratio):.2f}",
                  flush=True)
        results.overhead = measure_paired(
            lambda: measure_pipeline(workload, server.grpc_url, metrics_url, models, 1,
                                     1).p50_ms,
            lambda: measure_pipeline(workload, server.grpc_url, metrics_url,
                                     [HANDWRITTEN_MODEL], 1, 1, model=HANDWRITTEN_MODEL).p50_ms,
            lambda: _direct_model_p50(workload, server.grpc_url, onnx_path), pairs=pairs)
        print(f"{workload.key} overhead at 1: {results.overhead_ms:.3f} ms", flush=True)
    results.prepost_p50_ms = _prepost_p50(workload, onnx_path)
    results.prepost_paused_p50_ms = _prepost_p50(workload, onnx_path,
                                                 results.direct_p50_ms / 1000)
    if not args.no_image:
        from builder.image.serving_dockerfile import GRPC_PORT, METRICS_PORT
        from builder.verify.container import ServingContainer

        tag = f"{IMAGE_PREFIX}{workload.key}:1"
        build_docker_image(workload.pipeline, tag, verify=False, client=client,
                           on_log=lambda line: None, parallelism=workload.parallelism)
        try:
            with ServingContainer(client, tag, gpus=False) as endpoint:
                attrs = client.containers.get(endpoint.container_id).attrs
                # its address on the bridge: a published port on 127.0.0.1 goes through
                # docker-proxy, a userland copy a remote client does not pay (10-30% fewer
                # req/s at 32 in flight here, measured by turns)
                address = attrs["NetworkSettings"]["IPAddress"]
                grpc_url, metrics_url = ((f"{address}:{GRPC_PORT}", f"{address}:{METRICS_PORT}")
                                         if address else
                                         (endpoint.grpc_url, endpoint.metrics_url))
                _served_rows(workload, grpc_url, metrics_url, "served: CPU image", models,
                             Processes([attrs["State"]["Pid"]], "image "), args, results)
        finally:
            client.images.remove(tag, force=True)
    return results


# -- the report -----------------------------------------------------------------------------


def _table(results: Results) -> list[str]:
    rows = results.rows
    eager = rows[EAGER][1].rate
    ort = rows[ORT64][64].rate
    lines = ["| how | in flight | req/s | p50 ms | p99 ms | achieved batch (pipeline / model) "
             "| queue ms | a/b | a/c | a/d |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, by_concurrency in rows.items():
        for concurrency, m in sorted(by_concurrency.items()):
            batch = " / ".join(f"{b:.1f}" for b in m.batch.values()) or "—"
            queue = f"{m.queue_ms:.2f}" if m.queue_ms is not None else "—"
            if label.startswith("served"):
                pytriton = rows[PYTRITON].get(concurrency)
                ratios = (f"{m.rate / eager:.2f} | {m.rate / ort:.3f} | "
                          + (f"{m.rate / pytriton.rate:.2f}" if pytriton else "—"))
            else:
                ratios = "— | — | —"
            flight = (f"batch {concurrency}" if label.startswith("raw") else str(concurrency))
            lines.append(f"| {label} | {flight} | {m.rate:.0f} | {m.p50_ms:.2f} | "
                         f"{m.p99_ms:.2f} | {batch} | {queue} | {ratios} |")
    return lines


def _cpu_table(results: Results, concurrency: int) -> list[str]:
    lines = []
    for label in (SERVED, "served: CPU image", HANDWRITTEN, PYTRITON):
        measure = results.rows.get(label, {}).get(concurrency)
        if measure is None or not measure.cpu_ms:
            continue
        parts = ", ".join(f"{name} {ms:.3f}" for name, ms in
                          sorted(measure.cpu_ms.items(), key=lambda kv: -kv[1]))
        lines.append(f"| {label} | {sum(measure.cpu_ms.values()):.3f} | {parts} |")
    return lines


def _operator_table(results: Results) -> list[str]:
    """Per operator, µs per request at each concurrency; then their sum and the stub's CPU."""
    row = results.rows.get(SERVED, {})
    concurrencies = [c for c in CONCURRENCY if c in row and row[c].operators_us]
    if not concurrencies:
        return []
    batches = " | ".join(f"{c} in flight (batch {row[c].batch.get('pipeline', 0):.1f})"
                         for c in concurrencies)
    lines = [f"| operator | {batches} |", "|---|" + "---|" * len(concurrencies)]
    for operator in row[concurrencies[0]].operators_us:
        lines.append(f"| `{operator}` | " + " | ".join(
            f"{row[c].operators_us.get(operator, 0.0):.1f}" for c in concurrencies) + " |")
    total = {c: sum(row[c].operators_us.values()) for c in concurrencies}
    stub = {c: sum(ms for name, ms in row[c].cpu_ms.items() if name.startswith("stub")) * 1000
            for c in concurrencies}
    lines.append("| all operators | " + " | ".join(f"{total[c]:.1f}" for c in concurrencies)
                 + " |")
    lines.append("| CPU of the pipeline model's stub(s), `/proc` | " + " | ".join(
        f"{stub[c]:.0f}" for c in concurrencies) + " |")
    return lines


def _chart(all_results: list[Results], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(all_results), figsize=(6 * len(all_results), 4.2))
    for axis, results in zip(np.atleast_1d(axes), all_results):
        for label, by_concurrency in results.rows.items():
            if len(by_concurrency) > 1:
                xs = sorted(by_concurrency)
                axis.plot(xs, [by_concurrency[x].rate for x in xs], marker="o", label=label)
            else:  # eager and raw ONNX Runtime do not depend on requests in flight
                (measure,) = by_concurrency.values()
                axis.plot(CONCURRENCY, [measure.rate] * len(CONCURRENCY), linestyle="--",
                          label=label)
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
        axis.set_xlabel("requests in flight")
        axis.set_ylabel("requests/s")
        axis.set_title(results.workload.title)
        axis.grid(True, which="both", alpha=0.3)
    np.atleast_1d(axes)[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def machine_speed_ms() -> float:
    """A fixed piece of Python and NumPy work, median of 5 (ms): this machine's speed now.

    Measured at the start, between the workloads and at the end of a run: machines of this
    kind are virtual and their speed drifts, so a run whose figures differ by more than the
    goals' margins says so next to its tables.
    """
    data = np.arange(20000, dtype=np.float64)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        total = 0
        for value in range(100000):
            total += value % 7
        np.sort(np.sin(data))
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def report(all_results: list[Results], args: argparse.Namespace, command: str,
           chart: Path, speed_ms: Sequence[float] = ()) -> str:
    drift = (f" Machine speed during the run (the same fixed work at the start, between the "
             f"workloads and at the end, lower is faster): "
             f"{', '.join(f'{ms:.1f}' for ms in speed_ms)} ms"
             f" ({max(speed_ms) / min(speed_ms) - 1:.0%} apart)." if speed_ms else "")
    lines = [SECTION, "",
             f"`{command}` — {machine()}, client on the same "
             f"machine; {args.requests} requests per run, median of {args.runs} runs; every "
             "served answer equal to the in-process one. a = served (host tritonserver), "
             "b = eager `pipeline(x)`, c = raw ONNX Runtime on batches of 64, d = PyTriton at "
             "the same concurrency. Load: gRPC's asyncio client in the benchmark "
             "process, one request of batch size one per item, for every served row; as "
             "perf_analyzer does, requests are serialized before the clock starts and "
             "responses decoded and checked after it stops; PyTriton in its own process; the "
             "CPU image at its address on Docker's bridge (a port published on 127.0.0.1 "
             "goes through docker-proxy, a userland copy). "
             "Achieved batch and queue time from Triton's metrics." + drift, "",
             f"![throughput by requests in flight]({chart.relative_to(BENCHMARKS.parent)})"
             if chart.is_relative_to(BENCHMARKS.parent) else f"Chart: {chart}", ""]
    for results in all_results:
        lines += [f"### {results.workload.title}", ""]
        if results.workload.parallelism > 1:
            lines += [f"Served with {results.workload.parallelism} instances of the pipeline "
                      f"model (`parallelism={results.workload.parallelism}`): one instance "
                      "runs the pipeline's Python operators on one core, and this pipeline's "
                      "pure-Python PNG decoding bounds it there (the sweep below measures one "
                      "instance against two). PyTriton's callable runs in one Python process "
                      "whatever its instance count, so it keeps one.", ""]
        lines += [*_table(results), ""]
        if results.overhead_ms is not None:
            pipeline_p50, handwritten_p50, direct_p50 = (
                statistics.median(column) for column in zip(*results.overhead))
            lines += [f"Pipeline-model overhead at concurrency 1: "
                      f"{results.overhead_ms:.3f} ms p50, the median of "
                      f"{len(results.overhead)} back-to-back rounds (pipeline "
                      f"{pipeline_p50:.3f} ms, its model `{results.workload.model}` called "
                      f"directly {direct_p50:.3f} ms, medians; each round's difference: "
                      + ", ".join(f"{p - d:.3f}" for p, _, d in results.overhead)
                      + f"). The hand-written model.py "
                      "(`benchmarks/handwritten_model.py`: the same pre-processing, model "
                      "and post-processing for each request, nothing else), measured in the "
                      f"same rounds: {handwritten_p50:.3f} ms, "
                      f"{results.handwritten_overhead_ms:.3f} ms over the direct call; so "
                      f"{results.own_overhead_ms:.3f} ms of the overhead is the pipeline "
                      "model's own (pipeline minus hand-written, median of the rounds), the "
                      "rest is the pipeline's Python operators as served. In process those "
                      f"operators take {results.prepost_p50_ms:.3f} ms p50 one call after "
                      f"another, and {results.prepost_paused_p50_ms:.3f} ms p50 when the CPU "
                      f"idles {direct_p50:.3f} ms before each call, as it does between "
                      "requests served one at a time.", ""]
        cpu = _cpu_table(results, max(CONCURRENCY))
        if cpu:
            ort = results.rows[ORT64][64]
            lines += [f"CPU per request at {max(CONCURRENCY)} in flight, by process (ms, "
                      "from `/proc`), against raw ONNX Runtime on batches of 64 with the same "
                      f"pre/post: {1000 / ort.rate:.3f} ms of wall time per request in one "
                      "process:", "", "| served by | total | by process |", "|---|---|---|",
                      *cpu, ""]
        operators = _operator_table(results)
        if operators:
            lines += ["Where the served pipeline model's time goes, by operator: µs of wall "
                      "time per request, from its own metrics (`triton_builder_operator_*`, "
                      "host tritonserver, the same runs as the table above); a model "
                      "operator's time includes its model call. Against them, the CPU its "
                      "stub(s) used per request: the rest of it is requests in, responses out "
                      "and the python backend's own work; at 32 in flight, where both CPUs are "
                      "busy, wall time also counts waits for a CPU.", "", *operators, ""]
    lines += ["Goals (issue 13):", "", *_goals(all_results), ""]
    return "\n".join(lines) + "\n"


OVERHEAD_GOAL_MS = 0.2
"""The pipeline model's overhead at 1 in flight, p50 over calling its model directly (issue 13)."""


def _within(ms: float, limit: float = OVERHEAD_GOAL_MS) -> str:
    return "met" if ms <= limit else f"missed by {ms - limit:.3f} ms"


GOALS = (("text", "a/b", 1.5), ("text", "a/d", 2.0), ("image", "a/b", 1.2))


def _goals(all_results: list[Results]) -> list[str]:
    """Each goal of the issue against this run's figures: met, or by how much it is missed."""
    by_key = {r.workload.key: r for r in all_results}
    top = max(CONCURRENCY)
    lines = []
    for key, ratio, wanted in GOALS:
        results = by_key[key]
        served = results.rows[SERVED][top].rate
        other = (results.rows[EAGER][1] if ratio == "a/b" else results.rows[PYTRITON][top]).rate
        got = served / other
        paired = ""
        if results.paired_ratio(ratio) is not None:
            paired = (f"; from the tables' medians {got:.2f}. Each pair: "
                      + ", ".join(f"{s / o:.2f}" for s, o in results.paired[ratio]))
            got = results.paired_ratio(ratio)
        verdict = "met" if got >= wanted else f"missed by {wanted / got:.2f}x"
        judged = (f"median of {len(results.paired[ratio])} back-to-back pairs"
                  if paired else "from the tables")
        instances = results.workload.parallelism
        line = (f"- {results.workload.title} at {top} in flight"
                + (f" ({instances} pipeline-model instances)" if instances > 1 else "")
                + f", {ratio} ≥ {wanted}: "
                f"{got:.2f} ({verdict}; {judged}{paired})")
        cpu = results.rows[SERVED][top].cpu_ms
        if got < wanted and ratio == "a/b" and cpu:
            total, cores = sum(cpu.values()), os.cpu_count() or 1
            line += (f": served, a request costs {total:.3f} ms of CPU across the processes "
                     f"(client {cpu.get('client (benchmark process)', 0.0):.3f} ms), which "
                     f"caps {cores} CPUs at {cores * 1000 / total:.0f} req/s; eager takes "
                     f"{1000 / other:.3f} ms per call in one process, so even with every CPU "
                     f"busy all the time serving could reach {cores * 1000 / total / other:.2f}x "
                     "eager")
        lines.append(line)
    for results in all_results:
        if results.overhead_ms is not None:
            overhead, prepost = results.overhead_ms, results.prepost_p50_ms
            line = (f"- {results.workload.title}: pipeline-model overhead at 1 in flight "
                    f"≤ {OVERHEAD_GOAL_MS} ms p50: {overhead:.3f} ms ({_within(overhead)}); "
                    "a hand-written model.py doing the same work: "
                    f"{results.handwritten_overhead_ms:.3f} ms, "
                    f"so the pipeline model's own share is {results.own_overhead_ms:.3f} "
                    "ms; less the "
                    f"pipeline's own pre/post ({prepost:.3f} ms in process): "
                    f"{overhead - prepost:.3f} ms ({_within(overhead - prepost)}); less them "
                    f"in process with the CPU idle between calls "
                    f"({results.prepost_paused_p50_ms:.3f} ms): "
                    f"{overhead - results.prepost_paused_p50_ms:.3f} ms "
                    f"({_within(overhead - results.prepost_paused_p50_ms)})")
            served = results.rows.get(SERVED, {}).get(1)
            model = f"'{results.workload.model}'"
            if served is not None and served.operators_us:
                own = sum(us for operator, us in served.operators_us.items()
                          if not operator.startswith(model)) / 1000
                line += (f". As served, the pre/post operators took {own:.3f} ms a request "
                         "(mean, the pipeline model's metrics, in the table's runs at 1 in "
                         "flight)")
            lines.append(line)
    return lines


SWEEP_SECTION = "## Dynamic batching of the pipeline model: a sweep"
SWEEP = (({}, 1), ({"max_queue_delay_microseconds": 100}, 1),
         ({"max_queue_delay_microseconds": 500}, 1), ({"max_queue_delay_microseconds": 2000}, 1),
         ({"preferred_batch_size": [8, 16, 32], "max_queue_delay_microseconds": 500}, 1),
         ({}, 2))
"""The pipeline model's ``dynamic_batching``, and its instance count (``parallelism``)."""


def _same_batching(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal as Triton reads them: a missing queue delay is a delay of 0."""
    unset = {"max_queue_delay_microseconds": 0}
    return {**unset, **a} == {**unset, **b}


@dataclass
class SweepRow:
    """One setting of the sweep, served at each concurrency."""

    title: str
    setting: dict[str, Any]
    instances: int
    measures: dict[int, Measure]

    @property
    def described(self) -> str:
        return (", ".join(f"{k} {v}" for k, v in self.setting.items())
                or "Triton's defaults (no delay)") + f"; {self.instances} instance" + (
                    "s" if self.instances > 1 else "")


def sweep(workloads: list[Workload], args: argparse.Namespace, workdir: Path) -> list[SweepRow]:
    """The pipeline model's dynamic batching settings and instance counts, served by the host
    server, side by side."""
    rows = []
    for workload in workloads:
        for index, (setting, instances) in enumerate(SWEEP):
            built = build_pipeline_model(workload.pipeline,
                                         workdir / f"sweep-{workload.key}-{index}",
                                         dynamic_batching=setting, parallelism=instances)
            with TritonServer(built.model_root) as server:
                measures = {c: measure_pipeline(workload, server.grpc_url,
                                                f"127.0.0.1:{server.metrics_port}",
                                                [built.pipeline_model], c, args.runs)
                            for c in CONCURRENCY}
            rows.append(SweepRow(workload.title, setting, instances, measures))
            print(_sweep_line(rows[-1]), flush=True)
    return rows


def _sweep_line(row: SweepRow) -> str:
    cells = " | ".join(f"{m.rate:.0f} | {m.p50_ms:.2f}" for m in row.measures.values())
    return f"| {row.title} | {row.described} | {cells} |"


def sweep_table(rows: Sequence[SweepRow]) -> list[str]:
    return ["| pipeline | dynamic_batching, instances | " + " | ".join(
        f"req/s at {c} | p50 ms at {c}" for c in CONCURRENCY) + " |",
        "|---|---|" + "---|---|" * len(CONCURRENCY), *map(_sweep_line, rows)]


def sweep_choice(rows: Sequence[SweepRow], all_results: Sequence[Results],
                 default: dict[str, Any]) -> list[str]:
    """What the sweep chooses for each pipeline, by the rule the CPU default follows, and
    whether the builder's default (``default``) is that choice.

    The rule: the most requests/s at the highest concurrency among the settings at one
    instance (the instance count is the pipeline's own ``parallelism``) whose p50 at 1 in
    flight exceeds Triton's defaults' by no more than the room the overhead goal leaves
    (0.2 ms less the overhead this run measured): a request that arrives alone waits out the
    whole queue delay, and latency-bound clients call one request at a time.
    """
    top, lines = max(CONCURRENCY), []

    def rate(row: SweepRow) -> float:
        return row.measures[top].rate

    results = {r.workload.title: r for r in all_results}
    for title in dict.fromkeys(row.title for row in rows):
        ours = [row for row in rows if row.title == title]
        candidates = [row for row in ours if row.instances == 1]
        plain = next(row for row in candidates if not row.setting)
        cost = {row.described: row.measures[1].p50_ms - plain.measures[1].p50_ms
                for row in candidates}
        served = results.get(title)
        overhead = served.overhead_ms if served is not None else None
        room = max(0.0, OVERHEAD_GOAL_MS - overhead) if overhead is not None else 0.0
        fastest = max(candidates, key=rate)
        chosen = max((row for row in candidates if cost[row.described] <= room), key=rate)
        line = (f"- {title}: the most req/s at {top} in flight is `{fastest.described}` "
                f"({rate(fastest):.0f}, {rate(fastest) / rate(plain):.2f}x Triton's "
                f"defaults), at {cost[fastest.described]:+.2f} ms of p50 at 1 in flight. ")
        line += (f"The overhead goal leaves {room:.3f} ms ({OVERHEAD_GOAL_MS} ms less the "
                 f"{overhead:.3f} ms measured above)" if overhead is not None
                 else "No overhead was measured")
        line += f", so the rule chooses `{chosen.described}`"
        line += (": the builder's CPU default." if _same_batching(chosen.setting, default)
                 else f"; the builder's CPU default is `{default}`: it differs, and "
                 "`builder/repository/batching.py` should follow the measurement.")
        twin = next((row for row in ours if _same_batching(row.setting, default)
                     and served is not None and row.instances == served.workload.parallelism),
                    None)
        main_row = served.rows.get(SERVED, {}).get(top) if served is not None else None
        if twin is not None and main_row is not None:
            line += (f" Spread between runs: the main table served `{twin.described}` at "
                     f"{main_row.rate:.0f} req/s at {top} in flight, this table at "
                     f"{rate(twin):.0f}; settings closer than "
                     f"{abs(main_row.rate / rate(twin) - 1):.0%} are not told apart here.")
        lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per row (median shown)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 200 requests, one run, nothing written")
    parser.add_argument("--no-image", action="store_true", help="skip the CPU image rows")
    parser.add_argument("--no-sweep", action="store_true",
                        help="skip the sweep of the pipeline model's dynamic batching")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.runs, args.no_write = 200, 1, True
    command = COMMAND + ("" if (args.requests, args.runs) == (2000, 3) else
                         f" --requests {args.requests} --runs {args.runs}")
    client = None
    if not args.no_image:
        from builder.engine import ensure_engine

        client = ensure_engine()
    all_results = []
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as workdir:
        speed_ms = [machine_speed_ms()]
        for make in WORKLOADS.values():
            all_results.append(run_workload(make(args.requests), args, Path(workdir), client))
            speed_ms.append(machine_speed_ms())
        chart = Path(workdir) / CHART.name if args.no_write else CHART
        _chart(all_results, chart)
        publish(SECTION, report(all_results, args, command, chart, speed_ms),
                write=not args.no_write)
        if not args.no_sweep:
            rows = sweep([r.workload for r in all_results], args, Path(workdir))
            publish(SWEEP_SECTION, "\n".join([
                SWEEP_SECTION, "",
                f"`{command}` (same run) — the served pipeline on the host tritonserver, "
                f"{args.requests} requests per run, median of {args.runs}; every answer "
                "checked. The builder's CPU default for the pipeline model "
                "(`builder/repository/batching.py`) is the setting the rule of "
                "`sweep_choice` picks from this table: the most req/s at 32 in flight among "
                "the settings that keep the overhead at 1 in flight within its goal. GPU "
                "releases are not in this table: no GPU was at hand, so their default "
                "(`builder/repository/batching.py`) stays Triton's own for model operators "
                "and no delay for the pipeline model until a GPU run measures it.", "",
                *sweep_table(rows), "", *sweep_choice(rows, all_results,
                                                     default_batching(None, "pipeline")),
            ]) + "\n", write=not args.no_write)


if __name__ == "__main__":
    main()
