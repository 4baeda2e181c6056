"""What the per-operator latency histograms cost the served pipeline (issue 67, items 2 and 5).

The text-embedding example's CPU image, built once, runs as two containers side by side: as
built (histograms on: each call of each operator observed, a message from the stub to the
server once a second per observation) and with ``-e TRITON_BUILDER_HISTOGRAMS=off`` (the
counters only). By turns, ``--pairs`` rounds, each round starting with the other one: requests/s
with 32 in flight and the p50 one at a time, every answer compared with the in-process pipeline;
medians. The histograms' presence on each container's metrics endpoint is checked first.

    python benchmarks/bench_metrics_cost.py [--pairs 7] [--requests 1500] [--no-write]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import urllib.request
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
from builder.runtime.operator_metrics import HISTOGRAMS_VARIABLE, OperatorMetrics  # noqa: E402
from builder.verify.container import ServingContainer  # noqa: E402

SECTION = "## Metrics: what the latency histograms cost"
COMMAND = "python benchmarks/bench_metrics_cost.py"
IMAGE = "triton-builder-bench/metrics-cost:1"
WAYS = {"histograms (default)": {}, "counters only": {HISTOGRAMS_VARIABLE: "off"}}
TOP = 32


def main() -> None:
    arguments, client, workload = side_by_side_setup(__doc__, pairs=7)
    build_docker_image(workload.pipeline, IMAGE, client=client, on_log=lambda line: None)
    models = ["pipeline", workload.model]
    rounds: list[tuple[float, ...]] = []
    try:
        with ServingContainer(client, IMAGE) as on, \
                ServingContainer(client, IMAGE, environment=WAYS["counters only"]) as off:
            endpoints = dict(zip(WAYS, (on, off)))
            for endpoint in endpoints.values():
                measure_pipeline(workload, endpoint.grpc_url, endpoint.metrics_url, models,
                                 TOP, 1)  # warm, and the operators' metrics sent
            time.sleep(2)
            for name, endpoint in endpoints.items():
                with urllib.request.urlopen(f"http://{endpoint.metrics_url}/metrics") as page:
                    has = f"{OperatorMetrics.LATENCY}_bucket" in page.read().decode()
                assert has == (name == "histograms (default)"), (name, has)

            def served(endpoint, concurrency: int, field: str):
                def measure() -> float:
                    row = measure_pipeline(workload, endpoint.grpc_url, endpoint.metrics_url,
                                           models, concurrency, 1)
                    return getattr(row, field)
                return measure

            rounds = measure_paired(*(served(endpoints[w], TOP, "rate") for w in WAYS),
                                    *(served(endpoints[w], 1, "p50_ms") for w in WAYS),
                                    pairs=arguments.pairs)
    finally:
        client.images.remove(IMAGE, force=True)
    publish(SECTION, _section(rounds, arguments), write=not arguments.no_write)


def _section(rounds: list[tuple[float, ...]], arguments: argparse.Namespace) -> str:
    names = list(WAYS)
    columns = list(zip(*rounds))
    rate = {name: statistics.median(columns[k]) for k, name in enumerate(names)}
    p50 = {name: statistics.median(columns[2 + k]) for k, name in enumerate(names)}
    ratio = [on / off for on, off in zip(columns[0], columns[1])]
    lines = [SECTION, "",
             f"Measured on {machine()}, quiet, {time.strftime('%Y-%m-%d')}, with `{COMMAND} "
             f"--pairs {arguments.pairs} --requests {arguments.requests}`: the text-embedding "
             "example's CPU image as two containers side by side, with the latency histograms "
             f"and with `-e {HISTOGRAMS_VARIABLE}=off`, measured by turns ({arguments.pairs} "
             "rounds, medians), every answer checked.", "",
             f"| | requests/s, {TOP} in flight | p50 at 1 in flight (ms) |", "|---|---|---|"]
    for name in names:
        lines.append(f"| {name} | {rate[name]:.0f} | {p50[name]:.3f} |")
    lines += ["", f"Histograms on / off, requests/s at {TOP} in flight, round by round: "
              f"{', '.join(f'{r:.3f}' for r in ratio)} (median {statistics.median(ratio):.3f}); "
              f"p50 at 1 in flight {p50[names[0]] - p50[names[1]]:+.3f} ms.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
