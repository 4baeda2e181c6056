"""Environment tarball cache: a cold build against a rebuild with the spec unchanged.

Cold: empty caches — the image probed (one throwaway container), wheels downloaded for the
image's Python and platform (pip's own HTTP cache stays warm, as on any build machine), the venv
made in a container of the CPU base image, venv-pack, the full-archive check. Rebuild: what a
build does when nothing changed — the probe's answer read back (kept per image ID), the inputs
hashed, the checked tarball found.

    python benchmarks/bench_environment.py [--runs 5] [--no-write]

prints the numbers and replaces the "Environment tarball cache" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.report import machine, publish  # noqa: E402
from builder.base.cpu import build_cpu_base  # noqa: E402
from builder.base.os_image import debian_os_image  # noqa: E402
from builder.engine import ensure_engine  # noqa: E402
from builder.environment.spec import load_spec  # noqa: E402
from builder.environment.tarball import pack_environment  # noqa: E402
from builder.environment.target import image_target  # noqa: E402

SPEC = ROOT / "envs" / "tabulate-demo.txt"
SECTION = "## Environment tarball cache"
COMMAND = "python benchmarks/bench_environment.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="rebuilds to time (median shown)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    client = ensure_engine()
    os_image = os.environ.get("TRITON_BUILDER_OS_IMAGE") or debian_os_image(client)
    base = build_cpu_base(client, os_image=os_image).tags[0]
    spec = load_spec([SPEC])
    with tempfile.TemporaryDirectory(prefix="bench-environments-") as cache:
        os.environ["TRITON_BUILDER_CACHE"] = cache  # the image probe's answers start empty too
        started = time.monotonic()
        target = image_target(client, base)
        cold = pack_environment(spec, target, cache=cache)
        cold_seconds = time.monotonic() - started
        assert not cold.reused
        rebuilds, lookups = [], []
        for _ in range(args.runs):
            started = time.monotonic()
            again = pack_environment(spec, image_target(client, base), cache=cache)
            rebuilds.append(time.monotonic() - started)
            lookups.append(again.seconds)
            assert again.reused and again.path == cold.path
        size = cold.path.stat().st_size

    rebuild, lookup = statistics.median(rebuilds), statistics.median(lookups)
    section = "\n".join([
        SECTION,
        "",
        f"`{COMMAND} --runs {args.runs}` — {machine()}, "
        f"target `{base}`, spec `envs/{SPEC.name}` ({', '.join(spec.requirements)}); "
        f"tarball {size / 1e6:.1f} MB.",
        "",
        "| build | seconds |",
        "|---|---|",
        f"| cold (empty caches: image probe, download, venv in the image, venv-pack, check) | "
        f"{cold_seconds:.2f} |",
        f"| rebuild, spec unchanged (image probe kept per image ID + cache hit), median of "
        f"{args.runs} | {rebuild:.4f} |",
        f"| of which the cache lookup itself | {lookup:.4f} |",
        "",
        f"Speed-up of a rebuild: {cold_seconds / rebuild:.0f}x. pip's HTTP cache was warm in "
        f"both (as on any build machine); the cold figure excludes building the CPU base image. "
        f"Load average at the end: {os.getloadavg()[0]:.1f} (other jobs share the machine).",
        "",
    ])
    publish(SECTION, section, write=not args.no_write)


if __name__ == "__main__":
    main()
