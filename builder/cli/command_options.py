"""The options of the build commands, defined once (pip's ``cmdoptions``), their defaults read
from the library's own options objects.

Why: ``triton-builder image --drain-seconds`` and ``build_docker_image(drain_s=)`` are one
question; a default copied here as a literal drifts from the library's. Each option below takes
its default from :class:`builder.job.BuildOptions` through the keyword it stands for
(:data:`KEYWORD_OF`), and :func:`build_keywords` turns a command's values into the library's
keywords. ``tests/unit/cli`` holds every default to the library's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from builder.image.serving_dockerfile import MAX_DRAIN_S
from builder.job import BuildOptions
from builder.job.build_options import KEYWORDS

MIB = 1024 * 1024
KEYWORD_OF = {"drain_seconds": "drain_s", "env": "env_specs", "requirement": "requirements",
              "max_request_mb": "max_request_bytes", "platform": "platforms",
              "no_verify_platform": "no_verify_platforms"}
"""A command's parameter → the library keyword it stands for, where their names differ (the
flag reads better in a shell: ``--requirement`` repeated, ``--max-request-mb``)."""


def library_default(keyword: str) -> Any:
    """The default of ``build_docker_image``'s ``keyword``: its options object's field."""
    group, name = KEYWORDS[keyword]
    options = BuildOptions()
    return getattr(getattr(options, group) if group else options, name)


def build_keywords(values: Mapping[str, Any]) -> dict[str, Any]:
    """A command's option values → ``build_docker_image`` keywords: renamed, MiB as bytes,
    ``--pytorch-index none`` as no index, repeated options as tuples (none given: the
    library's default)."""
    keywords = {}
    for parameter, value in values.items():
        keyword = KEYWORD_OF.get(parameter, parameter)
        if keyword not in KEYWORDS:
            continue
        if parameter == "max_request_mb" and value is not None:
            value = max(1, round(value * MIB))
        elif keyword == "pytorch_index" and str(value).lower() == "none":
            value = None
        elif isinstance(value, list):
            value = tuple(value) if value else library_default(keyword)
        keywords[keyword] = value
    return keywords


PIPELINE = typer.Argument(..., help="The pipeline: 'path/to/file.py:attr' or "
                                    "'package.module:attr'.")
CUDA = typer.Option(library_default("cuda"), help="CUDA version of the release (e.g. 12.6), or "
                    "'cpu' [default: cpu]: the image's base, and where model operators run.")
SLIM = typer.Option(library_default("slim"), help="The slim GPU route for --cuda (12.x, 13.0): "
                    "the nvidia-pytriton wheel's Triton on Debian, CUDA libraries from "
                    "NVIDIA's wheels, no NGC image.")
TRITON_VERSION = typer.Option(library_default("triton_version"),
                              help="Pick the Triton release by its version.")
BASE_IMAGE = typer.Option(library_default("base_image"), help="Use this base image instead.")
BASE_PYTHON = typer.Option(library_default("base_python"), help="Python of the CPU base: 3.11 "
                           "(bookworm, default) or 3.13 (trixie).")
ENV = typer.Option([], exists=True, dir_okay=False,
                   help="Environment spec in envs/ (repeatable).")
REQUIREMENT = typer.Option([], "--requirement", "-r", help="Extra pip requirement (repeatable).")
PYTORCH_INDEX = typer.Option(
    library_default("pytorch_index"),
    help="PyTorch's wheel indexes (<url>/cu124, <url>/cpu); 'none' to use only the package "
         "index, choosing torch by each wheel's CUDA runtime.")
PARALLELISM = typer.Option(library_default("parallelism"), min=1, help="Instances of the "
                           "pipeline model (each runs its Python operators on one core).")
FORMAT = typer.Option(list(library_default("format_priority")), "--format",
                      help="Export formats, in order (repeatable).")
LATENCY_BUDGET_MS = typer.Option(
    library_default("latency_budget_ms"), min=0.001, help="Latency budget of a request: what "
    "would wait longer in a queue is refused at once with UNAVAILABLE (queue policies).")
MAX_REQUEST_MB = typer.Option(
    library_default("max_request_bytes"), min=0.001, help="The largest request served, in MiB; "
    "a larger one is answered INVALID_ARGUMENT / 400 [default: 16, or 64x the largest "
    "example].")
VERIFY = typer.Option(library_default("verify"),
                      help="Run the image and compare with the pipeline.")
USER = typer.Option(library_default("user"), help="Run the server as this user [default: uid "
                    "1000; 'root' for root].")
DRAIN_SECONDS = typer.Option(library_default("drain_s"), min=0, max=MAX_DRAIN_S,
                             help="How long a stopping container serves on after its "
                                  "readiness failed.")
NO_CACHE = typer.Option(library_default("no_cache"), "--no-cache", help="Build every layer of "
                        "the image again (docker build --no-cache): reuse nothing the engine "
                        "holds from an earlier build.")
BRIDGE = typer.Option(library_default("bridge"), help="Serve this Python on a release whose "
                      "Python differs (a stub and an environment carrying the interpreter).")
INTERPRETER_IMAGE = typer.Option(library_default("interpreter_image"), help="Image the bridged "
                                 "interpreter is taken from [default: python:X.Y-slim-<debian>].")
COMPILE_STUB = typer.Option(library_default("compile_stub"), help="Compile the stub from the "
                            "release's python_backend branch even where a wheel has one.")
TRITON_SOURCES: Path = typer.Option(library_default("triton_sources"), exists=True,
                                    file_okay=False, help="Directory of python_backend source "
                                    "tarballs (instead of fetching them).")
PLATFORM = typer.Option([], "--platform", help="Platform to build for (repeatable: "
                        "linux/amd64, linux/arm64; one tag, one index at push) [default: "
                        "linux/amd64].")
NO_VERIFY_PLATFORM = typer.Option([], "--no-verify-platform", help="Build this platform "
                                  "without verifying it (a warning; repeatable).")
