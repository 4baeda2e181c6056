"""How long each operator of a served pipeline ran, on how many rows, and how many calls it
refused or failed: Triton custom metrics.

Copied beside the pipeline's ``model.py`` as ``triton_builder_operator_metrics.py``, which it
imports; like it, imports nothing from ``builder`` and loads on Python 3.8.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any


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

    def __init__(self, api: Any, labels: dict[str, str], operators: Sequence[str],
                 interval: float = 1.0) -> None:
        pb = api.pb
        counter = pb.MetricFamily.COUNTER
        self._families: tuple[Any, ...] = (
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
    def create(cls, api: Any, model: str, version: str,
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
