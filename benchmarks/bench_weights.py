"""Weights in the image or beside it (issue 65, item 4): a pipeline with a 1 GB model operator.

The pipeline: an embedding table of 250,000 x 1,024 float32 (1.02 GB, generated, seeded),
mean-pooled and projected (``encoder``), then a Python step (the code a user edits). It is built
and pushed three times each way, ``weights="image"`` (the default: one layer per model, baked
in) and ``weights="artifact"`` (the image without weights, each model's files an OCI artifact
beside it), each way to a registry of its own started for the run (so each first push is a
first push): v1; v2, a code-only change (the Python step); v3, a new version of the model
(another seed). What each push uploaded is read off the registry's storage (the blobs it holds
before and after); what a node holding v1 pulls for v3 from the manifests (image layers and,
beside the image, the artifacts' files).

Then start to ready, ``docker start`` to ``/v2/health/ready``, of v3, side by side in one run
(``--runs`` rounds, one start of each kind per round, medians): weights in the image; beside it,
from the registry into an empty cache volume; beside it, from a warm cache (the volume of the
empty-cache start before it). After every start, distinct requests, each answer checked against
the in-process pipeline.

    python benchmarks/bench_weights.py [--runs 3] [--no-write]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.report import machine, publish  # noqa: E402
from builder import ModelOp, build_docker_image, pipe  # noqa: E402
from builder.client.pipeline import Client  # noqa: E402
from builder.engine import ensure_engine  # noqa: E402
from builder.push.weights_artifact import MODEL_ANNOTATION  # noqa: E402
from builder.runtime.supervisor.weights_lock import CACHE_DIR  # noqa: E402
from builder.runtime.supervisor.weights_registry import (  # noqa: E402
    INSECURE_VARIABLE,
    REGISTRY_VARIABLE,
)
from builder.verify.container import ServingContainer  # noqa: E402
from builder.verify.equality import check_same  # noqa: E402
from builder.verify.weights_source import bridge_gateway  # noqa: E402
from tests.support.large_models import WIDTH, EmbeddingEncoder  # noqa: E402
from tests.support.testbed import LocalRegistry  # noqa: E402

SECTION = "## Weights in the image or beside it"
COMMAND = "python benchmarks/bench_weights.py"
CHART = ROOT / "benchmarks" / "weights.png"
REPOSITORY = "triton-builder-bench/weights"
ROWS, TOKENS = 250_000, 8
"""The table's rows (of ``WIDTH``: 1,024 float32): 1.02 GB."""
REQUESTS = 8
MODES = ("image", "artifact")
STARTS = ("weights in the image", "beside: empty cache", "beside: warm cache")
ACCEPT = ", ".join(("application/vnd.oci.image.index.v1+json",
                    "application/vnd.oci.image.manifest.v1+json",
                    "application/vnd.docker.distribution.manifest.v2+json"))


def _encoder(seed: int):
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        return ModelOp(EmbeddingEncoder(ROWS).eval(), torch.from_numpy(_ids(0)), name="encoder",
                       input_names=["ids"])


class Scale:
    """The pipeline's code: a Python step after the model."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, embedding: np.ndarray) -> np.ndarray:
        return (embedding * self.factor).astype(np.float32)


def _ids(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, ROWS, TOKENS, dtype=np.int64)


def _pipeline(encoder, factor: float):
    return (pipe.input("ids").map("ids", "embedding", encoder)
            .map("embedding", "scaled", Scale(factor)).output("scaled")
            .with_example(_ids(1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="rounds of starts (medians shown)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    arguments = parser.parse_args()
    client = ensure_engine()
    first, changed = _encoder(1), _encoder(2)
    versions = {"v1": _pipeline(first, 2.0), "v2": _pipeline(first, 3.0),
                "v3": _pipeline(changed, 3.0)}
    pushes: dict[tuple[str, str], dict] = {}
    starts: dict[str, list[float]] = {}
    references: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as workdir:
        registries = {mode: LocalRegistry(_directory(workdir, mode), bind="0.0.0.0")  # noqa: S104 - containers reach it
                      for mode in MODES}
        try:
            for mode, registry in registries.items():
                registry.start()
                for version, pipeline in versions.items():
                    reference = f"{registry.host}/{REPOSITORY}-{mode}:{version}"
                    references.append(reference)
                    pushes[mode, version] = _push(client, registry, pipeline, reference, mode)
                    print(f"{mode} {version}: {pushes[mode, version]['uploaded'] / 1e6:.1f} MB "
                          "uploaded", flush=True)
            v3 = versions["v3"]
            calls = [_ids(100 + k) for k in range(REQUESTS)]
            expected = [v3(call) for call in calls]
            image_v3 = f"{registries['image'].host}/{REPOSITORY}-image:v3"
            artifact_v3 = f"{registries['artifact'].host}/{REPOSITORY}-artifact:v3"
            source = {REGISTRY_VARIABLE: f"{bridge_gateway(client)}:{registries['artifact'].port}",
                      INSECURE_VARIABLE: "1"}
            for _ in range(arguments.runs):
                starts.setdefault(STARTS[0], []).append(
                    _start_and_ask(client, image_v3, {}, calls, expected))
                volume = client.volumes.create(f"triton-builder-bench-{uuid.uuid4().hex[:8]}")
                try:
                    mounted = {"volumes": {volume.name: {"bind": CACHE_DIR, "mode": "rw"}},
                               "environment": source}
                    starts.setdefault(STARTS[1], []).append(
                        _start_and_ask(client, artifact_v3, mounted, calls, expected))
                    starts.setdefault(STARTS[2], []).append(
                        _start_and_ask(client, artifact_v3, mounted, calls, expected))
                finally:
                    volume.remove(force=True)
                print({name: f"{values[-1]:.2f} s" for name, values in starts.items()},
                      flush=True)
            sizes = {mode: client.images.get(f"{registries[mode].host}/{REPOSITORY}-{mode}:v3")
                     .attrs["Size"] for mode in MODES}
            pulls = {mode: _node_pull(registries[mode], f"{REPOSITORY}-{mode}") for mode in MODES}
        finally:
            for registry in registries.values():
                registry.stop()
            for reference in references:
                try:
                    client.images.remove(reference, force=True)
                except Exception:  # noqa: BLE001 - a build may have failed before tagging
                    pass
    publish(SECTION, _section(pushes, starts, sizes, pulls, arguments.runs),
            write=not arguments.no_write)
    if not arguments.no_write:
        _chart(pushes, starts)


def _directory(workdir: str, mode: str) -> Path:
    path = Path(workdir) / mode
    path.mkdir()
    return path


def _blobs(registry: LocalRegistry) -> dict[str, int]:
    root = registry.storage / "data/docker/registry/v2/blobs/sha256"
    return {f"sha256:{path.parent.name}": path.stat().st_size for path in root.glob("*/*/data")}


def _push(client, registry: LocalRegistry, pipeline, reference: str, mode: str) -> dict:
    """Build and push; seconds and the bytes the registry received (new blobs)."""
    before = _blobs(registry)
    started = time.monotonic()
    built = build_docker_image(pipeline, reference, push=True, client=client, weights=mode,
                               verify=False, on_log=lambda line: None)
    seconds = time.monotonic() - started
    after = _blobs(registry)
    uploaded = sum(size for digest, size in after.items() if digest not in before)
    return {"seconds": seconds, "uploaded": uploaded, "built": built.built}


def _get(registry: LocalRegistry, name: str, reference: str) -> tuple[dict, str]:
    request = urllib.request.Request(f"http://{registry.host}/v2/{name}/manifests/{reference}",
                                     headers={"Accept": ACCEPT})
    with urllib.request.urlopen(request, timeout=30) as answer:
        body = answer.read()
    return json.loads(body), f"sha256:{hashlib.sha256(body).hexdigest()}"


def _content(registry: LocalRegistry, name: str, tag: str) -> dict[str, dict[str, int]]:
    """What a node takes for ``tag``: ``pulled`` (the image's config and layers) and, beside
    the image, ``fetched`` (the artifacts' files); digest → bytes."""
    top, _ = _get(registry, name, tag)
    entries = top.get("manifests", [{"digest": None}])
    found: dict[str, dict[str, int]] = {"pulled": {}, "fetched": {}}
    for entry in entries:
        manifest = top if entry["digest"] is None else _get(registry, name, entry["digest"])[0]
        artifact = MODEL_ANNOTATION in entry.get("annotations", {})
        kind = "fetched" if artifact else "pulled"
        parts = manifest["layers"] if artifact else [manifest["config"], *manifest["layers"]]
        found[kind].update({part["digest"]: part["size"] for part in parts})
    return found


def _node_pull(registry: LocalRegistry, name: str) -> dict[str, int]:
    """Bytes a new node takes for v3, and a node that holds v1 (its layers, its cache)."""
    old, new = _content(registry, name, "v1"), _content(registry, name, "v3")
    return {f"{kind} {who}": sum(size for digest, size in new[kind].items()
                                 if who == "new node" or digest not in old[kind])
            for kind in ("pulled", "fetched") for who in ("new node", "node with v1")}


def _start_and_ask(client, reference: str, options: dict, calls: list, expected: list) -> float:
    """Seconds from ``docker start`` to ready; every answer checked."""
    serving = ServingContainer(client, reference, **options)
    started = time.perf_counter()
    try:
        endpoint = serving.start(timeout=600)
        ready_s = time.perf_counter() - started
        with Client(f"grpc://{endpoint.grpc_url}/pipeline") as served:
            for call, answer in zip(calls, expected, strict=True):
                check_same(served(call), answer, where=f"{reference} {call!r:.40}")
    finally:
        serving.remove()
    return ready_s


def _section(pushes: dict, starts: dict, sizes: dict, pulls: dict, runs: int) -> str:
    mb = 1e6
    lines = [SECTION, "",
             f"Measured on {machine()}, quiet, {time.strftime('%Y-%m-%d')}, with `{COMMAND} "
             f"--runs {runs}`. The pipeline: a 1.02 GB model operator (an embedding table of "
             f"{ROWS:,} x {WIDTH:,} float32, generated, mean-pooled and projected) and a Python "
             "step; each way pushed to a registry of its own (Debian's `docker-registry`); "
             "uploaded: the new blobs in the registry's storage after the push. Builds without "
             "verification (every start below checks its answers).", "",
             "| | weights in the image | weights beside it (`--weights artifact`) |",
             "|---|---|---|"]

    def row(label: str, values: list[str]) -> None:
        lines.append(f"| {label} | {values[0]} | {values[1]} |")

    row("image size (v3, on the engine)", [f"{sizes[m] / mb:.0f} MB" for m in MODES])
    for version, label in (("v1", "first push: uploaded"),
                           ("v2", "push after a code-only change: uploaded"),
                           ("v3", "push after a new version of the model: uploaded")):
        row(label, [f"{pushes[m, version]['uploaded'] / mb:.2f} MB "
                    f"({pushes[m, version]['seconds']:.0f} s build and push)" for m in MODES])
    for who in ("new node", "node with v1"):
        row(f"v3 on a {who}: pulled / fetched at start",
            [f"{pulls[m][f'pulled {who}'] / mb:.2f} MB / "
             f"{pulls[m][f'fetched {who}'] / mb:.2f} MB" for m in MODES])
    lines += ["", f"Start to ready of v3 (`docker start` to `/v2/health/ready`, image on the "
              f"engine), {runs} rounds side by side, medians (min – max); then {REQUESTS} "
              "distinct requests, every answer equal to the in-process pipeline:", "",
              "| start | seconds |", "|---|---|"]
    for name in STARTS:
        values = starts[name]
        lines.append(f"| {name} | {statistics.median(values):.2f} "
                     f"({min(values):.2f} – {max(values):.2f}) |")
    ready = {name: statistics.median(starts[name]) for name in STARTS}
    image, beside = (pushes["image", "v3"]["uploaded"], pushes["artifact", "v3"]["uploaded"])
    pulled = {mode: pulls[mode]["pulled new node"] / mb for mode in MODES}
    lines += ["", f"Beside the image, a new node pulls {pulled['artifact']:.0f} MB of image "
              f"instead of {pulled['image']:.0f}, and a new "
              "version of the model is no image layer at all: each node fetches its "
              f"{pulls['artifact']['fetched node with v1'] / mb:.0f} MB once, into its cache. "
              "The artifact's files are stored as they are (a blob is the file: the lock's "
              "digest is the file's, and a fetch resumes by range), where an image layer is "
              f"gzipped: for these random weights the push sends {beside / image - 1:.0%} more "
              "than the layer would (trained weights: not measured here). At start, an empty "
              f"cache costs {ready[STARTS[1]] - ready[STARTS[0]]:+.1f} s over weights in the "
              "image (the fetch over the bridge and its digest), a warm cache "
              f"{ready[STARTS[2]] - ready[STARTS[0]]:+.1f} s (each file hashed again before "
              "use: a damaged cache is never served).",
              "", f"![weights in the image or beside it]({CHART.relative_to(ROOT)})", ""]
    return "\n".join(lines)


def _chart(pushes: dict, starts: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (uploads, ready) = plt.subplots(1, 2, figsize=(9, 3.6))
    labels = ["first push", "code-only", "new model"]
    x = np.arange(len(labels))
    for k, mode in enumerate(MODES):
        uploads.bar(x + (k - 0.5) * 0.38,
                    [pushes[mode, v]["uploaded"] / 1e6 for v in ("v1", "v2", "v3")], 0.38,
                    label=f"weights={mode}")
    uploads.set_xticks(x, labels)
    uploads.set_yscale("log")
    uploads.set_ylabel("uploaded by the push (MB, log)")
    uploads.legend(fontsize=8)
    ready.bar(np.arange(len(STARTS)), [statistics.median(starts[s]) for s in STARTS], 0.6)
    ready.set_xticks(np.arange(len(STARTS)), [s.replace(": ", ":\n") for s in STARTS],
                     fontsize=8)
    ready.set_ylabel("start to ready (s, median)")
    fig.tight_layout()
    fig.savefig(CHART, dpi=110)


if __name__ == "__main__":
    main()
