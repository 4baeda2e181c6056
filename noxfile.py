"""Sessions: ``tests`` (the whole suite), ``unit`` (the fast tier), ``gpu`` (the GPU tier, on a
GPU machine), ``lint``, ``demo``, ``bench``, ``base``.

Every session installs the project into its own virtual environment; the ones that need Docker
start the engine themselves (as root on Debian they install it), so a fresh machine needs
nothing but Python and ``pip install nox``.
"""

from __future__ import annotations

import glob
import os
import urllib.error
import urllib.request
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"
SOURCES = ["builder", "tests", "pipelines", "benchmarks", "noxfile.py"]


TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
"""PyTorch's CPU-only wheels: PyPI's default torch pulls CUDA libraries (a 5.7 GB virtualenv)."""


def _install(session: nox.Session, extras: str = "test") -> None:
    """The project, with a CPU build of torch where the machine has no NVIDIA GPU."""
    if not _has_nvidia_gpu():
        _install_cpu_torch(session)
    session.install("-e", f".[{extras}]")


def _has_nvidia_gpu() -> bool:
    """The NVIDIA kernel driver lists each GPU it drives under ``/proc/driver/nvidia/gpus``."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def _install_cpu_torch(session: nox.Session) -> None:
    """PyTorch's CPU index where it answers; else a local ``+cpu`` wheel pip's find-links has.

    Without either, pip installs PyPI's default (CUDA) torch with the project, as before.
    """
    try:
        urllib.request.urlopen(f"{TORCH_CPU_INDEX}/torch/", timeout=5).close()
    except (urllib.error.URLError, OSError):
        local = _local_cpu_torch()
        if local:
            session.install(f"torch=={local}")
        else:
            session.warn(f"{TORCH_CPU_INDEX} is unreachable and no local CPU torch wheel is "
                         "in PIP_FIND_LINKS: installing PyPI's default torch")
        return
    session.install("torch", "--index-url", TORCH_CPU_INDEX)


def _local_cpu_torch() -> str | None:
    """The newest ``torch-X+cpu`` wheel version in ``$PIP_FIND_LINKS`` directories, if any."""
    versions = []
    for directory in os.environ.get("PIP_FIND_LINKS", "").split():
        for wheel in glob.glob(os.path.join(directory, "torch-*+cpu-*.whl")):
            versions.append(os.path.basename(wheel).split("-")[1])
    return max(versions, key=lambda v: [int(p) for p in v.split("+")[0].split(".")],
               default=None)


TWO_AT_ONCE = ["-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder",
               "--record-unit-durations", "build/unit_durations.json"]
"""Two pytest-xdist workers, a module each: tests marked ``alongside`` share the machine,
``light`` ones share it with each other, every other test runs alone
(``tests/support/concurrency.py``). The plugin hands the units out ``alongside`` first (in
collection order, those that need no engine first and the short ones last), then alone, then
light, those two longest first, as ``tests/unit_durations.json`` has them; the run writes its
own to ``build/``."""


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The whole suite, slow end-to-end tests included (real dockerd, tritonserver, registry)."""
    _install(session)
    session.run("pytest", *(session.posargs or ["-q", "--durations=25", *TWO_AT_ONCE]))


UNIT_DESELECT = "not (slow or e2e or docker or registry or tritonserver or gpu)"
"""What ``unit`` leaves out: every test that needs more than this Python process."""


@nox.session(python=PYTHON)
def unit(session: nox.Session) -> None:
    """The fast tier: tests/unit without the tests that need Docker, a registry, a host
    tritonserver or a GPU (about five minutes on two cores)."""
    _install(session)
    session.run("pytest", "tests/unit", "-m", UNIT_DESELECT, *(session.posargs or ["-q"]))


@nox.session(venv_params=["--system-site-packages"])
def gpu(session: nox.Session) -> None:
    """The GPU tier, on a machine with an NVIDIA GPU: ``tests/gpu`` (skipped, saying why, where
    the GPU or a CUDA torch is missing) and its CPU twin, against Triton 2.51 from the
    nvidia-pytriton wheel as a host process — no Docker needed.

    The machine's own Python and torch are kept: the virtualenv sees the system's site-packages,
    so pip leaves a CUDA build of torch that satisfies the project in place instead of fetching
    another (``_install`` would put in a CPU build). Offline, point ``PIP_FIND_LINKS`` at a
    wheelhouse of the project's dependencies and ``TRITON_BUILDER_PYTRITON_WHEEL`` at the wheel.
    """
    session.install("-e", ".[test]")
    session.run("pytest", "tests/gpu", "tests/e2e/test_gpu_tier_on_cpu.py", "-rs",
                *(session.posargs or ["-q"]))


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff over the sources, then mypy over ``builder/`` (its settings: pyproject.toml)."""
    session.install("ruff>=0.6", "mypy>=1.11")
    session.run("ruff", "check", *SOURCES)
    session.run("mypy")


def _os_image(session: nox.Session) -> str:
    """``$TRITON_BUILDER_OS_IMAGE``, else the Debian image made here (no Docker Hub needed)."""
    return os.environ.get("TRITON_BUILDER_OS_IMAGE") or session.run(
        "triton-builder", "base", "os", silent=True).strip().splitlines()[-1]


@nox.session(python=PYTHON)
def base(session: nox.Session) -> None:
    """Build the CPU Triton base image (seconds when nothing changed)."""
    _install(session)
    session.run("triton-builder", "base", "cpu", "--os-image", _os_image(session),
                *session.posargs)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job on the CPU: build the text-embedding pipeline's image, run it, query it."""
    _install(session)
    session.env["TRITON_BUILDER_OS_IMAGE"] = _os_image(session)
    tag = "triton-builder-demo/text-embedding:1"
    session.run("triton-builder", "image", "pipelines/text_embedding.py:pipeline", "--tag", tag)
    container = session.run("triton-builder", "serve", tag, "--detach", "--http-port", "18000",
                            "--grpc-port", "18001", "--metrics-port", "18002",
                            silent=True).strip().splitlines()[-1]
    try:
        session.run("triton-builder", "infer", "grpc://127.0.0.1:18001/pipeline",
                    "--input", "text=Triton Builder turns pipelines into servers")
    finally:
        session.run("docker", "rm", "-f", container, external=True, silent=True)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks; their numbers go to BENCHMARKS.md with the command that produced them."""
    _install(session, "test,bench")
    for script in sorted(Path("benchmarks").glob("bench_*.py")):
        session.run("python", str(script), *session.posargs)
