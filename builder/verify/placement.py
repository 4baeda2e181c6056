"""Where a served image's models ran: on GPUs where the engine has them, or said not to have been.

A GPU image's model operators are ``KIND_GPU`` (:mod:`builder.repository.writer`). With an
NVIDIA runtime the verification container gets the GPUs and, after the checks answered right,
Triton's own accounting must show each such model ran on a GPU: its model statistics count the
inferences, and its ``nv_inference_count`` metric carries the ``gpu_uuid`` label Triton gives the
reporters of GPU instances. Without one Triton cannot load a ``KIND_GPU`` model at all, so the
container gets CPU variants of exactly those configs (bind-mounted over the image's, nothing
else changed): the image's server, environment, code and weights are verified on the CPU, and
the result says that the GPU placement was not exercised.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import model_config_pb2 as mc

from builder.errors import TritonBuilderError
from builder.repository.model_config import CONFIG_FILE, dumps_config, read_config
from builder.verify.container import Endpoint

INFERENCE_COUNT = ("nv_inference_count", "nv_inference_count_total")


class GpuPlacementError(TritonBuilderError, RuntimeError):
    """A GPU model answered, but Triton's accounting does not show it ran on a GPU."""


@dataclass(frozen=True)
class GpuPlacement:
    """What verification established about the GPU models of an image."""

    models: tuple[str, ...]
    """The repository's ``KIND_GPU`` models."""
    exercised: bool
    detail: str


def gpu_models(repository_dir: str | Path) -> list[str]:
    """The models of a repository with a ``KIND_GPU`` instance group."""
    return [path.parent.name for path in sorted(Path(repository_dir).glob(f"*/{CONFIG_FILE}"))
            if any(group.kind == mc.ModelInstanceGroup.KIND_GPU
                   for group in read_config(path.parent).instance_group)]


def cpu_config_mounts(repository_dir: str | Path, models: list[str], directory: Path,
                      image_repository: str) -> dict[str, dict[str, str]]:
    """Docker volume binds that put a ``KIND_CPU`` config over each GPU model's config.

    Only the instance groups change (``KIND_GPU`` → ``KIND_CPU``, no GPU ids); the files are
    written under ``directory`` and mounted read-only at ``image_repository/<model>/``.
    """
    volumes = {}
    for model in models:
        config = read_config(Path(repository_dir) / model)
        for group in config.instance_group:
            if group.kind == mc.ModelInstanceGroup.KIND_GPU:
                group.kind = mc.ModelInstanceGroup.KIND_CPU
                del group.gpus[:]
        target = directory / model
        target.mkdir(parents=True, exist_ok=True)
        (target / CONFIG_FILE).write_text(dumps_config(config))
        volumes[str(target / CONFIG_FILE)] = {
            "bind": f"{image_repository.rstrip('/')}/{model}/{CONFIG_FILE}", "mode": "ro"}
    return volumes


def gpu_inference_counts(metrics_text: str) -> dict[str, dict[str, float]]:
    """``model → {device: inferences}`` from Triton's metrics; ``"cpu"`` where no ``gpu_uuid``."""
    counts: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name not in INFERENCE_COUNT or "model" not in sample.labels:
                continue
            device = sample.labels.get("gpu_uuid") or "cpu"
            per_model = counts.setdefault(sample.labels["model"], {})
            per_model[device] = per_model.get(device, 0.0) + sample.value
    return counts


def statistics_counts(stats: dict) -> dict[str, int]:
    """``model → inferences`` from ``GET /v2/models/stats``."""
    counts: dict[str, int] = {}
    for entry in stats.get("model_stats", []):
        counts[entry["name"]] = counts.get(entry["name"], 0) + int(
            entry.get("inference_count", 0))
    return counts


def placement_verdict(models: list[str], statistics: dict[str, int],
                      metrics: dict[str, dict[str, float]]) -> str:
    """Say where each GPU model ran; raise :class:`GpuPlacementError` for one that did not run
    on a GPU (or did not run at all)."""
    lines, problems = [], []
    for model in models:
        if statistics.get(model, 0) <= 0:
            problems.append(f"{model} served no inference (model statistics)")
            continue
        on_gpus = {device: count for device, count in metrics.get(model, {}).items()
                   if device != "cpu" and count > 0}
        if not on_gpus:
            problems.append(f"{model} ran {statistics[model]} inferences, none on a GPU "
                            f"(metrics: {metrics.get(model) or 'none'})")
            continue
        lines.append(f"{model} ran on {', '.join(sorted(on_gpus))}")
    if problems:
        raise GpuPlacementError("GPU placement failed: " + "; ".join(problems))
    return "; ".join(lines)


def check_ran_on_gpus(endpoint: Endpoint, models: list[str], timeout: float = 10.0) -> str:
    """Read the running server's statistics and metrics; see :func:`placement_verdict`."""
    with urllib.request.urlopen(f"http://{endpoint.http_url}/v2/models/stats",
                                timeout=timeout) as response:
        statistics = statistics_counts(json.load(response))
    with urllib.request.urlopen(f"http://{endpoint.metrics_url}/metrics",
                                timeout=timeout) as response:
        metrics = gpu_inference_counts(response.read().decode())
    return placement_verdict(models, statistics, metrics)
