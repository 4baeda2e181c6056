"""Bridged against native: image size and cold build time of one pipeline on the two CPU bases.

The text-embedding example is built from this Python (3.11) on the bookworm CPU base (Python 3.11:
native) and on the trixie CPU base (Python 3.13: bridged — a stub for 3.11 from the
``nvidia-pytriton`` wheel, an environment that carries the 3.11 interpreter from the bookworm OS
image). "Cold" is a fresh ``TRITON_BUILDER_CACHE`` (environment packed from scratch, stub
extracted again; the downloaded Triton wheel is copied in, so PyPI's speed is not measured) and a
payload image built anew; the base images themselves are reused, and the build is not verified.

    python benchmarks/bench_bridge.py [--runs 3] [--no-write]

The two builds alternate, run after run; the table holds the medians.

prints the numbers and replaces the "Bridged vs native image" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cold_cache import cold_cache  # noqa: E402
from benchmarks.report import machine, publish  # noqa: E402
from builder import build_docker_image  # noqa: E402
from builder.base.cpu import build_cpu_base  # noqa: E402
from builder.base.os_image import debian_os_image  # noqa: E402
from builder.engine import ensure_engine  # noqa: E402
from builder.image.serving_image import payload_reference  # noqa: E402
from pipelines.text_embedding import pipeline  # noqa: E402

SECTION = "## Bridged vs native image"
COMMAND = "python benchmarks/bench_bridge.py"
IMAGE = "triton-builder-bench/bridge"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--runs", type=int, default=3, help="cold builds of each (median)")
    args = parser.parse_args()

    client = ensure_engine()
    bookworm = os.environ.get("TRITON_BUILDER_OS_IMAGE") or debian_os_image(client)
    build_cpu_base(client, os_image=bookworm)
    build_cpu_base(client, os_image=debian_os_image(client, suite="trixie"), python_version="3.13")
    kinds = (("native (bookworm base, Python 3.11)", {}),
             ("bridged (trixie base, Python 3.13 → 3.11)",
              {"base_python": "3.13", "interpreter_image": bookworm}))
    measured: dict[str, list[tuple[int, int, float]]] = {name: [] for name, _ in kinds}
    for _ in range(args.runs):
        for name, options in kinds:
            measured[name].append(_cold_build(client, options))
    rows = [(name, *(statistics.median(run[i] for run in runs) for i in range(3)))
            for name, runs in measured.items()]
    section = "\n".join([
        SECTION, "",
        f"`{COMMAND} --runs {args.runs}` on {machine()}: the "
        f"text-embedding example, cold (fresh cache, new payload), not verified; the two builds "
        f"alternate, medians of {args.runs}.", "",
        "| image | size | added to its base | cold build |",
        "|---|---|---|---|",
        *(f"| {name} | {size / 1e6:.0f} MB | {added / 1e6:.0f} MB | {seconds:.1f} s |"
          for name, size, added, seconds in rows),
        "",
        f"The bridged image carries the 3.11 interpreter (standard library, libpython, the shared "
        f"libraries they load) and the onnxruntime backend's packages in its environment, "
        f"unpacked. Load average at the end: {os.getloadavg()[0]:.1f}.",
    ])
    publish(SECTION, section, write=not args.no_write)


def _cold_build(client, options: dict) -> tuple[int, int, float]:
    """One build from an empty cache: (image size, size added to its base, seconds)."""
    with cold_cache("bench-bridge-", "wheels"):
        reference = f"{IMAGE}:{'bridged' if options else 'native'}"
        built = None
        try:
            started = time.monotonic()
            built = build_docker_image(pipeline, reference, cuda="cpu", verify=False,
                                       client=client, on_log=lambda line: None, **options)
            seconds = time.monotonic() - started
            size = client.images.get(built.id).attrs["Size"]
            base_size = client.images.get(built.release.image).attrs["Size"]
            return size, size - base_size, seconds
        finally:
            if built is not None:
                client.images.remove(reference, force=True)
                payload = built.labels.get("ai.triton-builder.payload-hash")
                if payload:
                    client.images.remove(payload_reference(payload), force=True)



if __name__ == "__main__":
    main()
