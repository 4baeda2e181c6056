"""Sessions: ``tests`` (the whole suite), ``lint``, ``demo``, ``bench``, ``base``.

Every session installs the project into its own virtual environment; the ones that need Docker
start the engine themselves (as root on Debian they install it), so a fresh machine needs
nothing but Python and ``pip install nox``.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"
SOURCES = ["builder", "tests", "pipelines", "benchmarks", "noxfile.py"]


def _install(session: nox.Session, extras: str = "test") -> None:
    session.install("-e", f".[{extras}]")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The whole suite, slow end-to-end tests included (real dockerd, tritonserver, registry)."""
    _install(session)
    session.run("pytest", *(session.posargs or ["-q"]))


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", *SOURCES)


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
    _install(session)
    for script in sorted(Path("benchmarks").glob("bench_*.py")):
        session.run("python", str(script), *session.posargs)
