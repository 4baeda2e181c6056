"""The CPU Triton base image: how long ``triton-builder base cpu`` takes when nothing changed.

The inputs (template, pinned packages, OS image id, Triton wheel, our onnxruntime backend) are
hashed before any work; an image whose label carries the same hash is reused as it is.

    python benchmarks/bench_base.py [--runs 5] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.report import machine, publish  # noqa: E402
from builder.base.cpu import build_cpu_base  # noqa: E402
from builder.base.os_image import debian_os_image  # noqa: E402
from builder.engine import ensure_engine  # noqa: E402

SECTION = "## CPU base image: a second build"
COMMAND = "python benchmarks/bench_base.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    client = ensure_engine()
    os_image = os.environ.get("TRITON_BUILDER_OS_IMAGE") or debian_os_image(client)
    first = build_cpu_base(client, os_image=os_image)
    command = ["triton-builder", "base", "cpu", "--os-image", os_image]
    seconds = []
    for _ in range(args.runs):
        started = time.monotonic()
        subprocess.run(command, check=True, capture_output=True)
        seconds.append(time.monotonic() - started)
    lines = [SECTION, "",
             f"`{COMMAND} --runs {args.runs}` — {machine()}, "
             f"OS image `{os_image}`, base `{first.tags[0]}` already built.", "",
             "| run | seconds |", "|---|---|",
             f"| `{' '.join(command)}`, nothing changed, median of {args.runs} "
             f"(process start and imports included) | {statistics.median(seconds):.2f} |"]
    section = "\n".join(lines) + "\n"
    publish(SECTION, section, write=not args.no_write)


if __name__ == "__main__":
    main()
