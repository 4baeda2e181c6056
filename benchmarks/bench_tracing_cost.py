"""What tracing costs the served pipeline (issue 67, item 5).

The text-embedding example's CPU image, built twice — as before and ``--tracing`` — runs as
four containers side by side: the untraced image; the traced image with no endpoint (tracing
off: what a ``--tracing`` image costs when nobody collects); and the traced image exporting over
OTLP/HTTP to a receiver in this process with 1% of the requests sampled
(``OTEL_TRACES_SAMPLER=traceidratio``, ``OTEL_TRACES_SAMPLER_ARG=0.01``) and with every request
(``always_on``). By turns, ``--pairs`` rounds, each starting elsewhere: requests/s with 32 in
flight and the p50 one at a time, every answer compared with the in-process pipeline; medians.
That spans arrive at the receiver from the sampled containers, and none from the others, is
checked. The receiver shares the machine's two cores: the 100% row pays for collecting too.

    python benchmarks/bench_tracing_cost.py [--pairs 7] [--requests 1500] [--no-write]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_serving import (  # noqa: E402
    measure_paired,
    measure_pipeline,
    side_by_side_setup,
)
from benchmarks.report import machine, publish  # noqa: E402
from builder import build_docker_image  # noqa: E402
from builder.verify.container import ServingContainer  # noqa: E402
from builder.verify.weights_source import bridge_gateway  # noqa: E402
from tests.support.otlp_receiver import OtlpReceiver  # noqa: E402

SECTION = "## Tracing: what it costs"
COMMAND = "python benchmarks/bench_tracing_cost.py"
IMAGES = {"untraced": "triton-builder-bench/tracing-cost:untraced",
          "traced": "triton-builder-bench/tracing-cost:traced"}
WAYS = {"image without --tracing": ("untraced", {}),
        "--tracing, no endpoint (off)": ("traced", {}),
        "--tracing, 1% sampled": ("traced", {"OTEL_TRACES_SAMPLER": "traceidratio",
                                            "OTEL_TRACES_SAMPLER_ARG": "0.01"}),
        "--tracing, every request": ("traced", {"OTEL_TRACES_SAMPLER": "always_on"})}
TOP = 32
CHART = ROOT / "benchmarks" / "tracing.png"


def main() -> None:
    arguments, client, workload = side_by_side_setup(__doc__, pairs=7)
    for kind, image in IMAGES.items():
        build_docker_image(workload.pipeline, image, client=client, tracing=kind == "traced",
                           on_log=lambda line: None)
    models = ["pipeline", workload.model]
    try:
        with OtlpReceiver() as receiver:
            endpoint = f"http://{bridge_gateway(client)}:{receiver.port}"
            containers = []
            for name, (kind, environment) in WAYS.items():
                if environment:
                    environment = {**environment, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                                   "OTEL_SERVICE_NAME": name}
                containers.append(ServingContainer(client, IMAGES[kind],
                                                   environment=environment or None))
            endpoints = dict(zip(WAYS, (c.__enter__() for c in containers)))
            try:
                rounds, spans = _measure(workload, models, endpoints, receiver, arguments)
            finally:
                for container in containers:
                    container.__exit__(None, None, None)
    finally:
        for image in IMAGES.values():
            client.images.remove(image, force=True)
    _chart(rounds)
    publish(SECTION, _section(rounds, spans, arguments), write=not arguments.no_write)


def _measure(workload, models, endpoints, receiver, arguments):
    for endpoint in endpoints.values():
        measure_pipeline(workload, endpoint.grpc_url, endpoint.metrics_url, models, TOP, 1)
    time.sleep(2)

    def served(endpoint, concurrency: int, field: str):
        def measure() -> float:
            row = measure_pipeline(workload, endpoint.grpc_url, endpoint.metrics_url, models,
                                   concurrency, 1)
            return getattr(row, field)
        return measure

    rounds = measure_paired(*(served(endpoints[w], TOP, "rate") for w in WAYS),
                            *(served(endpoints[w], 1, "p50_ms") for w in WAYS),
                            pairs=arguments.pairs)
    time.sleep(2)  # the batch processors' last exports
    spans = {name: sum(1 for s in receiver.spans if s.service == name and
                       s.name.startswith("pipeline")) for name in WAYS}
    assert spans["image without --tracing"] == spans["--tracing, no endpoint (off)"] == 0
    assert 0 < spans["--tracing, 1% sampled"] < spans["--tracing, every request"], spans
    return rounds, spans


def _section(rounds: list[tuple[float, ...]], spans: dict[str, int],
             arguments: argparse.Namespace) -> str:
    names = list(WAYS)
    columns = list(zip(*rounds))
    rate = {name: statistics.median(columns[k]) for k, name in enumerate(names)}
    p50 = {name: statistics.median(columns[len(names) + k]) for k, name in enumerate(names)}
    base = names[0]
    lines = [SECTION, "",
             f"Measured on {machine()}, quiet, {time.strftime('%Y-%m-%d')}, with `{COMMAND} "
             f"--pairs {arguments.pairs} --requests {arguments.requests}`: the text-embedding "
             "example's CPU image as four containers side by side — built without and with "
             "`--tracing`, the traced one with no endpoint, with 1% of the requests sampled and "
             f"with every request — measured by turns ({arguments.pairs} rounds, medians), every "
             "answer checked; the spans go over OTLP/HTTP to a receiver on the same two cores.",
             "", f"| | requests/s, {TOP} in flight | vs untraced: median of rounds "
             "(range) | p50 at 1 in flight (ms) | requests traced |", "|---|---|---|---|---|"]
    for k, name in enumerate(names):
        ratios = [a / b for a, b in zip(columns[k], columns[0])]
        lines.append(f"| {name} | {rate[name]:.0f} | {statistics.median(ratios):.3f} "
                     f"({min(ratios):.2f}–{max(ratios):.2f}) | {p50[name]:.3f} "
                     f"({p50[name] - p50[base]:+.3f}) | {spans[name]} |")
    lines += ["", f"![requests/s and p50 per way](benchmarks/{CHART.name})", ""]
    return "\n".join(lines)


def _chart(rounds: list[tuple[float, ...]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(WAYS)
    columns = list(zip(*rounds))
    fig, (rate, p50) = plt.subplots(1, 2, figsize=(9, 3.4))
    x = range(len(names))
    labels = [name.replace(", ", ",\n") for name in names]
    rate.bar(x, [statistics.median(columns[k]) for k in x], 0.6)
    rate.set_xticks(list(x), labels, fontsize=7)
    rate.set_ylabel(f"requests/s at {TOP} in flight")
    p50.bar(x, [statistics.median(columns[len(names) + k]) for k in x], 0.6, color="tab:orange")
    p50.set_xticks(list(x), labels, fontsize=7)
    p50.set_ylabel("p50 at 1 in flight (ms)")
    fig.tight_layout()
    fig.savefig(CHART, dpi=110)


if __name__ == "__main__":
    main()
