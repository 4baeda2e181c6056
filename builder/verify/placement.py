"""Where a served image's models ran: on GPUs where the engine has them, or said not to have been.

A GPU image's model operators are ``KIND_GPU`` (:mod:`builder.repository.writer`). With an
NVIDIA runtime the verification container gets the GPUs and, after the checks answered right,
Triton's own accounting must show each such model ran on a GPU: its model statistics count the
inferences, and either

* its ``nv_inference_count`` metric carries the ``gpu_uuid`` label Triton gives the reporters of
  GPU instances (:data:`METRICS_EVIDENCE`), or, where that label is absent because Triton's GPU
  metrics did not start (MIG slices, vGPU, WSL2: the GPUs work, the metrics do not),
* the model's config as Triton loaded it (``GET /v2/models/<m>/config``) has its instances on
  GPUs: ``KIND_GPU`` groups with the GPU ids Triton filled in from the GPUs it can use
  (:data:`INSTANCE_EVIDENCE`); the GPU memory the backend reports in the model statistics
  (``memory_usage``, where it reports any) is named beside it.

The result names the evidence per model. Without an NVIDIA runtime Triton cannot load a
``KIND_GPU`` model at all, so the container gets CPU variants of exactly those configs
(bind-mounted over the image's, nothing else changed): the image's server, environment, code and
weights are verified on the CPU, and the result says that the GPU placement was not exercised.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import model_config_pb2 as mc

from builder.errors import TritonBuilderError
from builder.repository.model_config import CONFIG_FILE, dumps_config, read_config
from builder.verify.container import ContainerEndpoint

INFERENCE_COUNT = ("nv_inference_count", "nv_inference_count_total")
METRICS_EVIDENCE = "nv_inference_count gpu_uuid"
INSTANCE_EVIDENCE = "loaded instance groups"


class GpuPlacementError(TritonBuilderError, RuntimeError):
    """A GPU model answered, but Triton's accounting does not show it ran on a GPU."""


@dataclass(frozen=True)
class GpuPlacement:
    """What verification established about the GPU models of an image."""

    models: tuple[str, ...]
    """The repository's ``KIND_GPU`` models."""
    exercised: bool
    detail: str
    evidence: dict[str, str] = field(default_factory=dict)
    """``model → evidence`` that it ran on a GPU: :data:`METRICS_EVIDENCE` or
    :data:`INSTANCE_EVIDENCE` (empty where the placement was not exercised)."""


@dataclass(frozen=True)
class PlacementVerdict:
    """Where each GPU model ran, and on which evidence."""

    detail: str
    evidence: dict[str, str]


def gpu_models(repository_dir: str | os.PathLike[str]) -> list[str]:
    """The models of a repository with a ``KIND_GPU`` instance group."""
    return [path.parent.name for path in sorted(Path(repository_dir).glob(f"*/{CONFIG_FILE}"))
            if any(group.kind == mc.ModelInstanceGroup.KIND_GPU
                   for group in read_config(path.parent).instance_group)]


def cpu_config_mounts(repository_dir: str | os.PathLike[str], models: list[str], directory: Path,
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
        (target / CONFIG_FILE).write_text(dumps_config(config, model))
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


def loaded_instance_groups(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """``(kind, gpu ids)`` of each instance group of a loaded model's config (the JSON of
    ``GET /v2/models/<m>/config``, where Triton has filled in the GPUs of ``KIND_GPU`` groups)."""
    return [(group.get("kind", ""), tuple(int(gpu) for gpu in group.get("gpus", [])))
            for group in config.get("instance_group", [])]


def gpu_memory_usage(stats: dict) -> dict[str, dict[str, int]]:
    """``model → {gpu id: bytes}`` of GPU memory its backend reported in ``GET /v2/models/stats``
    (``memory_usage``, Triton 2.43 and later; many backends report none)."""
    usage: dict[str, dict[str, int]] = {}
    for entry in stats.get("model_stats", []):
        for item in entry.get("memory_usage", []):
            if item.get("type") == "GPU" and int(item.get("byte_size", 0)) > 0:
                per_gpu = usage.setdefault(entry["name"], {})
                gpu = str(item.get("id", 0))
                per_gpu[gpu] = per_gpu.get(gpu, 0) + int(item["byte_size"])
    return usage


def placement_verdict(models: list[str], statistics: dict[str, int],
                      metrics: dict[str, dict[str, float]],
                      instance_groups: dict[str, list[tuple[str, tuple[int, ...]]]] | None = None,
                      gpu_memory: dict[str, dict[str, int]] | None = None) -> PlacementVerdict:
    """Say where each GPU model ran and on which evidence (see the module); raise
    :class:`GpuPlacementError` for one that did not run on a GPU (or did not run at all)."""
    instance_groups, gpu_memory = instance_groups or {}, gpu_memory or {}
    lines, problems, evidence = [], [], {}
    for model in models:
        if statistics.get(model, 0) <= 0:
            problems.append(f"{model} served no inference (model statistics)")
            continue
        on_gpus = {device: count for device, count in metrics.get(model, {}).items()
                   if device != "cpu" and count > 0}
        if on_gpus:
            lines.append(f"{model} ran on {', '.join(sorted(on_gpus))}")
            evidence[model] = METRICS_EVIDENCE
            continue
        groups = instance_groups.get(model, [])
        gpus = sorted({gpu for kind, ids in groups if kind == "KIND_GPU" for gpu in ids})
        if not gpus:
            kinds = ", ".join(kind for kind, _ in groups) or "not read"
            problems.append(f"{model} ran {statistics[model]} inferences, none on a GPU "
                            f"(metrics: {metrics.get(model) or 'none'}; loaded instance "
                            f"groups: {kinds})")
            continue
        memory = "".join(f"; {size / 2**20:.1f} MiB of GPU {gpu} in use"
                         for gpu, size in sorted(gpu_memory.get(model, {}).items()))
        lines.append(f"{model} ran {statistics[model]} inferences on instances Triton placed on "
                     f"GPU {', '.join(map(str, gpus))} (KIND_GPU in its loaded config{memory}; "
                     f"no gpu_uuid on its nv_inference_count: Triton's GPU metrics are off, as "
                     f"on MIG slices, vGPU and WSL2)")
        evidence[model] = INSTANCE_EVIDENCE
    if problems:
        raise GpuPlacementError("GPU placement failed: " + "; ".join(problems))
    return PlacementVerdict("; ".join(lines), evidence)


Evidence = tuple[dict[str, int], dict[str, dict[str, float]],
                 dict[str, list[tuple[str, tuple[int, ...]]]], dict[str, dict[str, int]]]


def read_placement_evidence(endpoint: ContainerEndpoint, models: list[str],
                            timeout: float = 10.0) -> Evidence:
    """``(statistics, metrics, instance groups, GPU memory)`` as the running server reports them
    (the arguments of :func:`placement_verdict`). Read as soon as the server is ready (the
    baseline of :func:`counted_since`), the metrics endpoint may not listen yet: Triton starts
    it after the HTTP one, so a refused connection is tried again until ``timeout``."""
    deadline = time.monotonic() + timeout

    def get(url: str):
        while True:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    return response.read()
            except urllib.error.URLError as error:
                refused = isinstance(error.reason, ConnectionRefusedError)
                if not refused or time.monotonic() >= deadline:
                    raise
            time.sleep(0.05)

    stats = json.loads(get(f"http://{endpoint.http_url}/v2/models/stats"))
    metrics = gpu_inference_counts(get(f"http://{endpoint.metrics_url}/metrics").decode())
    groups = {model: loaded_instance_groups(json.loads(
        get(f"http://{endpoint.http_url}/v2/models/{model}/config"))) for model in models}
    return statistics_counts(stats), metrics, groups, gpu_memory_usage(stats)


def counted_since(evidence: Evidence, baseline: Evidence | None) -> Evidence:
    """``evidence`` with the inferences counted since ``baseline`` (read once the server was
    ready). Why: Triton counts each model's warm-up (``model_warmup``, run while it loads) in
    its statistics and metrics, so a model the verification never reached would still show
    inferences, on the GPU it warmed on."""
    if baseline is None:
        return evidence
    statistics, metrics, groups, memory = evidence
    before_statistics, before_metrics = baseline[0], baseline[1]
    return ({model: count - before_statistics.get(model, 0)
             for model, count in statistics.items()},
            {model: {device: count - before_metrics.get(model, {}).get(device, 0.0)
                     for device, count in per_device.items()}
             for model, per_device in metrics.items()},
            groups, memory)


def check_ran_on_gpus(endpoint: ContainerEndpoint, models: list[str], timeout: float = 10.0,
                      since: Evidence | None = None) -> PlacementVerdict:
    """Read the running server's statistics, metrics and loaded configs, counting the
    inferences since ``since`` (:func:`read_placement_evidence` once it was ready: its models'
    warm-ups are not the verification's); see :func:`placement_verdict`."""
    return placement_verdict(models, *counted_since(
        read_placement_evidence(endpoint, models, timeout), since))
