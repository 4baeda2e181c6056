"""Serving throughput of the text-embedding pipeline: in process vs Triton, by concurrency.

The pipeline is built with ``build_pipeline_model`` and served by the host-process
``tritonserver`` (the CPU image runs the same server and backends). A bounded number of gRPC
requests are kept in flight with :class:`builder.client.AsyncClient`; every served answer is
checked against the in-process one. In process, calls run one after another, as a Python
program would run them without a server.

    python benchmarks/bench_serving.py [--requests 400] [--runs 3] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.report import publish  # noqa: E402
from builder import build_pipeline_model  # noqa: E402
from builder.client import AsyncClient  # noqa: E402
from builder.tritonserver.host_process import TritonServer  # noqa: E402
from builder.verify.equality import check_same  # noqa: E402
from pipelines.text_embedding import pipeline  # noqa: E402
from tests.example_inputs import TEXTS  # noqa: E402

SECTION = "## Serving throughput: text embedding, in process vs Triton"
COMMAND = "python benchmarks/bench_serving.py"
CONCURRENCY = (1, 4, 16, 64)


async def _served(url: str, texts: list[str], concurrency: int) -> tuple[float, list]:
    async with AsyncClient(url, max_in_flight=concurrency) as client:
        await client(texts[0])  # connect and read the signature outside the timing
        started = time.monotonic()
        results = await client.batch(texts)
        return time.monotonic() - started, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--runs", type=int, default=3, help="runs per row (median shown)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    texts = [TEXTS[i % len(TEXTS)] + f" #{i}" for i in range(args.requests)]

    pipeline(texts[0])
    rates = []
    for _ in range(args.runs):
        started = time.monotonic()
        expected = [pipeline(text) for text in texts]
        rates.append(len(texts) / (time.monotonic() - started))
    in_process = statistics.median(rates)

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as workdir:
        built = build_pipeline_model(pipeline, Path(workdir) / "models")
        with TritonServer(built.model_root) as server:
            url = f"grpc://{server.grpc_url}/{built.pipeline_model}"
            for concurrency in CONCURRENCY:
                rates = []
                for _ in range(args.runs):
                    seconds, results = asyncio.run(_served(url, texts, concurrency))
                    for text, got, want in zip(texts, results, expected):
                        check_same(got, want, where=text)
                    rates.append(len(texts) / seconds)
                rows.append((concurrency, statistics.median(rates)))

    lines = [SECTION, "",
             f"`{COMMAND} --requests {args.requests} --runs {args.runs}` — median of the runs; "
             f"{platform.machine()}, "
             f"{os.cpu_count()} CPUs; host-process Triton 2.51 (python backend + the "
             "onnxruntime Python backend), one pipeline model instance with dynamic batching, "
             "gRPC from the same machine (the client shares the CPUs with the server). Every "
             "served answer equals the in-process one.", "",
             "| how | requests in flight | calls/s |", "|---|---|---|",
             f"| in process, one call after another | 1 | {in_process:.0f} |"]
    lines += [f"| served over gRPC | {c} | {qps:.0f} |" for c, qps in rows]
    section = "\n".join(lines) + "\n"
    publish(SECTION, section, write=not args.no_write)


if __name__ == "__main__":
    main()
