"""Tuning: ``tune``'s choice against the builder's defaults and Model Analyzer's, side by side.

For the text-embedding and image-classification examples (p99 budget 50 ms) and the
model-bound stand-in (``tests/support/model_bound.py``, a device that holds each batch of up to
4 rows 20 ms; budget 100 ms):

* ``tune`` searches (``--minutes`` each), and its search time is kept;
* NVIDIA Model Analyzer (``triton-model-analyzer``, quick search, the composing models listed
  where the pipeline model calls any; ``benchmarks/model_analyzer_run.py``) searches the same
  repository under the same p99 constraint and the same bounds as ``tune`` (instances up to
  the CPU count, 128 requests in flight), and its search time is kept (``--no-analyzer`` skips
  it);
* then the builder's defaults, tune's setting and Model Analyzer's best are each served by
  turns, ``--runs`` times, on the same host tritonserver and measured the same way (perf_analyzer
  on the pipeline's examples in windows of ``--measurement-ms``, longer than a search's, the
  load doubled while p99 stays within the budget): medians.
  Every served answer to the examples is checked against the in-process pipeline after each
  load (perf_analyzer itself checks none). Since one setting's turns spread widely on a
  loaded 2-core machine, tune's setting and Model Analyzer's are also compared turn by turn
  (each pair measured back to back): in how many turns tune's served more, the median of the
  turns' ratios, and the two-sided sign test's p-value (:func:`by_turns`).

``--only`` a part of the workloads writes a section of its own (a longer run by turns of one
pipeline, say), so the whole comparison stays as it was measured.

All three are searched and served without the budget's queue policy, which Model Analyzer does
not know. The table, a chart and the command go into ``BENCHMARKS.md``.

    python benchmarks/bench_tune.py [--budget-ms 50] [--minutes 5] [--runs 3] [--no-analyzer]
                                    [--only text,image,model-bound] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.report import machine, publish  # noqa: E402
from builder import build_pipeline_model, tune  # noqa: E402
from builder.client.pipeline import Client  # noqa: E402
from builder.tune.perf_analyzer import (  # noqa: E402
    MEASUREMENT_MS,
    perf_analyzer,
    write_input_data,
)
from builder.tune.search import Measured  # noqa: E402
from builder.tune.serving_trial import ServingTrial  # noqa: E402
from builder.tune.settings import (  # noqa: E402
    MAX_CONCURRENCY,
    ModelSetting,
    Setting,
    read_setting,
)
from builder.tune.turns import sign_test_p  # noqa: E402
from builder.verify.equality import check_same  # noqa: E402
from pipelines import image_classification, text_embedding  # noqa: E402
from tests.support.example_inputs import TEXTS, images  # noqa: E402
from tests.support.model_bound import MAX_BATCH, MODEL_BOUND  # noqa: E402

SECTION = "## Tuning: tune against the builder's defaults and Model Analyzer"
COMMAND = "python benchmarks/bench_tune.py"
CHART = ROOT / "benchmarks" / "tuning_throughput.png"


@dataclass
class Workload:
    key: str
    title: str
    pipeline: Any
    calls: list
    keywords: dict = field(default_factory=dict)
    budget_ms: float = 50.0


def workloads() -> dict[str, Workload]:
    return {
        "text": Workload("text", "text embedding", text_embedding.pipeline,
                         [(t,) for t in TEXTS[:8]]),
        "image": Workload("image", "image classification", image_classification.pipeline,
                          [(i,) for i in images()[:8]]),
        "model-bound": Workload("model-bound", "model-bound stand-in", MODEL_BOUND,
                                [(t,) for t in ("hello", "a", "b c")],
                                {"max_batch_size": 4 * MAX_BATCH}, budget_ms=100.0),
    }


@dataclass
class Row:
    setting: str
    described: str
    runs: list[Measured] = field(default_factory=list)
    search_s: float | None = None
    searched: int | None = None
    ended: bool = True
    """False: the search did not end by itself (Model Analyzer's loop, model_analyzer_run)."""

    @property
    def rate(self) -> float:
        return statistics.median(m.rate for m in self.runs)

    @property
    def p99_ms(self) -> float:
        return statistics.median(m.p99_ms for m in self.runs)

    @property
    def concurrency(self) -> int:
        return sorted(self.runs, key=lambda m: m.rate)[len(self.runs) // 2].concurrency


def answers_check(workload: Workload) -> Callable[[Any], None]:
    expected = [workload.pipeline(*call) for call in workload.calls]

    def check(server: Any) -> None:
        with Client(f"grpc://{server.grpc_url}/pipeline") as served:
            for call, answer in zip(workload.calls, expected, strict=True):
                check_same(served(*call), answer, where=f"{workload.key} {call!r:.40}")

    return check


@dataclass(frozen=True)
class ByTurns:
    """Tune's setting against another, turn by turn (each pair measured back to back)."""

    ahead: int
    turns: int
    median_ratio: float
    sign_test_p: float


def by_turns(tuned: Row, other: Row) -> ByTurns:
    """Pairs by turn cancel the machine's drift between turns, which on two loaded cores is
    wider than the difference between two good settings. The sign test asks how likely so
    lopsided a count of turns is if neither setting serves more (a tie is no evidence either
    way, so it is left out of the test, as the sign test does)."""
    pairs = list(zip((m.rate for m in tuned.runs), (m.rate for m in other.runs), strict=True))
    ahead = sum(ours > theirs for ours, theirs in pairs)
    behind = sum(ours < theirs for ours, theirs in pairs)
    p = min(1.0, 2 * sign_test_p(max(ahead, behind), min(ahead, behind)))
    return ByTurns(ahead, len(pairs), statistics.median(ours / theirs for ours, theirs in pairs),
                   p)


def analyzer_setting(config: dict, baseline: Setting) -> Setting:
    """Model Analyzer's best model config (per model: instance count, max batch size, dynamic
    batching) as a setting of ours."""
    setting = baseline
    for name, chosen in config.items():
        if name not in dict(setting.models):
            continue
        current: ModelSetting = setting[name]
        batching = chosen.get("dynamic_batching") or {}
        setting = setting.with_model(
            name, instances=int(chosen.get("instance_count", current.instances)),
            max_batch_size=int(chosen.get("max_batch_size", current.max_batch_size))
            if name == setting.pipeline else current.max_batch_size,
            max_queue_delay_us=int(batching.get("max_queue_delay_microseconds",
                                                batching.get("maxQueueDelayMicroseconds", 0))),
            preferred_batch_size=tuple(int(size) for size in batching.get(
                "preferred_batch_size", batching.get("preferredBatchSize", ()))))
    return setting


def measure_workload(workload: Workload, args: argparse.Namespace, scratch: Path) -> list[Row]:
    budget = args.budget_ms or workload.budget_ms
    print(f"\n== {workload.title}: tune ({args.minutes:g} min)", flush=True)
    tuning = tune(workload.pipeline, budget, minutes=args.minutes, queue_policy=False,
                  build_keywords=workload.keywords, log=print)
    root = scratch / workload.key / "models"
    built = build_pipeline_model(workload.pipeline, root, **workload.keywords)
    served = [m.name for m in built.models if not m.in_process]
    baseline = read_setting(root, built.pipeline_model, served)
    input_data = write_input_data(built.signature, workload.pipeline.examples,
                                  scratch / workload.key / "input.json")
    rows = [Row("builder's defaults", baseline.describe()),
            Row("tune", tuning.chosen.setting.describe(), search_s=tuning.search_s,
                searched=len(tuning.trials))]
    settings = [baseline, tuning.chosen.setting]
    if args.analyzer:
        from benchmarks.model_analyzer_run import run_model_analyzer

        print(f"== {workload.title}: Model Analyzer", flush=True)
        found = run_model_analyzer(
            root, built.pipeline_model, served, budget, input_data,
            scratch / workload.key / "analyzer", extra_config={
                "run_config_search_max_instance_count": os.cpu_count() or 1,
                "run_config_search_max_concurrency": MAX_CONCURRENCY})
        setting = analyzer_setting(found.config, baseline)
        settings.append(setting)
        rows.append(Row("Model Analyzer (quick)", setting.describe(), search_s=found.search_s,
                        searched=found.configs_measured, ended=found.finished))
    with ServingTrial(root, built.pipeline_model, perf_analyzer(), input_data, budget,
                      args.measurement_ms, check=answers_check(workload), log=print) as trial:
        for run in range(args.runs):
            for row, setting in zip(rows, settings, strict=True):
                start = row.runs[-1].concurrency if row.runs else 1
                row.runs.append(trial(setting, start))
                print(f"run {run + 1} {row.setting}: {row.runs[-1].rate:.0f} req/s, p99 "
                      f"{row.runs[-1].p99_ms:.1f} ms at {row.runs[-1].concurrency}", flush=True)
    return rows


def whole(only: str) -> bool:
    """Whether ``--only`` names every workload, in any order."""
    return set(only.split(",")) == set(workloads())


def heading(only: str) -> str:
    """The whole comparison's section, or one of its own for a part of the workloads."""
    if whole(only):
        return SECTION
    return f"{SECTION}: " + ", ".join(workloads()[key].title for key in only.split(","))


def chart_path(only: str) -> Path:
    if whole(only):
        return CHART
    return CHART.with_name(f"{CHART.stem}_{only.replace(',', '_')}{CHART.suffix}")


def section(results: dict[str, list[Row]], args: argparse.Namespace, began: str,
            ended: str) -> str:
    budgets = {key: args.budget_ms or workloads()[key].budget_ms for key in results}
    only = "" if whole(args.only) else f" --only {args.only}"
    lines = [heading(args.only), "",
             f"Command: `{COMMAND} --minutes {args.minutes:g} --runs {args.runs}{only}` "
             f"({time.strftime('%Y-%m-%d')}, {machine()}; load average "
             f"{began} at the start, {ended} at the end). Host Triton 2.51; each setting served "
             f"by turns {args.runs} times and measured the same way (perf_analyzer on the "
             f"pipeline's own examples in windows of {args.measurement_ms} ms, requests in "
             "flight doubled while the p99 stays within the budget): medians. Tune searched "
             f"in windows of {MEASUREMENT_MS} ms, its default. Every answer to the examples "
             "checked after each load. No queue policy in any of them (Model Analyzer does not "
             "know it).", "",
             "| pipeline | p99 budget | setting | chosen | req/s within the budget | p99 ms | "
             "in flight | vs defaults | search time | settings measured |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for key, rows in results.items():
        base = rows[0].rate
        for row in rows:
            lines.append(
                f"| {workloads()[key].title} | {budgets[key]:g} ms | {row.setting} | "
                f"{row.described} | "
                f"{row.rate:.0f} | {row.p99_ms:.1f} | {row.concurrency} | "
                f"{row.rate / base:.2f}x | "
                + (f"{row.search_s / 60:.1f} min" if row.search_s is not None else "—")
                + ("" if row.ended else " to its last measurement (it did not end)") + " | "
                + (str(row.searched) if row.searched is not None else "—") + " |")
    compared = {key: rows for key, rows in results.items() if len(rows) >= 3}
    if compared:
        lines += ["", "By turns, tune's setting against Model Analyzer's (each pair measured "
                  "back to back):", ""]
    for key, rows in compared.items():
        turns = by_turns(rows[1], rows[2])
        lines.append(f"- {workloads()[key].title}: tune's setting served more in {turns.ahead} "
                     f"of {turns.turns} turns; median ratio {turns.median_ratio:.3f}; sign "
                     f"test p = {turns.sign_test_p:.2g}")
    chart_file = chart_path(args.only)
    lines += ["", f"![req/s within the budget]({chart_file.relative_to(ROOT)})", ""]
    return "\n".join(lines)


def chart(results: dict[str, list[Row]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    names = [row.setting for row in next(iter(results.values()))]
    figure, axes = pyplot.subplots(figsize=(8, 4))
    width = 0.8 / len(names)
    for index, name in enumerate(names):
        values = [next((r.rate / rows[0].rate for r in rows if r.setting == name), 0)
                  for rows in results.values()]
        axes.bar([k + index * width for k in range(len(results))], values, width, label=name)
    axes.set_xticks([k + width * (len(names) - 1) / 2 for k in range(len(results))],
                    [workloads()[key].title for key in results])
    axes.set_ylabel("req/s within the budget, × the builder's defaults")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-ms", type=float, default=None,
                        help="one budget for all (default: 50 ms, the model-bound 100 ms)")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--measurement-ms", type=int, default=2000)
    parser.add_argument("--no-analyzer", dest="analyzer", action="store_false")
    parser.add_argument("--only", default=",".join(workloads()))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    began = f"{os.getloadavg()[0]:.2f}"
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as scratch:
        for key in args.only.split(","):
            results[key] = measure_workload(workloads()[key], args, Path(scratch))
    ended = f"{os.getloadavg()[0]:.2f}"
    if not args.no_write:
        chart(results, chart_path(args.only))
    publish(heading(args.only), section(results, args, began, ended), write=not args.no_write)


if __name__ == "__main__":
    main()
