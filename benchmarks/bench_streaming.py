"""Streaming: time to the first item and items per second, beside the same pipeline answered whole.

The text recognizer twice on one host tritonserver: ``pipeline`` (the whole text in one answer)
and ``streaming_pipeline`` (each character sent as it is decoded, a decoupled model); with the
example's tiny decoder, then with one whose step costs what TrOCR-small's does
(``make_pipeline(deep_layers=6)``: six transformer decoder layers of 256 beside it). Inputs are
text lines whose decode takes 12 steps (11 characters and the end token, or 12 characters), so
the whole answer waits for 12 decoder calls and the first item for one. The streaming pipeline
is served twice: with its operator's ``admits_rows`` on (streams that arrive while others
decode join their loop between steps, each step's decoder call shared by all) and off (each
dynamic batch of streams decodes on a loop of its own, beside the others), whatever the
example's default for that decoder. Load: asyncio clients in
the benchmark process, ``N`` requests in flight at 1, 8 and 32, each sending the next line as
soon as its last answer ended; every streamed sequence equal to ``pipe.stream(...)`` and every
whole answer to ``pipe(...)``. Medians of ``--runs`` runs.

    python benchmarks/bench_streaming.py [--requests 256] [--runs 3] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_serving import machine_speed_ms  # noqa: E402
from benchmarks.report import machine, publish  # noqa: E402
from builder import build_pipeline_model  # noqa: E402
from builder.client import AsyncClient  # noqa: E402
from builder.tritonserver.host_process import TritonServer  # noqa: E402
from pipelines import text_recognizer  # noqa: E402

SECTION = "## Streaming: time to the first item, beside the whole answer"
IN_FLIGHT = (1, 8, 32)
STEPS = 12
CHART = ROOT / "benchmarks" / "streaming_latency.png"


DECODERS = {"the example's decoder": 0, "a decoder with TrOCR-small's step": 6}
"""Each decoder measured: its ``deep_layers``."""


def twelve_step_lines(whole, count: int = 24) -> list[np.ndarray]:
    """Rendered text lines whose greedy decode by ``whole`` (a pipeline) runs the full 12
    steps."""
    rng = np.random.default_rng(7)
    lines: list[np.ndarray] = []
    seed = 0
    while len(lines) < count:
        seed += 1
        text = "".join(rng.choice(list(text_recognizer.ALPHABET), int(rng.integers(3, 8))))
        line = text_recognizer.render(text, seed)
        if len(whole(line)) >= STEPS - 1:
            lines.append(line)
    return lines


@dataclass
class Run:
    """One run at one concurrency: per request, first item and end (ms); items per second."""

    first_ms: list[float]
    total_ms: list[float]
    items_per_s: float


async def _streamed(client: AsyncClient, line: np.ndarray, expected: list[str]
                    ) -> tuple[float, int]:
    """One stream: when its first item came (perf_counter), how many items it had."""
    got, first = [], 0.0
    async for item in client.stream(line):
        first = first or time.perf_counter()
        got.append(item)
    if got != expected:
        raise AssertionError(f"streamed {got} against {expected}")
    return first, len(got)


async def _whole(client: AsyncClient, line: np.ndarray, expected: str) -> tuple[float, int]:
    """One whole answer: when it came, how many items (characters) it held."""
    text = await client(line)
    if text != expected:
        raise AssertionError(f"whole {text!r} against {expected!r}")
    return time.perf_counter(), len(text)


async def _run(url: str, call, lines: list[np.ndarray], expected: list, in_flight: int,
               requests: int) -> Run:
    """``requests`` calls, ``in_flight`` at a time, each client sending its next as soon as
    its last ended; ``call(client, line, expected) -> (first item's time, items)``."""
    first_ms, total_ms = [], []
    items = 0
    order = [i % len(lines) for i in range(requests)]

    async def worker(share: list[int], client: AsyncClient) -> None:
        nonlocal items
        for index in share:
            sent = time.perf_counter()
            first, count = await call(client, lines[index], expected[index])
            first_ms.append((first - sent) * 1000)
            total_ms.append((time.perf_counter() - sent) * 1000)
            items += count

    async with AsyncClient(url, timeout=60) as client:
        await client.codec()
        started = time.perf_counter()
        await asyncio.gather(*(worker(order[k::in_flight], client) for k in range(in_flight)))
        wall = time.perf_counter() - started
    return Run(first_ms, total_ms, items / wall)


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def _median_runs(runs: list[Run]) -> dict[str, float]:
    return {
        "first_p50": statistics.median(_p(r.first_ms, 50) for r in runs),
        "first_p99": statistics.median(_p(r.first_ms, 99) for r in runs),
        "total_p50": statistics.median(_p(r.total_ms, 50) for r in runs),
        "items_per_s": statistics.median(r.items_per_s for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256, help="requests per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per row (median shown)")
    parser.add_argument("--no-write", action="store_true",
                        help="print only (no BENCHMARKS.md section, no chart)")
    args = parser.parse_args()

    speed = [machine_speed_ms()]
    rows: dict[tuple[str, str, int], dict[str, float]] = {}
    for decoder, deep_layers in DECODERS.items():
        whole_pipe = text_recognizer.make_pipeline(deep_layers=deep_layers)
        stream_pipe = text_recognizer.make_pipeline(streaming=True, deep_layers=deep_layers)
        lines = twelve_step_lines(whole_pipe)
        whole_expected = [whole_pipe(line) for line in lines]
        stream_expected = [list(stream_pipe.stream(line)) for line in lines]
        assert ["".join(s) for s in stream_expected] == whole_expected
        beside_pipe = text_recognizer.make_pipeline(streaming=True, deep_layers=deep_layers)
        for pipe, joins in ((stream_pipe, True), (beside_pipe, False)):
            pipe.plan.nodes[pipe.streaming.node].op.admits_rows = joins
        served = {"whole": (whole_pipe, _whole, whole_expected),
                  "stream": (stream_pipe, _streamed, stream_expected),
                  "beside": (beside_pipe, _streamed, stream_expected)}
        with tempfile.TemporaryDirectory(prefix="bench-streaming-") as workdir:
            root = Path(workdir) / "whole"
            for name, (pipe, _, _) in served.items():
                build_pipeline_model(pipe, Path(workdir) / name, name=name)
                if name != "whole":  # the same two model operators: one repository holds all
                    shutil.copytree(Path(workdir) / name / name, root / name)
            with TritonServer(root) as server:
                urls = {name: f"grpc://{server.grpc_url}/{name}" for name in served}
                for name, (_, call, expected) in served.items():  # warm each
                    asyncio.run(_run(urls[name], call, lines, expected, 8, 64))
                for in_flight in IN_FLIGHT:
                    runs: dict[str, list[Run]] = {name: [] for name in served}
                    for _ in range(args.runs):  # side by side, by turns
                        for name, (_, call, expected) in served.items():
                            runs[name].append(asyncio.run(_run(
                                urls[name], call, lines, expected, in_flight, args.requests)))
                    for name in served:
                        rows[decoder, name, in_flight] = _median_runs(runs[name])
                    print(decoder, in_flight, {name: rows[decoder, name, in_flight]
                                               for name in served}, flush=True)
    speed.append(machine_speed_ms())
    if not args.no_write:
        _chart(rows)
    publish(SECTION, _report(rows, args, speed), write=not args.no_write)


def _report(rows: dict, args: argparse.Namespace, speed: list[float]) -> str:
    command = "python benchmarks/bench_streaming.py" + (
        f" --requests {args.requests}" if args.requests != 256 else "") + (
        f" --runs {args.runs}" if args.runs != 3 else "")
    lines = [
        SECTION, "",
        f"`{command}` — {machine()}; {args.requests} requests per run, median of {args.runs} "
        "runs, whole, streamed and streamed-beside runs by turns; host tritonserver, the CPU "
        "defaults "
        "(models in the pipeline model through ONNX Runtime); asyncio gRPC clients in the "
        f"benchmark process. The text recognizer on lines whose decode takes {STEPS} steps; "
        "every streamed sequence equal to `pipe.stream(...)`, every whole answer to `pipe(...)`. "
        "Machine speed (the same fixed work before and after, lower is faster): "
        f"{speed[0]:.1f}, {speed[1]:.1f} ms ({max(speed) / min(speed) - 1:.0%} apart).", "",
        "![time to the first item and to the whole answer, and items per second]"
        f"({CHART.relative_to(ROOT)})", "",
    ]
    for decoder in DECODERS:
        lines += _table(rows, decoder)
    joined = {decoder: [rows[decoder, "stream", n]["items_per_s"]
                        / rows[decoder, "beside", n]["items_per_s"] - 1 for n in IN_FLIGHT[1:]]
              for decoder in DECODERS}
    lines += [
        "**Streams joining one loop (continuous batching) against each batch of streams on a "
        "loop of its own**, items/s at " + " and ".join(str(n) for n in IN_FLIGHT[1:])
        + " in flight: " + "; ".join(
            f"{decoder}, {', '.join(f'{r:+.0%}' for r in ratios)}"
            for decoder, ratios in joined.items()) + ".", "",
        "Joining pays where a step's model call costs more than its compute (the example's "
        "decoder): the streams in flight share fewer, larger calls. It costs where the compute "
        "dominates, on a CPU: the joined loop runs its calls one after another (rows at "
        "different steps padded to the longest within a quarter of it, "
        "`builder/runtime/model_batching.py`), and a stream that arrives waits for the running "
        "step before its first, where loops side by side start at once, each on a core of its own "
        "and without padding. For such a decoder on a CPU leave `admits_rows` off; on a GPU one "
        "call for every running sequence is what batching is for (not measured here: no "
        "GPU).", ""]
    return "\n".join(lines) + "\n"


def _table(rows: dict, decoder: str) -> list[str]:
    shape = ("6 transformer decoder layers of 256 beside the example's layer"
             if DECODERS[decoder] else "one attention layer of 32")
    lines = [
        f"**{decoder[0].upper()}{decoder[1:]}** ({shape}):", "",
        "| in flight | whole: p50 ms | streamed, one loop joined: first item p50 ms | "
        "first item p99 ms | last item p50 ms | first / whole | items/s whole | "
        "items/s streamed, joined | streamed, loops side by side: items/s | first item p50 ms | "
        "last item p50 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for in_flight in IN_FLIGHT:
        whole, streamed = rows[decoder, "whole", in_flight], rows[decoder, "stream", in_flight]
        beside = rows[decoder, "beside", in_flight]
        lines.append(
            f"| {in_flight} | {whole['total_p50']:.2f} | {streamed['first_p50']:.2f} | "
            f"{streamed['first_p99']:.2f} | {streamed['total_p50']:.2f} | "
            f"{streamed['first_p50'] / whole['total_p50']:.2f} | {whole['items_per_s']:.0f} | "
            f"{streamed['items_per_s']:.0f} | {beside['items_per_s']:.0f} | "
            f"{beside['first_p50']:.2f} | {beside['total_p50']:.2f} |")
    whole, streamed = rows[decoder, "whole", 1], rows[decoder, "stream", 1]
    ratio = streamed["first_p50"] / whole["total_p50"]
    per_item = (streamed["total_p50"] - streamed["first_p50"]) / (STEPS - 2)
    lines += ["", f"Goal (issue 41): the first item at 1 in flight within 1/5 of the whole "
              f"answer's latency for a {STEPS}-step decode: {ratio:.2f} "
              f"({'met' if ratio <= 0.2 else 'missed'}). The whole answer, all {STEPS} decoder "
              f"steps included, takes {whole['total_p50']:.2f} ms; streamed items come "
              f"{per_item:.2f} ms apart after the first.", ""]
    if not DECODERS[decoder]:
        lines += ["Why this decoder misses it: a step of it costs little beside what every "
                  "request pays (the request decoded, the encoder, the gRPC round trip); the "
                  "first item pays that and what a stream adds (a thread for its batch, the "
                  "stream's setup, a response sender's round trip from the stub to the "
                  "server). A response, not a step, is what costs: with it, streaming costs "
                  "throughput (items/s) and buys no earlier first item.", ""]
    return lines


def _chart(rows: dict) -> None:
    """Per decoder: the p50 latencies (whole, first item, last item; the loop joined), and
    items/s whole, joined and with loops side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.arange(len(IN_FLIGHT))
    width = 0.27
    bars = {
        "p50 ms": [("whole answer", "whole", "total_p50"),
                   ("streamed, joined: first item", "stream", "first_p50"),
                   ("streamed, joined: last item", "stream", "total_p50")],
        "items/s": [("whole answers", "whole", "items_per_s"),
                    ("streamed, one loop joined", "stream", "items_per_s"),
                    ("streamed, loops side by side", "beside", "items_per_s")],
    }
    fig, axes = plt.subplots(len(bars), len(DECODERS), figsize=(11, 7.2))
    for row, (measure, series) in zip(axes, bars.items(), strict=True):
        for ax, decoder in zip(row, DECODERS, strict=True):
            for k, (label, mode, key) in enumerate(series):
                ax.bar(x + (k - 1) * width, [rows[decoder, mode, n][key] for n in IN_FLIGHT],
                       width, label=label)
            ax.set_xticks(x, [str(n) for n in IN_FLIGHT])
            ax.set_xlabel("requests in flight")
            ax.set_ylabel(measure)
            ax.set_title(decoder, fontsize=9)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(CHART, dpi=110)


if __name__ == "__main__":
    main()
