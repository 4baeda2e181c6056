"""A pipeline's serving image in one call: repository → environment → image, checked against
the pipeline itself.

:func:`build_docker_image` is the whole job users came for. It writes the model repository
(:mod:`builder.repository.writer`), packs the one Python environment the pipeline model needs
against the chosen base image (:mod:`builder.environment.tarball`), builds the image
(:mod:`builder.image.build`) and,
before any tag points at it, runs it and compares its answers — over gRPC and HTTP — with the
in-process pipeline on the pipeline's examples.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import docker

from builder.client import Client
from builder.environment import (
    PackageIndex,
    attach_environment,
    image_target,
    load_spec,
    pack_environment,
)
from builder.errors import BuildError
from builder.image.build import ImageBuild, build_image_from_repository, ensure_base_image
from builder.image.releases import resolve
from builder.pipeline.dsl import Pipeline
from builder.progress import timed_step
from builder.repository.writer import build_pipeline_model
from builder.verify.check import Check
from builder.verify.container import Endpoint
from builder.verify.equality import check_same

VERSIONS_FILE = "pipe.versions.json"


def build_docker_image(
    pipe: Pipeline,
    image_name: str,
    *,
    cuda: str | float | None = None,
    tags: Iterable[str] = (),
    triton_version: str | None = None,
    base_image: str | None = None,
    format_priority: Sequence[str] = ("onnx",),
    parallelism: int = 1,
    env_specs: Iterable[str | os.PathLike] = (),
    requirements: Iterable[str] = (),
    packer: str | None = None,
    index: PackageIndex | None = None,
    verify: bool = True,
    verify_calls: Sequence[tuple[Any, ...]] | None = None,
    tolerance: float = 1e-4,
    push: bool = False,
    user: str | None = None,
    client: docker.DockerClient | None = None,
    on_log: Callable[[str], None] | None = None,
    **pipeline_options: Any,
) -> ImageBuild:
    """Build, verify and tag (and ``push``) the Triton serving image of ``pipe``.

    ``cuda`` picks the ``nvcr.io/nvidia/tritonserver`` release
    (:func:`~builder.image.releases.resolve`; ``None`` or ``"cpu"`` is the CPU base);
    ``triton_version`` / ``base_image`` override it.
    The environment holds what the pickled pipeline imports (pinned to the versions used here),
    ``env_specs`` (files in ``envs/``), ``requirements`` and the operators' own requirements.
    Verification sends ``verify_calls`` (default: the pipeline's examples) and compares with
    ``pipe(*call)`` within ``tolerance``. Other keyword arguments go to
    :func:`builder.repository.writer.build_pipeline_model`.
    """
    release = resolve(cuda, triton_version, base_image)
    calls = [tuple(call) for call in (verify_calls if verify_calls is not None else pipe.examples)]
    if verify and not calls:
        raise BuildError("verification needs at least one call: give the pipeline an example "
                         "(pipe.with_example(...)) or pass verify_calls=[...], or verify=False")
    expected = [pipe(*call) for call in calls]
    if client is None:
        from builder.engine import docker_client

        client = docker_client()
    with timed_step(f"base image {release.image}", on_log):
        base = ensure_base_image(client, release, on_log=on_log)
        target = image_target(client, base.id)
    with tempfile.TemporaryDirectory(prefix="triton-builder-") as workdir:
        with timed_step("model repository (export, configs, pipe.pickle)", on_log):
            built = build_pipeline_model(pipe, Path(workdir) / "models", format_priority,
                                         parallelism, **pipeline_options)
        pipeline_dir = built.model_root / built.pipeline_model
        with timed_step("python environment", on_log):
            spec = load_spec(env_specs, [*_pickle_requirements(pipeline_dir), *requirements],
                             [node.op for node in pipe.nodes])
            tarball = pack_environment(spec, target, packer=packer, index=index, on_log=on_log)
            attach_environment(built.model_root, tarball, models=[built.pipeline_model])
        checks = [_pipeline_check(built.pipeline_model, calls, expected, tolerance)]
        with timed_step(f"image {image_name}" + (" (verified)" if verify else ""), on_log):
            return build_image_from_repository(
                built.model_root, image_name=image_name, tags=tags, cuda=cuda,
                triton_version=triton_version, base_image=base_image, user=user,
                verify=verify, checks=checks if verify else (), push=push, client=client,
                on_log=on_log,
            )


def _pickle_requirements(pipeline_dir: Path) -> list[str]:
    """Pins for what ``pipe.pickle`` imports, from the versions recorded beside it."""
    recorded = json.loads((pipeline_dir / "1" / VERSIONS_FILE).read_text())
    return [f"{name}=={version}" for name, version in sorted(recorded["libraries"].items())]


def _pipeline_check(model: str, calls: list[tuple[Any, ...]], expected: list[Any],
                    tolerance: float) -> Check:
    """Every call over gRPC and HTTP must answer what the in-process pipeline answered."""

    def check(endpoint: Endpoint) -> None:
        for scheme, address in (("grpc", endpoint.grpc_url), ("http", endpoint.http_url)):
            with Client(f"{scheme}://{address}/{model}") as client:
                for call, reference in zip(calls, expected):
                    check_same(client(*call), reference, tolerance,
                               where=f"{model}{_short(call)} over {scheme}")

    return check


def _short(call: tuple[Any, ...]) -> str:
    text = repr(call)
    return text if len(text) <= 60 else text[:57] + "...)"
