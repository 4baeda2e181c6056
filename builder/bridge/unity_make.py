"""Make the stub's targets as unity builds; file by file where a branch's sources do not combine.

Run as a script inside the stub's build stage (Python 3.8 and later: Ubuntu 20.04's python3), in
a CMake build directory configured with ``CMAKE_UNITY_BUILD=ON``::

    python3 unity_make.py CMAKE JOBS TARGET...

A unity build compiles a target's sources in batches of eight as one translation unit, so the
headers every python_backend source includes (pybind11, the standard library, Boost's
interprocess) are parsed once per batch instead of once per file. r24.10's stub and what it
links were made in 31 s instead of 69 with two jobs, and the whole compile took 65 s instead of
107 (``benchmarks/bench_stub_compile.py``, BENCHMARKS.md): the cost of the compile route, paid by
every build that takes it for a new branch or Python.

Sources combine unless two of them define the same file-local name (a ``static`` function or an
anonymous namespace's). Every python_backend branch read here combines (r22.12, r23.05, r24.10,
r24.12 and r25.11, GPU on and off: ``tests/e2e/test_stub_build.py``,
``test_gpu_stub_build.py``, ``test_python_backend_generations.py``), but a branch not read here
may not. So a failed unity build is configured again with ``CMAKE_UNITY_BUILD=OFF`` and made file
by file, as python_backend's own build does: such a branch pays a failed attempt on top, and
fails only where the ordinary build would.
"""

from __future__ import annotations

import subprocess
import sys

FALLBACK = "the unity build failed: configuring again with CMAKE_UNITY_BUILD=OFF, file by file"


def make(jobs: str, targets: list[str]) -> int:
    return subprocess.call(["make", f"-j{jobs}", *targets])


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        print(f"usage: {argv[0]} CMAKE JOBS TARGET...", file=sys.stderr)
        return 2
    cmake, jobs, targets = argv[1], argv[2], argv[3:]
    if make(jobs, targets) == 0:
        return 0
    print(FALLBACK, flush=True)
    if subprocess.call([cmake, "-DCMAKE_UNITY_BUILD=OFF", "."]) != 0:
        return 1
    return make(jobs, targets)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
