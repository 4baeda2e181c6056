"""``build``, ``image`` and ``push``: a pipeline's repository, its image, and pushing one."""

from __future__ import annotations

from pathlib import Path

import typer

from builder.cli.app import app, console, log_line, run_step
from builder.cli.command_options import (
    BASE_IMAGE,
    BASE_PYTHON,
    BRIDGE,
    COMPILE_STUB,
    CUDA,
    DRAIN_SECONDS,
    ENV,
    FORMAT,
    INTERPRETER_IMAGE,
    LATENCY_BUDGET_MS,
    MAX_REQUEST_MB,
    NO_CACHE,
    NO_VERIFY_PLATFORM,
    PARALLELISM,
    PIPELINE,
    PLATFORM,
    PYTORCH_INDEX,
    REQUIREMENT,
    SLIM,
    TRACING,
    TRITON_SOURCES,
    TRITON_VERSION,
    TUNING,
    USER,
    VERIFY,
    WEIGHTS,
    build_keywords,
    parameter_default,
)
from builder.cli.pipeline_loading import load_pipeline
from builder.push.docker_push import push_image
from builder.repository.writer import build_pipeline_model

MODEL_ROOT = Path(parameter_default(build_pipeline_model, "model_root"))


@app.command()
def build(
    pipeline: str = PIPELINE,
    model_root: Path = typer.Option(MODEL_ROOT, help="Where to write the repository."),
    format_priority: list[str] = FORMAT,
    parallelism: int = PARALLELISM,
    cuda: str = CUDA,
    latency_budget_ms: float = LATENCY_BUDGET_MS,
    max_request_mb: float = MAX_REQUEST_MB,
) -> None:
    """Write the Triton model repository of a pipeline.

    Example: triton-builder build pipelines/text_embedding.py:pipeline --model-root models
    """
    from builder.base.releases import resolve

    pipe = run_step("loading the pipeline", lambda: load_pipeline(pipeline))
    target = run_step("choosing the release", lambda: resolve(cuda)) if cuda else None
    keywords = build_keywords({"latency_budget_ms": latency_budget_ms,
                               "max_request_mb": max_request_mb})
    result = run_step("building the repository", lambda: build_pipeline_model(
        pipe, model_root, target=target, format_priority=format_priority,
        parallelism=parallelism, **keywords))
    console.print(result.report())
    print(result.model_root)


@app.command()
def image(
    pipeline: str = PIPELINE,
    tag: list[str] = typer.Option(..., "--tag", "-t", help="Image name (repeatable)."),
    cuda: str = CUDA,
    slim: bool = SLIM,
    triton_version: str = TRITON_VERSION,
    base_image: str = BASE_IMAGE,
    env: list[Path] = ENV,
    requirement: list[str] = REQUIREMENT,
    parallelism: int = PARALLELISM,
    verify: bool = VERIFY,
    push: bool = typer.Option(False, help="Push every tag after the build."),
    user: str = USER,
    drain_seconds: float = DRAIN_SECONDS,
    no_cache: bool = NO_CACHE,
    weights: str = WEIGHTS,
    tracing: bool = TRACING,
    latency_budget_ms: float = LATENCY_BUDGET_MS,
    max_request_mb: float = MAX_REQUEST_MB,
    pytorch_index: str = PYTORCH_INDEX,
    bridge: bool = BRIDGE,
    base_python: str = BASE_PYTHON,
    interpreter_image: str = INTERPRETER_IMAGE,
    compile_stub: bool = COMPILE_STUB,
    triton_sources: Path = TRITON_SOURCES,
    platform: list[str] = PLATFORM,
    no_verify_platform: list[str] = NO_VERIFY_PLATFORM,
    tuning: Path = TUNING,
) -> None:
    """Build (and verify, and push) the serving image of a pipeline.

    Example: triton-builder image pipelines/text_embedding.py:pipeline -t embed:1 --cuda 11.8;
    --platform linux/amd64 --platform linux/arm64 builds both under one tag.
    """
    values = dict(locals())  # the options, by their parameters' names (build_keywords maps them)
    from dataclasses import replace

    from builder.engine import ensure_engine
    from builder.engine.platforms import parse_platforms
    from builder.job import build_docker_image, build_options

    run_step("reading the options", lambda: parse_platforms([*platform, *no_verify_platform]))
    options = run_step("reading the options", lambda: build_options(**build_keywords(values)))
    pipe = run_step("loading the pipeline", lambda: load_pipeline(pipeline))
    first, *others = tag
    built = run_step("building the image", lambda: build_docker_image(
        pipe, first, options, tags=others, push=push, client=ensure_engine()))
    for name, each in (built.platform_images or {"": replace(built, pushed={})}).items():
        console.print(("built " if each.built else "up to date ") + ", ".join(each.tags)
                      + (f" ({name})" if name else ""))
        for pushed in each.pushed.values():
            console.print(f"pushed {pushed.pinned}")
    for pushed in built.pushed.values():
        console.print(f"pushed {pushed.pinned}" + (
            f" (image index: {', '.join(built.platform_images)})" if built.platform_images
            else ""))
    print(built.tags[0])


@app.command()
def push(
    reference: str = typer.Argument(..., help="Image to push (registry/name:tag)."),
    retries: int = typer.Option(parameter_default(push_image, "retries"),
                                help="Retries of transient failures."),
) -> None:
    """Push an image and print the digest the registry confirmed.

    Example: triton-builder push localhost:5000/embed:1
    """
    from builder.engine import ensure_engine

    result = run_step("pushing", lambda: push_image(ensure_engine(), reference,
                                                    retries=retries, on_log=log_line))
    print(result.pinned)
