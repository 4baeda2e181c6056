"""Ready means warm: the first request after ``/v2/health/ready`` against the next 20 (issue 66).

Each example pipeline of ``pipelines/`` and the issue's own kinds (``cold_pipelines``:
transformers' ViT image processor before a small ``ViTModel``; ViT-base hidden states; a
ResNet-18 classifier; a BERT-base sentence embedding; a CLIP image-text score;
sentence-transformers' ``encode`` and TrOCR's ``generate()`` in plain functions) is built once
(CPU base, as ``nox -s demo`` builds); its image is then started ``--runs`` times each way,
side by side in one run: as built (the warm-up, readiness held by the ready gate until the
examples went through the front end),
without the gate (``-e TRITON_BUILDER_READY_GATE=/none``: as images were before it), and as a
replica started before any warm-up existed (every model's ``config.pbtxt`` mounted over the
image's without its ``model_warmup``, ``-e TRITON_BUILDER_WARM_UP=0``, no gate). Each start
is timed from ``docker start`` to ``/v2/health/ready``; then 21 requests, one at a time, with
distinct inputs, every answer compared with the in-process pipeline. The figures: the first
request's latency over the median of the next 20 (the acceptance: at most 2x), a request after
0.2 s of idle on the warm server against the same median (what the pause alone costs), and what
the warm-up and the gate cost at start, per example.

    python benchmarks/bench_warm_start.py [--runs 3] [--no-write]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cold_pipelines import PIPELINES as COLD_PIPELINES  # noqa: E402
from benchmarks.report import machine, publish  # noqa: E402
from builder import build_docker_image  # noqa: E402
from builder.client.pipeline import Client  # noqa: E402
from builder.engine import ensure_engine  # noqa: E402
from builder.engine.image_files import read_image_files  # noqa: E402
from builder.image.serving_dockerfile import DEFAULT_MODEL_REPOSITORY  # noqa: E402
from builder.repository.model_config import CONFIG_FILE, dumps_config, loads_config  # noqa: E402
from builder.runtime.supervisor.ready_gate import READY_GATE_VARIABLE  # noqa: E402
from builder.runtime.warm_up import MAX_EXAMPLES, SWITCH  # noqa: E402
from builder.verify.container import ServingContainer  # noqa: E402
from builder.verify.equality import check_same  # noqa: E402
from tests.support.example_inputs import EXAMPLES  # noqa: E402

SECTION = "## Warm start: the first request after ready"
COMMAND = "python benchmarks/bench_warm_start.py"
CHART = ROOT / "benchmarks" / "warm_start.png"
IMAGE = "triton-builder-bench/warm-start"
REQUESTS = 21
IDLE_S = 0.2
"""The pause before one more request once the 21 are answered: about what the first request
follows (``ServingContainer`` polls readiness every 0.2 s), on a server by then warm."""
WAYS = ("ready gate", "no gate", "no warm-up")
HOW = (
    "Ready gate: the supervisor holds `/v2/health/ready` closed until the pipeline's examples "
    "have gone through Triton's own HTTP front end, twice "
    "(`builder/runtime/supervisor/ready_gate.py`): the front end's first inference and the "
    "first calls over BLS are paid before ready. No gate: the same image with "
    f"`-e {READY_GATE_VARIABLE}=/none` (as images were before the gate: the models' warm-up "
    "and the pipeline's examples in `initialize` only). No warm-up: neither, and every model's "
    f"config without its `model_warmup` mounted over the image's, `-e {SWITCH}=0`. Start to "
    "ready is read by polling `/v2/health/ready`. After idle: once the 21 are answered, "
    f"{IDLE_S:g} s without a request (about what the first request follows: readiness is polled "
    "every 0.2 s), then one more, on a server by then warm by any account: what a request "
    "pays for the pause alone."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--only", nargs="+", metavar="PIPELINE",
                        choices=sorted([*EXAMPLES, *COLD_PIPELINES]),
                        help="these pipelines alone, printed and not written")
    arguments = parser.parse_args()
    write = not (arguments.no_write or arguments.only)
    client = ensure_engine()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="bench-warm-start-") as workdir:
        chosen = set(arguments.only or [*EXAMPLES, *COLD_PIPELINES])
        pipelines = {**{name: made for name, made in EXAMPLES.items() if name in chosen},
                     **{name: build(REQUESTS + 1) for name, build in COLD_PIPELINES.items()
                        if name in chosen}}
        for name, (pipeline, inputs) in sorted(pipelines.items()):
            reference = f"{IMAGE}-{name.replace('_', '-')}:1"
            build_docker_image(pipeline, reference, client=client)
            no_gate = {READY_GATE_VARIABLE: "/none"}
            ways = {"ready gate": {}, "no gate": dict(environment=no_gate),
                    "no warm-up": dict(environment={**no_gate, SWITCH: "0"}, volumes=(
                        _without_warm_up(client, reference, pipeline, Path(workdir) / name)))}
            calls = [inputs[i % len(inputs)] for i in range(REQUESTS + 1)]
            expected = [pipeline(*_arguments(call)) for call in calls]
            for _ in range(arguments.runs):
                for way in WAYS:  # side by side: one start of each in turn
                    rows.setdefault((name, way), []).append(
                        _start_and_ask(client, reference, ways[way], calls, expected))
            rows[name, "examples"] = min(len(pipeline.examples), MAX_EXAMPLES)
    publish(SECTION, _section(rows, arguments.runs), write=write)
    if write:
        _chart(rows)


def _without_warm_up(client, reference: str, pipeline, directory: Path) -> dict:
    """Docker binds that put each model's config, without its ``model_warmup``, over the
    image's."""
    models = ["pipeline", *(op.name for op in pipeline.model_ops())]
    paths = [f"{DEFAULT_MODEL_REPOSITORY}/{model}/{CONFIG_FILE}" for model in models]
    volumes = {}
    for model, (path, text) in zip(models, read_image_files(client, reference, paths).items()):
        config = loads_config(text.decode())
        del config.model_warmup[:]
        (directory / model).mkdir(parents=True)
        (directory / model / CONFIG_FILE).write_text(dumps_config(config, model))
        volumes[str(directory / model / CONFIG_FILE)] = {"bind": path, "mode": "ro"}
    return volumes


def _start_and_ask(client, reference: str, options: dict, calls: list,
                   expected: list) -> dict:
    serving = ServingContainer(client, reference, **options)
    started = time.perf_counter()
    try:
        endpoint = serving.start()
        ready_s = time.perf_counter() - started
        latencies = []
        with Client(f"grpc://{endpoint.grpc_url}/pipeline") as served:
            served.codec  # noqa: B018 - connected, the model's config read: the client is warm
            for index, (call, answer) in enumerate(zip(calls, expected, strict=True)):
                if index == REQUESTS:
                    time.sleep(IDLE_S)
                begun = time.perf_counter()
                got = served(*_arguments(call))
                latencies.append(time.perf_counter() - begun)
                check_same(got, answer, where=f"{reference} {call!r:.40}")
    finally:
        serving.remove()
    rest = statistics.median(latencies[1:REQUESTS])
    return {"ready_s": ready_s, "first_ms": latencies[0] * 1000, "rest_ms": rest * 1000,
            "ratio": latencies[0] / rest, "idle_ms": latencies[REQUESTS] * 1000,
            "idle_ratio": latencies[REQUESTS] / rest}


def _arguments(call) -> tuple:
    """A call's input values: a tuple for a pipeline of several inputs, else the one value."""
    return call if isinstance(call, tuple) else (call,)


def _median(rows: dict, key: tuple, field: str) -> float:
    return statistics.median(run[field] for run in rows[key])


def _section(rows: dict, runs: int) -> str:
    names = sorted({key[0] for key in rows})
    lines = [SECTION, "",
             f"Measured on {machine()}, quiet, {time.strftime('%Y-%m-%d')}, with `{COMMAND} "
             f"--runs {runs}`: each image started {runs} times each way, in turn; medians. "
             f"Start: `docker start` to `/v2/health/ready`; then {REQUESTS} requests one at a "
             "time (distinct inputs, every answer checked against the in-process pipeline); "
             "the client connected first (its channel open, the model's config read: what "
             "its first call would otherwise add is the client's, not the server's); "
             "first / rest: the first request's latency over the median of the next "
             f"{REQUESTS - 1}. {HOW}", "",
             "| pipeline | examples | way | start to ready (s) | first (ms) | rest (ms) | "
             f"first / rest | after {IDLE_S:g} s idle (ms) | idle / rest |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        for way in WAYS:
            key = (name, way)
            lines.append(f"| {name} | {rows[name, 'examples']} | {way} | "
                         f"{_median(rows, key, 'ready_s'):.2f} | "
                         f"{_median(rows, key, 'first_ms'):.1f} | "
                         f"{_median(rows, key, 'rest_ms'):.1f} | "
                         f"{_median(rows, key, 'ratio'):.2f}x | "
                         f"{_median(rows, key, 'idle_ms'):.1f} | "
                         f"{_median(rows, key, 'idle_ratio'):.2f}x |")
    lines += ["", "What each costs at start (the difference of the medians of start to ready): "
              "the warm-up (no gate against no warm-up) and the gate (against no gate), per "
              "example:", ""]
    for name in names:
        examples = rows[name, "examples"]
        warm, gate = (_median(rows, (name, way), "ready_s") - _median(rows, (name, base), "ready_s")
                      for way, base in (("no gate", "no warm-up"), ("ready gate", "no gate")))
        lines.append(f"- {name}: warm-up {warm * 1000:.0f} ms ({warm * 1000 / examples:.0f} ms "
                     f"per example), gate {gate * 1000:.0f} ms ({gate * 1000 / examples:.0f} ms "
                     "per example)")
    lines += ["", f"![first request after ready]({CHART.relative_to(ROOT)})", ""]
    return "\n".join(lines)


def _chart(rows: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = sorted({key[0] for key in rows})
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for k, way in enumerate(WAYS):
        ax.bar(x + (k - 1) * 0.27, [_median(rows, (n, way), "ratio") for n in names], 0.27,
               label=way)
    ax.axhline(2.0, color="grey", linestyle="--", linewidth=1, label="2x (the acceptance)")
    ax.set_xticks(x, names)
    ax.set_ylabel("first request / median of the next 20")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(CHART, dpi=110)


if __name__ == "__main__":
    main()
