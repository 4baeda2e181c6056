"""One trial of the search: a setting written into the built repository, served by a real
``tritonserver`` (this machine's, or a built image's: :mod:`builder.tune.image_serving`), and
loaded by perf_analyzer until the latency budget says stop.

Why the concurrency is searched for each setting: the objective is the most requests/s whose
p99 stays within the budget, and the load that reaches it differs by setting (two instances
take twice the requests in flight before they queue). The load doubles from where the last
setting peaked while the p99 stays within the budget and the rate does not fall, or halves
until it fits. A request the server refuses under the budget's queue policy (``UNAVAILABLE``, it
would have been late) counts as that load missing the budget.

Why a server is stopped while the next one starts: tritonserver polls its models' unloading once a
second before it exits, so a stop takes two to four seconds, most of them asleep; a search serves
one setting after another, and the next server's start overlaps that wait. Its load begins only
once the last server has exited, so no measurement shares the machine with a stopping server.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.tritonserver.host_process import TritonServer
from builder.tune.perf_analyzer import (
    MEASUREMENT_MS,
    LoadPoint,
    PerfAnalyzer,
    PerfAnalyzerError,
    measure_load,
)
from builder.tune.search import Measured
from builder.tune.settings import MAX_CONCURRENCY, Setting, apply_setting

FALLING = 0.95
"""A load whose rate falls this far below the best so far ends the search upward: more requests
in flight then only queue."""
REFUSALS = ("Request timeout expired", "Exceeds maximum queue size")
"""Triton's words for a request its queue policy refused
(:mod:`builder.repository.queue_policy`)."""


Serve = Callable[[Path], AbstractContextManager[Any]]
"""Serves a model repository while the block runs; what it yields has ``grpc_url`` and
``http_url`` (a :class:`TritonServer`, a container's endpoint)."""


def host_server(model_root: Path) -> TritonServer:
    """This machine's ``tritonserver`` (the ``nvidia-pytriton`` wheel's) on ``model_root``."""
    return TritonServer(model_root)


@dataclass
class ServingTrial:
    """Serves settings of one built repository and measures each (a :data:`~.search.Measure`).
    Use it as a context manager: the last server it served stops on leaving."""

    model_root: Path
    pipeline: str
    analyzer: PerfAnalyzer
    input_data: Path
    budget_ms: float
    measurement_ms: int = MEASUREMENT_MS
    max_concurrency: int = MAX_CONCURRENCY
    serve: Serve = host_server
    log: Callable[[str], None] = lambda line: None
    check: Callable[[Any], None] | None = None
    """Called on the server after each setting's load (a benchmark checks the answers)."""
    streaming: bool = False
    """The pipeline streams: each request a stream, its p99 that of its first response."""
    _stopping: threading.Thread | None = field(default=None, init=False, repr=False)
    _stop_error: BaseException | None = field(default=None, init=False, repr=False)

    def __enter__(self) -> ServingTrial:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopped()

    def __call__(self, setting: Setting, start: int) -> Measured:
        apply_setting(self.model_root, setting)
        models = [name for name, _ in setting.models]
        with ExitStack() as serving:
            server = serving.enter_context(self.serve(self.model_root))
            self.stopped()
            before = model_statistics(server.http_url, models)
            within, floor, missed = self._load(server, max(1, min(start, self.max_concurrency)))
            after = model_statistics(server.http_url, models)
            if self.check is not None:
                self.check(server)
            self._stop_later(serving.pop_all())
        time_us = {name: _per_request(before[name], after[name]) for name in models}
        if not within:
            return Measured(0.0, floor.p99_ms, floor.concurrency, False, time_us,
                            latency_bound=True)
        best = max(within, key=lambda p: p.rate)
        return Measured(best.rate, best.p99_ms, best.concurrency, True, time_us,
                        {p.concurrency: p.rate for p in within}, latency_bound=missed)

    def stopped(self) -> None:
        """Wait until the last server stopped in the background has exited; raise what its stop
        raised."""
        stopping, self._stopping = self._stopping, None
        if stopping is not None:
            stopping.join()
        error, self._stop_error = self._stop_error, None
        if error is not None:
            raise error

    def _stop_later(self, serving: ExitStack) -> None:
        def stop() -> None:
            try:
                serving.close()
            except BaseException as error:  # raised where the trial next waits for it
                self._stop_error = error

        self._stopping = threading.Thread(target=stop, name="stopping tritonserver")
        self._stopping.start()

    def _load(self, server: Any, start: int) -> tuple[list[LoadPoint], LoadPoint, bool]:
        """Every load measured within the budget, the lowest load measured, and whether the
        load stopped rising because the next one missed the budget."""
        concurrency, point = start, self._point(server, start)
        lowest = point
        if not self._fits(point):
            while concurrency > 1:
                concurrency //= 2
                point = lowest = self._point(server, concurrency)
                if self._fits(point):
                    return [point], lowest, True
            return [], lowest, True
        within = [point]
        while concurrency * 2 <= self.max_concurrency:
            concurrency *= 2
            point = self._point(server, concurrency)
            if not self._fits(point):
                return within, lowest, True
            within.append(point)
            if point.rate < max(p.rate for p in within) * FALLING:
                break
        return within, lowest, False

    def _fits(self, point: LoadPoint) -> bool:
        return point.p99_ms <= self.budget_ms and point.rate > 0

    def _point(self, server: Any, concurrency: int) -> LoadPoint:
        """One load, measured; measured again with looser stability where its windows did not
        agree (a server just started, a machine with other work)."""
        try:
            try:
                return measure_load(self.analyzer, server.grpc_url, self.pipeline,
                                    self.input_data, concurrency,
                                    measurement_ms=self.measurement_ms,
                                    streaming=self.streaming)
            except PerfAnalyzerError as error:
                if "did not stabilize" not in str(error):
                    raise
                self.log(f"{concurrency} in flight: unstable, measured again")
                return measure_load(self.analyzer, server.grpc_url, self.pipeline,
                                    self.input_data, concurrency,
                                    measurement_ms=self.measurement_ms, stability_percent=50,
                                    max_trials=12, streaming=self.streaming)
        except PerfAnalyzerError as error:
            if not any(refusal in str(error) for refusal in REFUSALS):
                raise
            self.log(f"{concurrency} in flight: requests refused under the latency budget")
            return LoadPoint(concurrency, 0.0, float("inf"), float("inf"), 0)


def model_statistics(http_url: str, models: list[str]) -> dict[str, tuple[int, int, int]]:
    """Per model: (requests served, ns queued, ns computing) so far, from Triton's statistics
    extension."""
    with urllib.request.urlopen(f"http://{http_url}/v2/models/stats", timeout=10) as response:
        stats = json.load(response)["model_stats"]
    found = {name: (0, 0, 0) for name in models}
    for model in stats:
        if model["name"] in found:
            inference = model["inference_stats"]
            compute = sum(inference[key]["ns"] for key in
                          ("compute_input", "compute_infer", "compute_output"))
            found[model["name"]] = (inference["success"]["count"], inference["queue"]["ns"],
                                    compute)
    return found


def _per_request(before: tuple[int, int, int], after: tuple[int, int, int]
                 ) -> tuple[float, float]:
    """µs queued and computing per request between two readings."""
    count = after[0] - before[0]
    if count <= 0:
        return (0.0, 0.0)
    return ((after[1] - before[1]) / count / 1000, (after[2] - before[2]) / count / 1000)
