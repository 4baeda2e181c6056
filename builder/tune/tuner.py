"""``tune``: the settings a pipeline serves best with on this machine, under a latency budget.

The steps, in order: fetch perf_analyzer; write the pipeline's repository once (as a build would,
with the budget's queue policy unless told otherwise) and its examples as perf_analyzer's input
data; serve the builder's defaults twice (the baseline, and the run-to-run spread); search
(:mod:`builder.tune.search`) until it settles or the time is up; return the chosen setting as a
:class:`~builder.tune.tuning_file.Tuning` — and write it, the table of every trial and a chart
where asked.

What is tuned is what is served: the pipeline model, and each model operator the pipeline model
calls through Triton. A model operator the pipeline model runs in process (CPU ONNX models, by
default on the CPU base) has no Triton queue or instances of its own to tune.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from builder.engine import docker_client
from builder.errors import TuneError
from builder.pipeline import Pipeline
from builder.pipeline.signature_document import SIGNATURE_PARAMETER, signature_parameter
from builder.repository import build_pipeline_model
from builder.repository.queue_policy import MIN_INSTANCES
from builder.tritonserver.wheel import TRITON_VERSION
from builder.tune.image_serving import (
    ImageServing,
    ServedRepository,
    image_triton_version,
    served_repository,
)
from builder.tune.perf_analyzer import MEASUREMENT_MS, perf_analyzer, write_input_data
from builder.tune.search import Search, knobs
from builder.tune.serving_trial import Serve, ServingTrial, host_server
from builder.tune.settings import MAX_CONCURRENCY, read_setting
from builder.tune.tuning_file import Machine, Tuning
from builder.tune.tuning_report import write_report


def tune(  # noqa: PLR0913 - options as keywords (issue 68: options objects)
    pipe: Pipeline,
    latency_budget_ms: float,
    *,
    minutes: float = 10.0,
    output: str | os.PathLike | None = None,
    report_dir: str | os.PathLike | None = None,
    queue_policy: bool = True,
    measurement_ms: int = MEASUREMENT_MS,
    max_instances: int | None = None,
    max_concurrency: int = MAX_CONCURRENCY,
    subject: str = "",
    build_keywords: Mapping[str, Any] | None = None,
    image: str | None = None,
    client: object | None = None,
    log: Callable[[str], None] | None = None,
) -> Tuning:
    """Search the settings of ``pipe`` served on this machine for the most requests/s whose p99
    (at the pipeline's input) stays within ``latency_budget_ms``, for at most ``minutes`` (from
    when perf_analyzer is ready: its first fetch on a machine is not the search's time). A
    streaming pipeline is loaded with streams (gRPC), and its p99 is that of each stream's first
    item: what its budget bounds when served.

    ``image``: serve that built image of ``pipe`` (its release's Triton, its environment)
    instead of this machine's server, its repository edited per setting and mounted over its own
    (``client``: the Docker engine); its queue policy is the one it was built with.
    ``queue_policy``: search under the queue policy the budget implies (what the tuned build
    serves with; two instances at least, :mod:`builder.repository.queue_policy`), or without
    one. ``max_instances`` bounds each model's instances (default: the CPU count: an instance
    runs the pipeline's Python on one core). ``max_concurrency`` bounds the requests in flight
    (the most your clients send: a load no client makes is no objective). ``build_keywords`` go
    to the repository's build as to ``build_pipeline_model``. ``output`` is the tuning file to
    write, ``report_dir`` where the table and chart go. Raises :class:`TuneError` when no
    setting meets the budget, with the best p99 seen.
    """
    if not latency_budget_ms or latency_budget_ms <= 0:
        raise TuneError(f"the latency budget must be a positive number of ms, got "
                        f"{latency_budget_ms!r}")
    if minutes <= 0:
        raise TuneError(f"minutes must be positive, got {minutes!r}")
    say = log or (lambda line: None)
    streams = bool(pipe.signature().streamed)
    analyzer = perf_analyzer()  # fetched once per machine: not the search's time
    started = time.monotonic()
    serve: Serve
    with tempfile.TemporaryDirectory(prefix="triton-builder-tune-") as scratch:
        if image is None:
            repository, serve = _built(pipe, Path(scratch) / "models", latency_budget_ms,
                                       queue_policy, build_keywords), host_server
            triton = TRITON_VERSION
        else:
            serving = ImageServing(client or docker_client(), image)
            repository, serve = _copied(pipe, serving, Path(scratch) / "models"), serving
            triton = image_triton_version(serving.client, image)
        baseline = read_setting(repository.root, repository.pipeline_model, repository.served)
        minimum = MIN_INSTANCES if repository.queue_policy else 1
        trial = ServingTrial(repository.root, repository.pipeline_model, analyzer,
                             write_input_data(pipe.signature(), pipe.examples,
                                              Path(scratch) / "input.json"),
                             latency_budget_ms, measurement_ms, max_concurrency, serve, log=say,
                             streaming=streams)
        with trial:
            search = Search(trial, deadline=started + minutes * 60, log=say)
            first = search.measured(baseline)
            second = search.measured(baseline, first.concurrency)
            if not (first.within_budget or second.within_budget):
                raise TuneError(_missed(latency_budget_ms, min(first.p99_ms, second.p99_ms),
                                        first.concurrency))
            say(f"run-to-run spread {search.spread:.1%}; searching "
                + ", ".join([repository.pipeline_model, *repository.served]))
            chosen = search.run(baseline, knobs(
                baseline, first.time_us, {name: minimum for name, _ in baseline.models},
                max_instances or max(minimum, os.cpu_count() or 1)))
    result = search.result(chosen)
    if not result.within_budget:
        raise TuneError(_missed(latency_budget_ms, min(
            search.result(s).p99_ms for s in search.trials), 1))
    if search.stopped_by_time:
        say(f"the time budget ({minutes:g} min) ended the search")
    tuning = Tuning(repository.pipeline_model, float(latency_budget_ms),
                    repository.queue_policy, result, search.result(baseline), Machine.here(),
                    triton, subject or image or "",
                    time.monotonic() - started, search.spread,
                    tuple(search.result(s) for s in search.trials), max_concurrency, streams,
                    tuple(search.turns.values()))
    if output is not None:
        tuning.write(output)
    if report_dir is not None:
        write_report(tuning, Path(report_dir))
    return tuning


def _built(pipe: Pipeline, root: Path, latency_budget_ms: float, queue_policy: bool,
           build_keywords: Mapping[str, Any] | None) -> ServedRepository:
    """The pipeline's repository, written as a build writes it."""
    built = build_pipeline_model(pipe, root, **{
        **(build_keywords or {}),
        "latency_budget_ms": latency_budget_ms if queue_policy else None})
    return served_repository(built.model_root)


def _copied(pipe: Pipeline, serving: ImageServing, root: Path) -> ServedRepository:
    """The image's repository, which must serve ``pipe``'s signature (its examples are the
    load)."""
    repository = serving.repository(root)
    wanted = json.loads(signature_parameter(pipe.signature())[SIGNATURE_PARAMETER])
    if repository.signature != wanted:
        raise TuneError(f"{serving.image} serves another pipeline than the one given: its "
                        f"signature differs; give the pipeline it was built from")
    return repository


def _missed(budget_ms: float, best_p99_ms: float, concurrency: int) -> str:
    return (f"no setting serves within a p99 of {budget_ms:g} ms on this machine: the best p99 "
            f"seen was {best_p99_ms:.1f} ms ({concurrency} in flight); raise the budget")
