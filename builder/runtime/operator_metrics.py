"""How long each operator of a served pipeline ran, on how many rows, and how many calls it
refused or failed: Triton custom metrics.

Copied beside the pipeline's ``model.py`` as ``triton_builder_operator_metrics.py``, which it
imports; like it, imports nothing from ``builder`` and loads on Python 3.8.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds of the latency histograms, in seconds: 0.1 ms (a cheap Python step) to 10 s
(a long generation), about 2.5x apart, as Prometheus' client libraries space theirs."""
HISTOGRAMS_VARIABLE = "TRITON_BUILDER_HISTOGRAMS"
"""``off`` (or ``0``, ``false``, ``no``) at ``docker run``: the counters only, no latency
histogram (each observation is a message from the stub to the server)."""


def histograms_wanted(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(HISTOGRAMS_VARIABLE, "on").lower() not in ("off", "0", "false", "no")


class OperatorTimes:
    """What one operator spent since the metrics were last sent: the executor adds to it.

    ``seconds`` and ``rows`` summed over its calls, ``rejected`` (calls refused as bad input)
    and ``failed`` (calls it failed), and ``calls``, each call's seconds, for the histogram.
    """

    __slots__ = ("seconds", "rows", "rejected", "failed", "calls")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.seconds, self.rows, self.rejected, self.failed = 0.0, 0, 0, 0
        self.calls: list[float] = []

    def record(self, seconds: float, rows: int) -> None:
        """One call of the operator over ``rows`` rows."""
        self.seconds += seconds
        self.rows += rows
        self.calls.append(seconds)

    def add(self, other: OperatorTimes) -> None:
        self.seconds += other.seconds
        self.rows += other.rows
        self.rejected += other.rejected
        self.failed += other.failed
        self.calls.extend(other.calls)

    def take(self) -> OperatorTimes:
        """A copy of what was counted, and this one emptied."""
        taken = OperatorTimes()
        taken.add(self)
        self.clear()
        return taken

    def __bool__(self) -> bool:
        return bool(self.rows or self.rejected or self.failed or self.calls)

    def __repr__(self) -> str:
        return (f"OperatorTimes(seconds={self.seconds:.6f}, rows={self.rows}, "
                f"rejected={self.rejected}, failed={self.failed}, calls={len(self.calls)})")


def new_times(count: int) -> list[OperatorTimes]:
    return [OperatorTimes() for _ in range(count)]


class OperatorMetrics:
    """How long each operator of the served pipeline ran, and on how many rows: Triton metrics.

    Counters on the server's metrics endpoint, labelled ``model``, ``version`` and
    ``operator`` (as errors name it): ``triton_builder_operator_duration_us``, the wall time in
    the operator (its model calls included), and ``triton_builder_operator_rows``. Triton's own
    metrics end at the pipeline model's execution; these say which operator its time goes to,
    and, over rows, what one row costs where batching amortises it and where it does not.
    ``triton_builder_operator_rejected`` counts the calls an operator refused as bad input
    (answered ``INVALID_ARGUMENT``), ``triton_builder_operator_failures`` those it failed
    (``INTERNAL``): an alert on failures is not woken by clients sending bad input. Where the
    release has histograms (python_backend 24.08 on), ``triton_builder_operator_latency_seconds``
    holds each call's seconds in :data:`LATENCY_BUCKETS`: a p99 per operator, which sums of
    counters cannot give (a model operator's calls are its model's, BLS or in process).

    Every update of a custom metric is a message from the stub to the server, so ``times``
    accumulates here (under ``lock``, held by ``execute``) and a thread of its own sends it
    every ``interval`` seconds, whether requests come or not, and once more when the model
    unloads: requests never wait for a metric. Releases before 23.05 have no custom metrics:
    :meth:`create` then returns ``None``.
    """

    DURATION = "triton_builder_operator_duration_us"
    ROWS = "triton_builder_operator_rows"
    REJECTED = "triton_builder_operator_rejected"
    FAILURES = "triton_builder_operator_failures"
    LATENCY = "triton_builder_operator_latency_seconds"

    def __init__(self, api: Any, labels: dict[str, str], operators: Sequence[str],
                 interval: float = 1.0, histograms: bool = True) -> None:
        family = api.pb.MetricFamily
        counters = [family(name=name, kind=family.COUNTER, description=description)
                    for name, description in (
                        (self.DURATION, "Wall time in each operator of a served pipeline"),
                        (self.ROWS, "Rows each operator of a served pipeline ran on"),
                        (self.REJECTED, "Calls an operator refused as bad input"),
                        (self.FAILURES, "Calls an operator failed (not bad input)"))]
        histogram = (family(name=self.LATENCY, kind=family.HISTOGRAM,
                            description="Seconds of each call of an operator of a served "
                                        "pipeline")
                     if histograms and hasattr(family, "HISTOGRAM") else None)
        self._families: tuple[Any, ...] = (*counters, *([histogram] if histogram else []))
        self._counters = [tuple(counter.Metric(labels={**labels, "operator": operator})
                                for counter in counters) for operator in operators]
        self._latencies = [histogram.Metric(labels={**labels, "operator": operator},
                                            buckets=list(LATENCY_BUCKETS))
                           if histogram else None for operator in operators]
        self.times = new_times(len(operators))
        """One :class:`OperatorTimes` per operator, not yet sent (the executor adds to it)."""
        self.lock = threading.Lock()
        self.api, self.interval = api, interval
        self._stopped = threading.Event()
        self._sender = threading.Thread(target=self._send_every_interval, daemon=True,
                                        name="triton-builder-operator-metrics")
        self._sender.start()

    @classmethod
    def create(cls, api: Any, model: str, version: str,
               operators: Sequence[str]) -> OperatorMetrics | None:
        if not api.features.custom_metrics:
            return None
        try:
            return cls(api, {"model": model, "version": version}, operators,
                       histograms=histograms_wanted())
        except Exception as error:  # noqa: BLE001 - e.g. the server runs without metrics
            api.log_warning(f"no per-operator metrics: {error}")
            return None

    @property
    def histograms(self) -> bool:
        return any(latency is not None for latency in self._latencies)

    def add(self, times: Sequence[OperatorTimes]) -> None:
        """Add times counted elsewhere (a streaming loop's) to those to send, and empty them."""
        with self.lock:
            for total, spent in zip(self.times, times):
                total.add(spent)
                spent.clear()

    def send(self) -> None:
        """Add what was measured since the last send to the server's metrics."""
        with self.lock:
            pending = [(counters, latency, spent.take()) for counters, latency, spent
                       in zip(self._counters, self._latencies, self.times) if spent]
        for counters, latency, spent in pending:
            amounts = (spent.seconds * 1e6, spent.rows, spent.rejected, spent.failed)
            for metric, amount in zip(counters, amounts):
                if amount:
                    metric.increment(amount)
            if latency is not None:
                for seconds in spent.calls:
                    latency.observe(seconds)

    def close(self) -> None:
        """Stop the thread, send what is left, then release the metrics before their families
        (as Triton asks)."""
        self._stopped.set()
        self._sender.join()
        self.send()
        self._counters.clear()
        self._latencies.clear()
        self._families = ()

    def _send_every_interval(self) -> None:
        while not self._stopped.wait(self.interval):
            try:
                self.send()
            except Exception as error:  # noqa: BLE001 - the thread stops, serving goes on
                self.api.log_warning(f"per-operator metrics stopped: {error}")
                return
