"""Compiling a python backend stub: unity builds against file by file.

The compile route (:mod:`builder.bridge.stub_build`) builds python_backend's stub in a Docker
stage on the release image. This compiles r24.10's stub for Python 3.11 on the CPU base from the
local source tarballs (``$TRITON_BUILDER_TRITON_SOURCES``, else ``../shared/triton-sources``),
as a build taking that route does, once as unity builds (:mod:`builder.bridge.unity_make`, the
default) and once file by file (``unity=False``: python_backend's own build), alternating, each
from an empty stub cache (the stage's packages are installed again each time: Docker prunes the
stage's layers with it). It reports the whole compile and its ``make`` alone (from CMake's
"Configuring done" to the stub's last target), and checks that each stub links the Python and
C++ libraries the other does.

    python benchmarks/bench_stub_compile.py [--runs 3] [--no-write]

prints the numbers and replaces the "Compiling a python backend stub" section of BENCHMARKS.md
(and its chart, ``stub_compile.png``).
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
from builder.base.cpu import build_cpu_base  # noqa: E402
from builder.base.os_image import debian_os_image  # noqa: E402
from builder.bridge.stub_build import SOURCE_DIRECTORY_VARIABLE, compile_stub, stub_python  # noqa: E402
from builder.engine import ensure_engine  # noqa: E402
from tests.support.elf_dynamic import dynamic_section, needed_libraries  # noqa: E402
from tests.support.paths import TRITON_SOURCES  # noqa: E402

SECTION = "## Compiling a python backend stub"
COMMAND = "python benchmarks/bench_stub_compile.py"
CHART = ROOT / "benchmarks" / "stub_compile.png"
BRANCH = "r24.10"
MODES = {"unity builds (default)": True, "file by file": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--runs", type=int, default=3, help="compiles of each (median)")
    args, _ = parser.parse_known_args()
    sources = Path(os.environ.get(SOURCE_DIRECTORY_VARIABLE) or TRITON_SOURCES)
    if not (sources / f"python_backend-{BRANCH}.tar.gz").is_file():
        print(f"skipped: no python_backend-{BRANCH}.tar.gz in {sources}")
        return
    client = ensure_engine()
    base = build_cpu_base(client, os_image=debian_os_image(client)).tags[0]
    load_before = os.getloadavg()[0]
    measured: dict[str, list[tuple[float, float]]] = {name: [] for name in MODES}
    linked: list[str] | None = None
    for _ in range(args.runs):
        for name, unity in MODES.items():
            whole, make, needed = _compile(client, base, sources, unity)
            measured[name].append((whole, make))
            if linked is not None and needed != linked:
                raise SystemExit(f"{name}: the stub links {needed}, the first one {linked}")
            linked = needed
    rows = {name: (statistics.median(run[0] for run in runs),
                   statistics.median(run[1] for run in runs)) for name, runs in measured.items()}
    if not args.no_write:
        _chart(measured)
    unity_make, plain_make = (rows[name][1] for name in MODES)
    section = "\n".join([
        SECTION, "",
        f"`{COMMAND} --runs {args.runs}` on {machine()}: python_backend {BRANCH}'s stub for "
        f"Python 3.11 on the CPU base, from the local source tarballs, `make -j2`; each compile "
        f"from an empty stub cache, the two alternating, medians of {args.runs}.", "",
        "| compile | whole compile | its make |",
        "|---|---|---|",
        *(f"| {name} | {whole:.1f} s | {make:.1f} s |" for name, (whole, make) in rows.items()),
        "",
        f"Unity builds make the stub in {unity_make / plain_make:.0%} of the time file by file "
        f"takes. The rest of a compile (the stage's packages, the sources unpacked, CMake's "
        f"configure, the stub copied out) is the same in both. Each stub links "
        f"{', '.join(linked or [])}. Every run: "
        + "; ".join(f"{name}: " + ", ".join(f"{make:.1f}" for _, make in runs) + " s"
                    for name, runs in measured.items())
        + f" (make). Load average before: {load_before:.1f}, after: {os.getloadavg()[0]:.1f}.",
        "", f"![make of the stub]({CHART.relative_to(ROOT)})",
    ])
    publish(SECTION, section, write=not args.no_write)


def _compile(client, base: str, sources: Path, unity: bool) -> tuple[float, float, list[str]]:
    """One compile from an empty stub cache: (seconds in all, seconds of make, NEEDED libs)."""
    marks: dict[str, float] = {}

    def log(line: str) -> None:
        if "Configuring done" in line:
            marks["configured"] = time.monotonic()
        elif "Built target triton-python-backend-stub" in line:
            marks["made"] = time.monotonic()

    with cold_cache("bench-stub-", "tools"):
        started = time.monotonic()
        stub = compile_stub(client, branch=BRANCH, python_version="3.11",
                            build_image_name=base, sources=sources, unity=unity, on_log=log)
        whole = time.monotonic() - started
        if stub_python(stub) != "3.11":
            raise SystemExit(f"the stub links libpython{stub_python(stub)}, not 3.11")
        needed = sorted(needed_libraries(dynamic_section(stub)))
    return whole, marks["made"] - marks["configured"], needed


def _chart(measured: dict[str, list[tuple[float, float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 2.6))
    names = list(measured)
    for row, name in enumerate(names):
        makes = [make for _, make in measured[name]]
        axis.barh(row, statistics.median(makes), color="#4c72b0" if row == 0 else "#999999")
        axis.plot(makes, [row] * len(makes), "ko", markersize=4)
    axis.set_yticks(range(len(names)), names)
    axis.invert_yaxis()
    axis.set_xlabel(f"make of python_backend {BRANCH}'s stub, 2 jobs (s): median, and each run")
    figure.tight_layout()
    figure.savefig(CHART, dpi=100)


if __name__ == "__main__":
    main()
