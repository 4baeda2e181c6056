"""Which C++ compiler nvcc accepts as its host compiler, probed inside the stub's build stage.

Run as a script on the release image (Python 3.8 and later: Ubuntu 20.04's python3) with the
path of nvcc; prints the compiler to give CMake (``CUDAHOSTCXX``, ``CUDA_HOST_COMPILER``). Each
nvcc refuses GCCs newer than it knows ("unsupported GNU version"): the release images pair their
nvcc with a GCC it accepts (Ubuntu 20.04's GCC 9 for CUDA 11.8, Ubuntu 24.04's GCC 13 for CUDA
12.6 and 13.0), but a custom ``base_image=`` or a stand-in may not — Debian bookworm's default GCC
12 with CUDA 11.8, trixie's GCC 14 with CUDA 12.4 — while it has an older ``g++-N`` installed.
So the image's ``c++`` is tried first (what CMake would take), then ``$CUDAHOSTCXX``, then every
``g++-N`` on ``PATH``, newest first; none accepted is an error that names nvcc and what it said.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

PROBE = "#include <cuda_runtime.h>\n__global__ void probe(int *x) { *x = 1; }\n"


def candidates() -> list[str]:
    """The compilers to try, in order, as absolute paths, each once."""
    names = ["c++", "g++", os.environ.get("CUDAHOSTCXX", "")]
    versioned: set[str] = set()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if os.path.isdir(directory):
            versioned.update(name for name in os.listdir(directory)
                             if re.fullmatch(r"g\+\+-\d+", name))
    names += sorted(versioned, key=lambda name: -int(name.split("-")[1]))
    found = []
    for name in names:
        path = shutil.which(name) if name else None
        if path and path not in found:
            found.append(path)
    return found


def accepted(nvcc: str, compiler: str, workdir: str) -> tuple[bool, str]:
    """Whether ``nvcc -ccbin compiler`` compiles the probe; and nvcc's last words if not."""
    source = os.path.join(workdir, "probe.cu")
    with open(source, "w") as stream:
        stream.write(PROBE)
    result = subprocess.run([nvcc, "-ccbin", compiler, "-c", source, "-o",
                             os.path.join(workdir, "probe.o")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return result.returncode == 0, (lines[-1] if lines else f"exit status {result.returncode}")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} NVCC", file=sys.stderr)
        return 2
    nvcc = argv[1]
    if not os.access(nvcc, os.X_OK):
        print(f"no nvcc at {nvcc}: TRITON_ENABLE_GPU=ON needs the CUDA toolkit where the NGC "
              f"release images keep it (/usr/local/cuda)", file=sys.stderr)
        return 1
    refusals = []
    with tempfile.TemporaryDirectory(prefix="cuda-host-") as workdir:
        for compiler in candidates():
            ok, said = accepted(nvcc, compiler, workdir)
            if ok:
                print(compiler)
                return 0
            refusals.append(f"  {compiler}: {said}")
    print(f"{nvcc} accepts none of this image's C++ compilers as its host compiler:\n"
          + ("\n".join(refusals) or "  (no c++, g++ or g++-N on PATH)")
          + "\ninstall a g++ that this CUDA supports (g++-N) or set CUDAHOSTCXX", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
