"""What a lent GPU machine needs carried to run the GPU tier, made here: ``.gpu/``.

Such a machine (see CONTRIBUTING.md, "Test tiers") has an NVIDIA GPU, its own Python with a CUDA
torch, no network and no Docker, and takes at most 64 MiB with the working tree. So this writes:

* ``.gpu/whl/``: the project's dependencies that machine's image lacks, as wheels for its
  Python (:data:`CARRIED`, pinned to the versions installed here), with numpy 1 among them —
  Triton 2.51's stub needs it, and its embedded interpreter ignores ``PYTHONPATH``, so
  ``tests/gpu/lent_machine.sh`` installs them into that machine's own environment;
* ``.gpu/nvidia_pytriton-….whl``: the Triton wheel with only that Python's stub, LZMA-compressed
  (55 MB as published, 26 MB so), which ``TRITON_BUILDER_PYTRITON_WHEEL`` points at there;
* ``.gpu/perf-analyzer.tar.xz``: perf_analyzer as ``builder.tune`` unpacks it into its cache
  (the binary, ``libcudart``, ``libb64``), for ``tests/gpu/test_gpu_tune.py``.

Run here: ``python -m tests.support.gpu_carry [--python 3.12]``; then, through the device tool,
``bash tests/gpu/lent_machine.sh`` with ``.gpu`` carried (``.gpu/`` in ``.git/info/exclude``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from builder.tritonserver.wheel import download_wheel
from builder.tune.perf_analyzer import perf_analyzer
from tests.support.paths import REPO_ROOT

CARRIED = ("numpy", "ml_dtypes", "protobuf", "tritonclient", "python-rapidjson", "docker",
           "python-debian", "cyclonedx-python-lib", "packageurl-python", "py-serializable",
           "license-expression", "boolean.py", "defusedxml", "conda-pack", "venv-pack")
"""What the lent machines' image lacks of what the GPU tier imports (numpy, ml_dtypes and
protobuf: it has other versions), as its package list read on 2026-11-17."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
STUBS = "pytriton/tritonserver/python_backend_stubs/"
CLIENT_PROGRAMS = ".data/data/bin/"
"""perf_analyzer and perf_client, where a tritonclient wheel holds them (2.51's: 40 MB): the GPU
tier runs them from ``.gpu/perf-analyzer.tar.xz``."""


def repack(source: Path, dest: Path, keep: Callable[[str], bool]) -> Path:
    """``source`` with only the members ``keep`` accepts, LZMA-compressed (``zipfile`` and so
    pip read it; its RECORD still lists what was left out, which pip does not check)."""
    with zipfile.ZipFile(source) as wheel, zipfile.ZipFile(dest, "w", zipfile.ZIP_LZMA) as out:
        for info in wheel.infolist():
            if keep(info.filename):
                data = wheel.read(info)
                info.compress_type = zipfile.ZIP_LZMA
                out.writestr(info, data)
    return dest


def stub_only_for(python: str) -> Callable[[str], bool]:
    """Members of the nvidia-pytriton wheel needed to serve with ``python``'s stub: not the
    other versions' stubs, nor the ``libpython`` bundled for one of them."""
    ours = f"{STUBS}{python}/"

    def keep(name: str) -> bool:
        if name.startswith(STUBS):
            return name.startswith(ours)
        return not (name.startswith("nvidia_pytriton.libs/libpython")
                    and f".{python.split('.')[1]}." not in name)

    return keep


def download(requirements: list[str], dest: Path, python: str) -> None:
    platforms = [argument for platform in PLATFORMS for argument in ("--platform", platform)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
                    *platforms, "-d", str(dest), *requirements], check=True)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="3.12", help="the lent machine's Python (X.Y)")
    parser.add_argument("--dest", type=Path, default=REPO_ROOT / ".gpu")
    args = parser.parse_args(argv)
    wheels = args.dest / "whl"
    wheels.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in CARRIED]
    download(pins, wheels, args.python)
    for client in wheels.glob("tritonclient-*.whl"):
        repack(client, client.with_suffix(".tmp"),
               lambda name: CLIENT_PROGRAMS not in name).replace(client)
    pytriton = download_wheel()
    repack(pytriton, args.dest / pytriton.name, stub_only_for(args.python))
    unpacked = perf_analyzer().path.parents[1]  # <cache>/perf-analyzer/<version>-<machine>
    with tarfile.open(args.dest / "perf-analyzer.tar.xz", "w:xz") as archive:
        archive.add(unpacked, arcname=unpacked.name)
    size = sum(path.stat().st_size for path in args.dest.rglob("*") if path.is_file())
    print(f"{args.dest}: {size / 2**20:.0f} MiB")
    return args.dest


if __name__ == "__main__":
    main()
