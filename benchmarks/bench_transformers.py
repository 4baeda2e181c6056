"""A BERT-base sentence embedding served, side by side with it eager in process (issue 38).

The pipeline: a real ``BertTokenizerFast`` (one token length per text), a raw ``BertModel`` of
BERT-base's size (12 layers, hidden 768, random weights from its config: nothing downloaded)
whose ``last_hidden_state`` the pipeline takes by name, and a masked mean pool. Texts of mixed
lengths (4 to about 60 tokens). Measured in one run, in turns, medians of ``--runs``:

* **served, padded within the batch** — ``pad_values`` for ``input_ids`` and
  ``attention_mask``: the rows of a dynamic batch share model calls by length, each padded to
  the longest row of its call (:mod:`builder.runtime.model_batching`);
* **served, one model call per length** — the same without ``pad_values``;
* **served, padded to a fixed 128 tokens** — what users write without either: the tokenizer
  pads every text to 128, so every row has one shape;
* **eager in process** — ``pipeline(text)`` one call after another, transformers on torch.

Served at 1, 8 and 32 requests in flight (gRPC clients in threads on this machine, closed loop);
every served answer is compared with the in-process pipeline's. The table and a chart go into
``BENCHMARKS.md``.

    python benchmarks/bench_transformers.py [--runs 3] [--seconds 15] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.report import BENCHMARKS, machine, publish  # noqa: E402
from builder import ModelOp, build_docker_image, pipe, vectorized  # noqa: E402
from builder.client.pipeline import Client  # noqa: E402
from builder.engine import docker_client  # noqa: E402
from builder.verify.container import ServingContainer  # noqa: E402
from builder.verify.equality import check_same  # noqa: E402

HEADING = "## Hugging Face BERT-base: served vs eager"
CONCURRENCY = (1, 8, 32)
TEXTS = 64
CHART = Path(__file__).resolve().parent / "transformers_throughput.png"
IMAGE = "triton-builder-bench/bert-base-{}:1"
WORDS = ("the quick brown fox jumps over a lazy dog while seals and stamps of river offices "
         "are read by machines that learn to see text in images of paper").split()
GOAL = 2.0
"""Requests/s served at 32 in flight against eager's, padded within the batch."""


class Tokenize:
    """One text → ``input_ids``, ``attention_mask``: its own length, or ``fixed`` tokens."""

    def __init__(self, tokenizer: Any, fixed: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.fixed = fixed

    def __call__(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        options = (dict(padding="max_length", max_length=self.fixed, truncation=True)
                   if self.fixed else {})
        encoded = self.tokenizer(text, return_tensors="np", **options)
        return encoded["input_ids"][0], encoded["attention_mask"][0]


@vectorized
def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask[:, :, None].astype(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1)


def texts(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(2, 40)))) for _ in range(count)]


def pipelines(workdir: Path) -> dict[str, Any]:
    """The three served variants (one BERT-base module, seeded)."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(set(WORDS)),
             *"abcdefghijklmnopqrstuvwxyz"]
    # from the vocabulary itself: transformers 5 ignores vocab_file= (every word [UNK])
    tokenizer = BertTokenizerFast(vocab=dict(zip(words, range(len(words)))))
    assert tokenizer.vocab_size == len(words) and "[UNK]" not in tokenizer.tokenize(
        " ".join(sorted(set(WORDS))))
    torch.manual_seed(0)
    bert = BertModel(BertConfig()).eval()  # BERT-base: 12 layers, hidden 768, 110M parameters
    made = {}
    per_text = {"input_ids": [0], "attention_mask": [0], "last_hidden_state": [0]}
    for variant, fixed in (("padded", None), ("per-length", None), ("fixed128", 128)):
        tokenize = Tokenize(tokenizer, fixed)
        options = {} if fixed else dict(dynamic_axes=per_text)
        if variant == "padded":
            options["pad_values"] = {"input_ids": 0, "attention_mask": 0}
        encoder = ModelOp(bert, example_inputs=tokenize("the quick brown fox"), name="bert",
                          output_names=["last_hidden_state"], **options)
        made[variant] = (pipe.input("text")
                         .map("text", ("ids", "mask"), tokenize)
                         .map(("ids", "mask"), "last_hidden_state", encoder)
                         .map(("last_hidden_state", "mask"), "vec", mean_pool)
                         .output("vec")
                         .with_example("the quick brown fox"))
    return made


def measure_served(url: str, calls: Sequence[str], expected: Sequence[Any], concurrency: int,
                   seconds: float) -> tuple[float, float, float]:
    """Closed loop: ``concurrency`` threads, each with its own client, for ``seconds``;
    requests/s, p50 and p99 in ms. Every answer is checked."""
    latencies: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def loop(offset: int) -> None:
        mine = []
        try:
            with Client(url, timeout=120) as client:
                index = offset
                while time.perf_counter() < deadline:
                    k = index % len(calls)
                    began = time.perf_counter()
                    answer = client(calls[k])
                    mine.append(time.perf_counter() - began)
                    check_same(answer, expected[k], 1e-3, where=f"text {k}")
                    index += concurrency
        except BaseException as error:  # noqa: BLE001 - reported after the threads end
            errors.append(error)
        with lock:
            latencies.extend(mine)

    started = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    elapsed = time.perf_counter() - started
    return (len(latencies) / elapsed, *_percentiles(latencies))


def first_request(url: str, calls: Sequence[str], expected: Sequence[Any],
                  after: int = 20) -> tuple[float, float]:
    """The first request's latency after ready, and the median of the next ``after`` (ms)."""
    latencies = []
    with Client(url, timeout=120) as client:
        for k in range(after + 1):
            began = time.perf_counter()
            answer = client(calls[k % len(calls)])
            latencies.append(1000 * (time.perf_counter() - began))
            check_same(answer, expected[k % len(calls)], 1e-3, where=f"text {k}")
    return latencies[0], statistics.median(latencies[1:])


def measure_eager(pipeline: Callable[[str], Any], calls: Sequence[str],
                  seconds: float) -> tuple[float, float, float]:
    latencies = []
    started = time.perf_counter()
    index = 0
    while time.perf_counter() - started < seconds:
        began = time.perf_counter()
        pipeline(calls[index % len(calls)])
        latencies.append(time.perf_counter() - began)
        index += 1
    return (len(latencies) / (time.perf_counter() - started), *_percentiles(latencies))


def _percentiles(latencies: Sequence[float]) -> tuple[float, float]:
    ordered = sorted(latencies)
    return (1000 * ordered[len(ordered) // 2],
            1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))])


def _median(runs: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    return tuple(statistics.median(values) for values in zip(*runs))  # type: ignore[return-value]


def chart(rows: dict[str, dict[int, tuple[float, float, float]]], eager: float, path: Path,
          lengths: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.5, 4.2))
    for label, by_concurrency in rows.items():
        axis.plot(CONCURRENCY, [by_concurrency[c][0] for c in CONCURRENCY], marker="o",
                  label=label)
    axis.plot(CONCURRENCY, [eager] * len(CONCURRENCY), linestyle="--",
              label="eager in process (one call after another)")
    axis.set_xscale("log", base=2)
    axis.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
    axis.set_xlabel("requests in flight")
    axis.set_ylabel("requests/s")
    axis.set_title(f"BERT-base sentence embedding, texts of {lengths} tokens, 2 CPUs")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    command = "python benchmarks/bench_transformers.py " + " ".join(sys.argv[1:])
    load_before = os.getloadavg()[0]
    client = docker_client()
    with tempfile.TemporaryDirectory() as scratch:
        made = pipelines(Path(scratch))
        calls = texts(TEXTS)
        expected = {variant: [pipeline(text) for text in calls]
                    for variant, pipeline in made.items()}
        lengths = [len(made["padded"].nodes[0].op(text)[0]) for text in calls]
        built = {}
        for variant, pipeline in made.items():
            started = time.perf_counter()
            built[variant] = build_docker_image(pipeline, IMAGE.format(variant), client=client)
            print(f"{variant}: built and verified in {time.perf_counter() - started:.0f} s",
                  flush=True)
        runs: dict[str, dict[int, list]] = {v: {c: [] for c in CONCURRENCY} for v in made}
        eager_runs = []
        containers = {variant: ServingContainer(client, IMAGE.format(variant))
                      for variant in made}
        try:
            endpoints = {variant: container.start(300) for variant, container in
                         containers.items()}
            first = {variant: first_request(f"grpc://{endpoints[variant].grpc_url}/pipeline",
                                            calls, expected[variant]) for variant in made}
            for variant in made:
                measure_served(f"grpc://{endpoints[variant].grpc_url}/pipeline", calls,
                               expected[variant], 8, 3)
            for run in range(args.runs):
                eager_runs.append(measure_eager(made["padded"], calls, args.seconds))
                for concurrency in CONCURRENCY:
                    for variant in made:
                        runs[variant][concurrency].append(measure_served(
                            f"grpc://{endpoints[variant].grpc_url}/pipeline", calls,
                            expected[variant], concurrency, args.seconds))
                print(f"run {run + 1}/{args.runs} done", flush=True)
        finally:
            for container in containers.values():
                container.remove()
    load_after = os.getloadavg()[0]
    sizes = {v: client.images.get(IMAGE.format(v)).attrs["Size"] for v in built}
    eager = _median(eager_runs)
    labels = {"padded": "served, padded within the batch (pad_values)",
              "per-length": "served, one model call per length (no pad_values)",
              "fixed128": "served, padded to 128 tokens by the tokenizer"}
    rows = {labels[v]: {c: _median(runs[v][c]) for c in CONCURRENCY} for v in made}
    chart(rows, eager[0], CHART, f"{min(lengths)}-{max(lengths)}")
    table = ["| pipeline | in flight | requests/s | p50 ms | p99 ms | vs eager |",
             "|---|---|---|---|---|---|",
             f"| eager in process (transformers on torch) | 1 | {eager[0]:.1f} | "
             f"{eager[1]:.0f} | {eager[2]:.0f} | 1.00x |"]
    for label, by_concurrency in rows.items():
        for concurrency, (rate, p50, p99) in by_concurrency.items():
            table.append(f"| {label} | {concurrency} | {rate:.1f} | {p50:.0f} | {p99:.0f} | "
                         f"{rate / eager[0]:.2f}x |")
    best = rows[labels["padded"]][32][0] / eager[0]
    section = "\n".join([
        HEADING, "",
        f"`{command.strip()}` — {machine()}; BERT-base (12 layers, hidden 768, random weights "
        f"from its config), a `BertTokenizerFast`, masked mean pooling; {TEXTS} texts of "
        f"{min(lengths)}–{max(lengths)} tokens (median {int(np.median(lengths))}); closed-loop "
        f"gRPC clients in threads on the same machine, {args.seconds:.0f} s per figure, medians "
        f"of {args.runs} runs taken in turns; every served answer checked against the "
        f"in-process pipeline (1e-3). Images built and verified: "
        f"{', '.join(f'{v} {size / 1e6:.0f} MB' for v, size in sizes.items())}. "
        f"Load average before / after: {load_before:.1f} / {load_after:.1f}.", "",
        *table, "",
        "First request after the container is ready against the median of the next 20, one "
        "at a time (each model's ONNX Runtime session runs its example once while the model "
        "loads): " + "; ".join(f"{labels[v]} {a:.0f} ms / {b:.0f} ms" for v, (a, b) in
                               first.items()) + ".", "",
        f"Served at 32 in flight, padded within the batch: {best:.2f}x eager's "
        f"requests/s (goal {GOAL:.0f}x: {'met' if best >= GOAL else 'not met'}).", "",
        f"![BERT-base requests/s]({CHART.relative_to(BENCHMARKS.parent)})", ""])
    publish(HEADING, section, write=not args.no_write)


if __name__ == "__main__":
    main()
