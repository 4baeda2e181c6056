"""Platforms: the text-embedding image built for linux/amd64 and linux/arm64 on this amd64
machine — build time per platform, the arm64 verification under emulation, image sizes, and
(``--bases``) what the arm64 bases cost to make, which is what the arm64 path adds to CI.

Each run is a cold build of both platforms from the bases (a fresh ``TRITON_BUILDER_CACHE``
and a requirement of its own, so environments, payloads and layers are all made again), both
verified; times are read from the build's own step lines.

    python benchmarks/bench_platforms.py [--runs 2] [--bases] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.report import machine, publish  # noqa: E402
from builder import build_docker_image  # noqa: E402
from builder.base.cpu import build_cpu_base  # noqa: E402
from builder.base.os_image import debian_os_image  # noqa: E402
from builder.engine import ensure_engine  # noqa: E402
from builder.engine.platforms import ARM64  # noqa: E402
from pipelines.text_embedding import pipeline  # noqa: E402
from tests.support.engine_images import image_ids, remove_images_made  # noqa: E402
from tests.support.testbed import enable_emulation  # noqa: E402

SECTION = "## Platforms: amd64 and arm64 (emulated) builds"
COMMAND = "python benchmarks/bench_platforms.py"
PLATFORMS = ("linux/amd64", "linux/arm64")
REFERENCE = "triton-builder-bench/platforms:1"
_STEP = re.compile(r"^✓ (?P<step>.+?) \((?P<seconds>[0-9.]+)s\)$")


def _cold_build(client, run: int) -> dict[str, dict[str, float]]:
    """One cold two-platform build; per platform: environment, image (verified), verification
    and whole seconds, and the image's size in MB."""
    before = image_ids(client)
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-platforms-") as cache:
        os.environ["TRITON_BUILDER_CACHE"] = cache
        started = time.monotonic()
        built = build_docker_image(pipeline, REFERENCE, platforms=PLATFORMS,
                                   requirements=[f"idna=={('3.10', '3.9')[run % 2]}"],
                                   client=client, on_log=lines.append)
        total = time.monotonic() - started
    steps = [(m["step"], float(m["seconds"])) for line in lines if (m := _STEP.match(line))]
    measured: dict[str, dict[str, float]] = {}
    for name, image in built.platform_images.items():
        mine = [(step, seconds) for step, seconds in steps if name in step
                or step.endswith(f"-{name.split('/')[1]} (verified)")]
        measured[name] = {
            "environment": sum(s for step, s in mine if step.startswith("python environment")),
            "image": sum(s for step, s in mine if step.startswith("image ")),
            "verification": image.verification.seconds,
            "size_mb": client.api.inspect_image(image.id)["Size"] / 1e6,
        }
        measured[name]["build"] = sum(s for _, s in mine)
    measured["total"] = {"build": total}
    remove_images_made(client, before, (REFERENCE.rsplit(":", 1)[0],))
    return measured


def _arm64_bases(client) -> tuple[float, float]:
    """Seconds to make the arm64 Debian OS image (mmdebstrap under emulation) and the arm64
    CPU base from it, both from scratch."""
    started = time.monotonic()
    os_image = debian_os_image(client, tag="triton-builder-bench/debian-bookworm:arm64",
                               rebuild=True, platform=ARM64)
    made = time.monotonic() - started
    started = time.monotonic()
    build_cpu_base(client, os_image=os_image, platform=ARM64, rebuild=True,
                   tag="triton-builder-bench/tritonserver-cpu:arm64")
    based = time.monotonic() - started
    for tag in ("triton-builder-bench/tritonserver-cpu:arm64",
                "triton-builder-bench/debian-bookworm:arm64"):
        client.images.remove(tag)
    return made, based


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--bases", action="store_true",
                        help="also make the arm64 OS image and CPU base from scratch")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    client = ensure_engine()
    enable_emulation(ARM64)
    load_before = os.getloadavg()
    bases = _arm64_bases(client) if args.bases else None
    runs = [_cold_build(client, run) for run in range(args.runs)]
    load_after = os.getloadavg()

    def median(platform: str, key: str) -> float:
        return statistics.median(run[platform][key] for run in runs)

    lines = [SECTION, "",
             f"`{COMMAND} --runs {args.runs}{' --bases' if args.bases else ''}` — {machine()}; "
             f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after. The "
             f"text-embedding example built cold for both "
             f"platforms in one build (fresh cache, bases kept), each verified: arm64 under "
             f"qemu-user 7.2 (Debian 12's qemu-user-static). Medians of {args.runs} runs.", "",
             "| | linux/amd64 (native) | linux/arm64 (emulated) |", "|---|---|---|"]
    for key, what in (("environment", "environment made (s)"),
                      ("image", "image built and verified (s)"),
                      ("verification", "of which verification: start to ready, every "
                                       "example over gRPC and HTTP (s)"),
                      ("build", "platform's whole build (s)"),
                      ("size_mb", "image size (MB)")):
        lines.append(f"| {what} | {median('linux/amd64', key):.1f} | "
                     f"{median('linux/arm64', key):.1f} |")
    totals = [run["total"]["build"] for run in runs]
    lines += ["", f"Both platforms, one build: {statistics.median(totals):.1f} s (runs: "
              f"{', '.join(f'{seconds:.1f}' for seconds in totals)})."]
    if bases is not None:
        lines += ["", f"The arm64 bases, once per machine (what the arm64 path adds to a fresh "
                      f"CI run besides the test): Debian OS image with mmdebstrap under "
                      f"emulation {bases[0]:.0f} s, CPU base from it {bases[1]:.0f} s."]
    publish(SECTION, "\n".join(lines) + "\n", write=not args.no_write)


if __name__ == "__main__":
    main()
