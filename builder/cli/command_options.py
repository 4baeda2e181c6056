"""The options of the build commands, defined once (pip's ``cmdoptions``), their defaults read
from the library's own options objects.

Why: ``triton-builder image --drain-seconds`` and ``build_docker_image(drain_s=)`` are one
question; a default copied here as a literal drifts from the library's. Each option below takes
its default from :class:`builder.job.BuildOptions` through the keyword it stands for
(:data:`KEYWORD_OF`), and :func:`build_keywords` turns a command's values into the library's
keywords. ``tests/unit/cli`` holds every default to the library's.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from builder.image.serving_dockerfile import MAX_DRAIN_S
from builder.job import BuildOptions
from builder.job.build_options import KEYWORDS
from builder.repository.request_limit import MIB

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


def library_help(keyword: str, note: str = "") -> str:
    """What ``build_docker_image``'s ``keyword`` does, as its options object's field says
    (documented there once), with ``note`` on how the command line says it."""
    group, name = KEYWORDS[keyword]
    kind = type(getattr(BuildOptions(), group)) if group else BuildOptions
    return field_help(kind, name) + (f" {note}" if note else "")


def _field(options: type, name: str) -> dataclasses.Field:
    (found,) = [each for each in dataclasses.fields(options) if each.name == name]
    return found


def field_default(options: type, name: str) -> Any:
    """The default of field ``name`` of the options dataclass ``options`` (``SwarmOptions``,
    ``KubernetesOptions``, ...): a command that stands for it takes it from there."""
    found = _field(options, name)
    if found.default is not dataclasses.MISSING:
        return found.default
    if found.default_factory is dataclasses.MISSING:
        raise TypeError(f"{options.__name__}.{name} has no default")
    return found.default_factory()


def field_help(options: type, name: str) -> str:
    """The help of field ``name`` of the options dataclass ``options`` (its ``metadata``):
    documented once, where the option is defined."""
    return _field(options, name).metadata["help"]


def field_option(options: type, name: str, *flags: str, **settings: Any) -> Any:
    """The option of a command that stands for field ``name`` of ``options``: its default and
    its help, both the field's."""
    return typer.Option(field_default(options, name), *flags, help=field_help(options, name),
                        **settings)


def parameter_default(function: Any, name: str) -> Any:
    """The default of ``function``'s keyword ``name`` (a library call's own)."""
    return inspect.signature(function).parameters[name].default


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
CUDA = typer.Option(library_default("cuda"), help=library_help("cuda"))
SLIM = typer.Option(library_default("slim"), help=library_help("slim"))
TRITON_VERSION = typer.Option(library_default("triton_version"),
                              help=library_help("triton_version"))
BASE_IMAGE = typer.Option(library_default("base_image"), help=library_help("base_image"))
BASE_PYTHON = typer.Option(library_default("base_python"), help=library_help("base_python"))
ENV = typer.Option([], exists=True, dir_okay=False,
                   help=library_help("env_specs", "(repeatable)"))
REQUIREMENT = typer.Option([], "--requirement", "-r",
                           help=library_help("requirements", "(repeatable)"))
PYTORCH_INDEX = typer.Option(library_default("pytorch_index"),
                             help=library_help("pytorch_index"))
PARALLELISM = typer.Option(library_default("parallelism"), min=1,
                           help=library_help("parallelism"))
FORMAT = typer.Option(list(library_default("format_priority")), "--format",
                      help=library_help("format_priority", "(repeatable)"))
TUNING = typer.Option(library_default("tuning"), exists=True, dir_okay=False,
                      help=library_help("tuning"))
LATENCY_BUDGET_MS = typer.Option(library_default("latency_budget_ms"), min=0.001,
                                 help=library_help("latency_budget_ms"))
MAX_REQUEST_MB = typer.Option(library_default("max_request_bytes"), min=0.001,
                              help=library_help("max_request_bytes", "In MiB here."))
VERIFY = typer.Option(library_default("verify"), help=library_help("verify"))
USER = typer.Option(library_default("user"), help=library_help("user"))
DRAIN_SECONDS = typer.Option(library_default("drain_s"), min=0, max=MAX_DRAIN_S,
                             help=library_help("drain_s"))
NO_CACHE = typer.Option(library_default("no_cache"), "--no-cache", help=library_help("no_cache"))
WEIGHTS = typer.Option(library_default("weights"), help=library_help("weights"))
TRACING = typer.Option(library_default("tracing"), help=library_help("tracing"))
BRIDGE = typer.Option(library_default("bridge"), help=library_help("bridge"))
INTERPRETER_IMAGE = typer.Option(library_default("interpreter_image"),
                                 help=library_help("interpreter_image"))
COMPILE_STUB = typer.Option(library_default("compile_stub"), help=library_help("compile_stub"))
TRITON_SOURCES: Path = typer.Option(library_default("triton_sources"), exists=True,
                                    file_okay=False, help=library_help("triton_sources"))
PLATFORM = typer.Option([], "--platform", help=library_help("platforms", "(repeatable)"))
NO_VERIFY_PLATFORM = typer.Option([], "--no-verify-platform",
                                  help=library_help("no_verify_platforms", "(repeatable)"))
